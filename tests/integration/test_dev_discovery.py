"""`--dev` finds the running dev stack from the working directory and its parents, as git finds
its repository, on every command; when none is found, the error names where it looked and
what to do. The stack is the session's, recorded in a folder's `.kspout-dev/stack.json` as
`kspout dev up` would leave it (never stopped from here)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

from kspout.devstack import DevStack
from kspout.devstack.state import DIR_NAME, StackState, write_state
from tests.integration.helpers import PARTITIONS, kspout_command


def kspout(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`kspout <args>` in `cwd`, with no KSPOUT_* variable set but those in `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    return subprocess.run(
        [str(kspout_command()), *args],
        cwd=cwd,
        env=clean | {"COLUMNS": "200"} | env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def addressless_topic(folder: Path, topic: str) -> Path:
    """A topic file naming no servers: only `--dev` can point it at the stack."""
    path = folder / "topic.toml"
    path.write_text(f'topic = "{topic}"\nspout_id = "{topic}-spout"\nzk_root = "/dev-test"\n')
    return path


def test_dev_from_a_subdirectory_finds_the_stack_in_a_parent(
    tmp_path: Path, stack: DevStack, topic_name: str
) -> None:
    write_state(tmp_path / DIR_NAME, stack.state())
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    toml = addressless_topic(deep, topic_name)

    status = kspout(deep, "status", "--config", str(toml), "--dev", "--json")
    assert status.returncode == 0, status.stderr
    assert [row["partition"] for row in json.loads(status.stdout)["partitions"]] == list(PARTITIONS)

    offsets = kspout(deep, "offsets", "show", "--config", str(toml), "--dev", "--json")
    assert offsets.returncode == 0, offsets.stderr

    shown = kspout(deep, "dev", "status", "--json")  # `dev status|down` look the same way
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["dir"] == str(tmp_path / DIR_NAME)
    assert json.loads(shown.stdout)["env"]["KSPOUT_BROKERS"] == stack.info.brokers

    again = kspout(deep, "dev", "up", "--json")  # reports the parent's stack, starts none
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["dir"] == str(tmp_path / DIR_NAME)
    assert not (deep / DIR_NAME).exists()


def test_the_nearest_stack_wins_and_dev_replaces_the_environment(
    tmp_path: Path, stack: DevStack, topic_name: str
) -> None:
    (tmp_path / "inner").mkdir()
    write_state(tmp_path / DIR_NAME, _dead(stack.state()))  # farther up: never read
    write_state(tmp_path / "inner" / DIR_NAME, stack.state())
    toml = addressless_topic(tmp_path / "inner", topic_name)
    lag = kspout(
        tmp_path / "inner",
        "lag",
        "--config",
        str(toml),
        "--dev",
        "--json",
        KSPOUT_BROKERS="127.0.0.1:1",  # what --dev replaces
    )
    assert lag.returncode == 0, lag.stderr
    assert json.loads(lag.stdout)["lag"] == 0


def test_no_stack_found_names_where_it_looked(tmp_path: Path) -> None:
    deep = tmp_path / "x" / "y"
    deep.mkdir(parents=True)
    toml = addressless_topic(deep, "orders")
    for args, code in [
        (["offsets", "show"], 1),
        (["run", "--handler", "m:f"], 1),
        (["produce", "--count", "1"], 1),
        (["lag"], 3),  # lag's and status's "could not tell"
    ]:
        result = kspout(deep, *args, "--config", str(toml), "--dev")
        message = " ".join(result.stderr.split())
        assert result.returncode == code, result.stderr
        assert f"looked for .kspout-dev/stack.json in {deep} and its parents" in message
        assert "`cd` into the directory where it was started" in message
        assert "start one with `kspout dev up` in your project directory" in message
        assert "Traceback" not in result.stderr

    elsewhere = tmp_path / "elsewhere"
    result = kspout(deep, "lag", "--config", str(toml), "--dev", KSPOUT_DEV_DIR=str(elsewhere))
    assert result.returncode == 3
    assert f"no dev stack in {elsewhere} ($KSPOUT_DEV_DIR)" in " ".join(result.stderr.split())


def test_a_stack_that_is_down_is_named_with_where_to_start_it(
    tmp_path: Path, stack: DevStack
) -> None:
    write_state(tmp_path / DIR_NAME, _dead(stack.state()))
    (tmp_path / "sub").mkdir()
    toml = addressless_topic(tmp_path / "sub", "orders")
    result = kspout(tmp_path / "sub", "status", "--config", str(toml), "--dev")
    message = " ".join(result.stderr.split())
    assert result.returncode == 3
    assert f"the dev stack in {tmp_path / DIR_NAME} is not running" in message
    assert "kafka, zookeeper, redis down" in message
    assert f"`cd {tmp_path} && kspout dev up`" in message


def _dead(state: StackState) -> StackState:
    """`state` with every server's process gone (a pid above Linux's largest)."""
    return dataclasses.replace(
        state,
        components={
            name: dataclasses.replace(c, pid=2**22 + 1, started=None)
            for name, c in state.components.items()
        },
    )

"""`kspout produce` against the session's Kafka broker: numbered test messages, a file's lines,
stdin, the summary (table and --json), and clear failures: a missing topic, a bad line, a
message Kafka refuses. The commands run as a user runs them, with `--dev` from a subdirectory
of the folder whose `.kspout-dev/stack.json` names the session's stack."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kspout.devstack import DevStack
from kspout.devstack.state import DIR_NAME, write_state
from tests.integration.helpers import PARTITIONS, TopicFactory, kspout_command, read_topic


@pytest.fixture
def project(tmp_path: Path, stack: DevStack) -> Path:
    """A project folder whose `.kspout-dev` holds the session stack's state, as `kspout dev up`
    would leave it there."""
    write_state(tmp_path / DIR_NAME, stack.state())
    return tmp_path


@pytest.fixture
def workdir(project: Path) -> Path:
    """A folder two levels below the project, where the commands run."""
    folder = project / "jobs" / "orders"
    folder.mkdir(parents=True)
    return folder


def topic_toml(folder: Path, topic: str) -> Path:
    """A topic file without addresses: only `--dev` can point it at the stack."""
    path = folder / "topic.toml"
    path.write_text(f'topic = "{topic}"\nspout_id = "{topic}-spout"\nzk_root = "/produce-test"\n')
    return path


def kspout(cwd: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    """`kspout <args>` in `cwd`, with no KSPOUT_* variable set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    return subprocess.run(
        [str(kspout_command()), *args],
        cwd=cwd,
        env=env | {"COLUMNS": "200"},
        input=None if stdin is None else stdin.decode(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def written(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_count_writes_numbered_messages_that_lag_then_counts(
    workdir: Path, stack: DevStack, topic_name: str
) -> None:
    toml = topic_toml(workdir, topic_name)
    report = written(
        kspout(workdir, "produce", "--config", str(toml), "--dev", "--count", "100", "--json")
    )

    assert report["topic"] == topic_name and report["messages"] == 100
    rows = report["partitions"]
    assert [row["partition"] for row in rows] == list(PARTITIONS)
    assert sum(row["messages"] for row in rows) == 100
    assert all(row["messages"] > 0 for row in rows), "keys spread over every partition"
    for row in rows:  # a fresh topic: each partition's offsets run from 0 without a gap
        assert (row["first_offset"], row["last_offset"]) == (0, row["messages"] - 1)

    messages = read_topic(stack.info.brokers, topic_name, 100)
    values = {m.key(): json.loads(m.value()) for m in messages}
    assert values[b"msg-000001"] == {"id": "msg-000001", "n": 1}
    assert values[b"msg-000100"] == {"id": "msg-000100", "n": 100}
    assert len(values) == 100

    lag = written(kspout(workdir, "lag", "--config", str(toml), "--dev", "--json"))
    assert lag["lag"] == 100


def test_table_names_the_topic_and_the_total(workdir: Path, topic_name: str) -> None:
    toml = topic_toml(workdir, topic_name)
    result = kspout(workdir, "produce", "--config", str(toml), "--dev", "--count", "7")
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())  # the title wraps at the table's width
    assert f"{topic_name}: 7 messages written" in words
    assert "first offset" in result.stdout and "last offset" in result.stdout
    rows = [line.split("│")[1:-1] for line in result.stdout.splitlines() if "│" in line]
    assert [cell.strip() for cell in rows[-1]] == ["total", "7", "", ""]


def test_file_lines_with_keys_and_stdin_lines_without(
    workdir: Path, stack: DevStack, topic_name: str
) -> None:
    toml = topic_toml(workdir, topic_name)
    lines = workdir / "orders.txt"
    lines.write_bytes(b'order-1\t{"total": 5}\norder-2\tplain\ttext\r\n\norder-3\t\n')
    args = ["produce", "--config", str(toml), "--dev", "--json"]
    from_file = written(kspout(workdir, *args, "--file", "orders.txt", "--keys"))
    assert from_file["messages"] == 3  # the empty line is skipped
    from_stdin = written(kspout(workdir, *args, "--file", "-", stdin=b"first\nsecond\n"))
    assert from_stdin["messages"] == 2

    found = {(m.key(), m.value()) for m in read_topic(stack.info.brokers, topic_name, 5)}
    assert found == {
        (b"order-1", b'{"total": 5}'),
        (b"order-2", b"plain\ttext"),  # split at the first tab only; the \r\n ending dropped
        (b"order-3", b""),
        (None, b"first"),
        (None, b"second"),
    }


def test_a_line_without_a_tab_under_keys_writes_nothing(
    workdir: Path, stack: DevStack, topic_name: str
) -> None:
    toml = topic_toml(workdir, topic_name)
    lines = b"a\tone\nno tab here\n"
    result = kspout(
        workdir, "produce", "--config", str(toml), "--dev", "--file", "-", "--keys", stdin=lines
    )
    assert result.returncode == 2
    assert "line 2 has no tab: with --keys every line is KEY<TAB>VALUE" in result.stderr
    assert read_topic(stack.info.brokers, topic_name, 1) == []


def test_file_or_count_is_required(workdir: Path, topic_name: str) -> None:
    toml = topic_toml(workdir, topic_name)
    result = kspout(workdir, "produce", "--config", str(toml), "--dev")
    assert result.returncode == 2
    assert "give --file FILE (- for stdin" in result.stderr and "or --count N" in result.stderr


def test_missing_topic_is_refused_unless_created(
    workdir: Path, stack: DevStack, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("new", create=False)
    toml = topic_toml(workdir, topic)
    refused = kspout(workdir, "produce", "--config", str(toml), "--dev", "--count", "3")
    assert refused.returncode == 3  # as every command refuses a missing topic
    assert f"topic {topic!r} does not exist on {stack.info.brokers}" in refused.stderr
    assert "--create-topic PARTITIONS creates it" in refused.stderr

    args = ["produce", "--config", str(toml), "--dev", "--count", "30", "--json"]
    report = written(kspout(workdir, *args, "--create-topic", "3"))
    assert [row["partition"] for row in report["partitions"]] == [0, 1, 2]
    assert report["messages"] == 30


def test_a_message_kafka_refuses_fails_the_command(
    workdir: Path, topic_factory: TopicFactory
) -> None:
    topic = topic_factory("small", config={"max.message.bytes": "200"})
    toml = topic_toml(workdir, topic)
    args = ["produce", "--config", str(toml), "--dev", "--file", "-"]
    assert kspout(workdir, *args, stdin=b"short\n").returncode == 0
    result = kspout(workdir, *args, stdin=b"x" * 1000 + b"\n")
    assert result.returncode == 1
    assert f"{topic}: 1 message(s) not written (Broker: Message size too large)" in result.stderr
    assert "none was written" in result.stderr and "max.message.bytes" in result.stderr
    assert "Traceback" not in result.stderr

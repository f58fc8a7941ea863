"""Expected failures, as a user meets them through the `kspout` command: an unreachable Kafka,
ZooKeeper or Redis, a misspelled topic, a handler module that does not import. Each is one line
on stderr naming what failed, where its address was set and what to do; none is a traceback or
librdkafka's own `%3|...|FAIL|...` noise. The commands run as subprocesses, so stderr is what a
terminal would show (librdkafka writes to the process's own stderr, past click and Python)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.errors import KspoutError
from tests.integration.helpers import kspout_command, produce, topic_file

# An unreachable Kafka must be told within about 10 s (`lag` runs from cron); the bound leaves
# room for the interpreter's start on a loaded host.
ANSWER_WITHIN = 15.0
NOT_THERE = 3  # the exit code of `status` and `lag` for "could not tell", shared by every command

# Every operator command, as arguments after `kspout` (each also gets `--config`).
COMMANDS = {
    "status": ["status"],
    "lag": ["lag"],
    "offsets show": ["offsets", "show"],
    "offsets set": ["offsets", "set", "--all", "--to", "earliest"],
    "offsets reset": ["offsets", "reset", "--all"],
    "pause": ["pause", "--all", "--no-wait"],
    "resume": ["resume", "--all"],
    "rebalance": ["rebalance"],
    "dlq show": ["dlq", "show"],
    "run": ["run", "--handler", "json:dumps", "--until-caught-up"],
}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def kspout(
    config_file: Path,
    args: list[str],
    env: dict[str, str] | None = None,
    *,
    cwd: Path | None = None,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`kspout <args> --config <file>` as a subprocess (without the caller's KSPOUT_* settings,
    plus `env`): what it printed, and how long it took."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    argv = [str(kspout_command()), *args, "--config", str(config_file)]
    began = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env=clean | (env or {}), cwd=cwd
    )
    return done, time.monotonic() - began


@pytest.fixture
def config(make_config: Callable[..., TopicConfig]) -> TopicConfig:
    return make_config()


@pytest.fixture
def config_file(tmp_path: Path, stack: DevStack, config: TopicConfig) -> Path:
    return topic_file(tmp_path / "topic.toml", stack, config)


# -- Kafka unreachable -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["lag", "status", "offsets show", "dlq show", "pause", "run"])
def test_an_unreachable_kafka_is_one_line_naming_the_address_key_and_variable_within_seconds(
    config_file: Path, command: str
) -> None:
    address = f"127.0.0.1:{closed_port()}"
    done, took = kspout(config_file, COMMANDS[command], {"KSPOUT_BROKERS": address})
    assert done.returncode == NOT_THERE, done.stderr
    assert took < ANSWER_WITHIN, f"{command} took {took:.1f}s"
    [line] = done.stderr.strip().splitlines()
    assert f"cannot reach Kafka at {address}" in line
    assert "Connection refused" in line, "librdkafka's reason is kept"
    assert "`brokers`" in line and "KSPOUT_BROKERS" in line and str(config_file) in line
    assert "check that the brokers run" in line


def test_the_address_from_the_file_names_the_file(config_file: Path, tmp_path: Path) -> None:
    address = f"127.0.0.1:{closed_port()}"
    text = config_file.read_text()
    wrong = tmp_path / "wrong-brokers.toml"
    wrong.write_text("\n".join(line for line in text.splitlines() if "brokers" not in line))
    wrong.write_text(wrong.read_text() + f'\nbrokers = "{address}"\n')
    done, _ = kspout(wrong, COMMANDS["lag"])
    assert done.returncode == NOT_THERE, done.stderr
    assert f"`brokers` in {wrong} (or the environment variable KSPOUT_BROKERS)" in done.stderr


def test_librdkafkas_log_goes_through_logging_and_shows_with_vv_only(config_file: Path) -> None:
    env = {"KSPOUT_BROKERS": f"127.0.0.1:{closed_port()}"}
    quiet, _ = kspout(config_file, COMMANDS["dlq show"], env)
    loud, _ = kspout(config_file, ["-vv", *COMMANDS["dlq show"]], env)
    for done in (quiet, loud):
        assert "%3|" not in done.stderr and "Traceback" not in done.stderr
    assert "Connect to" not in quiet.stderr.split("Error:")[0], "nothing before the error"
    assert "FAIL" in loud.stderr and "Connect to ipv4#127.0.0.1" in loud.stderr


# -- a topic that does not exist ----------------------------------------------------------------


def invoke(config_file: Path, args: list[str]) -> Result:
    return CliRunner().invoke(main, [*args, "--config", str(config_file)], env={"COLUMNS": "200"})


def test_every_command_refuses_a_missing_topic_as_status_does(
    tmp_path: Path, stack: DevStack, make_config: Callable[..., TopicConfig]
) -> None:
    """`pause --all`, `resume --all`, `offsets set --all`, `offsets show`, ... once found
    nothing to do and exited 0 on a misspelled topic."""
    misspelled = make_config(topic="no-such-topic-ordres")
    config_file = topic_file(tmp_path / "misspelled.toml", stack, misspelled)
    status = invoke(config_file, COMMANDS["status"])
    assert status.exit_code == NOT_THERE, status.output
    said = status.stderr.strip().removeprefix("Error: could not tell: ")
    assert said.startswith("topic 'no-such-topic-ordres' does not exist on")
    assert "or create the topic first" in said
    for name, args in COMMANDS.items():
        result = invoke(config_file, args)
        assert result.exit_code == NOT_THERE, (name, result.output)
        assert said in result.stderr, (name, result.stderr)
        assert result.stdout == "", (name, result.stdout)


# -- ZooKeeper and Redis unreachable -----------------------------------------------------------


@pytest.mark.parametrize("command", ["offsets show", "pause", "run"])
def test_an_unreachable_zookeeper_is_one_line_without_traceback(
    tmp_path: Path, stack: DevStack, config: TopicConfig, command: str
) -> None:
    """Within the session timeout, which also bounds the wait to connect."""
    config_file = topic_file(tmp_path / "topic.toml", stack, config, "zk_session_timeout = 2\n")
    address = f"127.0.0.1:{closed_port()}"
    done, took = kspout(config_file, COMMANDS[command], {"KSPOUT_ZOOKEEPER": address})
    assert done.returncode == NOT_THERE, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"ZooKeeper at {address}" in line and "KSPOUT_ZOOKEEPER" in line
    assert "within 2s" in line
    assert took < ANSWER_WITHIN, f"{command} took {took:.1f}s"


DEDUP_CHAIN = """\
import os

from dedup import IdempotencyBolt
from kspout.config import load_config

chain = IdempotencyBolt(lambda record, effects: None, load_config(os.environ["TOPIC_FILE"]))
"""


def test_an_unreachable_redis_under_the_dedup_bolt_is_one_line(
    config: TopicConfig, config_file: Path, tmp_path: Path, producer: Producer
) -> None:
    """The bolt's start-up check of the server's durability settings (before the first
    batch) met no Redis: once a traceback from `server_durability_warnings`."""
    produce(producer, config.topic, {0: range(1)})
    (tmp_path / "dedupchain.py").write_text(DEDUP_CHAIN)
    url = f"redis://127.0.0.1:{closed_port()}/0"
    env = {"KSPOUT_REDIS_URL": url, "TOPIC_FILE": str(config_file)}
    args = ["run", "--handler", "dedupchain:chain", "--until-caught-up"]
    done, _ = kspout(config_file, args, env, cwd=tmp_path)
    assert done.returncode == NOT_THERE, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"cannot reach Redis at {url}" in line
    assert "`redis.url` from the environment variable KSPOUT_REDIS_URL" in line


# -- a handler module that does not import -----------------------------------------------------


@pytest.mark.parametrize(
    ("source", "said"),
    [
        pytest.param(
            "def handle(record):\n    return (\n",
            ["SyntaxError", "broken.py, line 2"],
            id="syntax-error",
        ),
        pytest.param(
            'import os\nraise RuntimeError("set ORDERS_DSN first")\n',
            ["RuntimeError: set ORDERS_DSN first", "broken.py, line 2"],
            id="raises-at-import",
        ),
        pytest.param(
            "import a_dependency_not_installed\n",
            ["No module named 'a_dependency_not_installed'", "broken.py, line 1"],
            id="missing-dependency",
        ),
    ],
)
def test_a_handler_module_that_fails_to_import_is_one_line(
    config_file: Path, tmp_path: Path, source: str, said: list[str]
) -> None:
    (tmp_path / "broken.py").write_text(source)
    done, _ = kspout(config_file, ["run", "--handler", "broken:handle"], cwd=tmp_path)
    assert done.returncode == 2, done.stderr  # a usage error: --handler names a bad module
    assert "Traceback" not in done.stderr
    [line] = [text for text in done.stderr.splitlines() if text.startswith("Error:")]
    assert "importing 'broken' failed" in line and "python -c 'import broken'" in line
    for fragment in said:
        assert fragment in line, (fragment, line)


def test_a_handler_module_that_is_not_there_says_where_it_looked(
    config_file: Path, tmp_path: Path
) -> None:
    done, _ = kspout(config_file, ["run", "--handler", "hanlders:handle"], cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"no module 'hanlders' in {tmp_path}" in done.stderr


def test_an_unreachable_postgresql_is_one_line_naming_the_server_not_the_password() -> None:
    """What `PostgresSink.create_table` (before a job) and `write` (in a handler) raise: a
    KspoutError, so the `kspout` command prints it as one line."""
    from dedup.errors import PostgresUnavailable
    from dedup.postgres import PostgresSink

    port = closed_port()
    sink = PostgresSink(f"host=127.0.0.1 port={port} dbname=orders password=s3cret", "ns")
    with pytest.raises(PostgresUnavailable) as raised:
        sink.create_table()
    message = str(raised.value)
    assert isinstance(raised.value, KspoutError)
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/orders" in message
    assert "Connection refused" in message and "check that the server runs" in message
    assert "s3cret" not in message and "\n" not in message

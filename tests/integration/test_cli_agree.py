"""The commands agree with each other and with what a user reads: every command has `--json`
and answers one JSON object, counts agree in number, tables print words and fit the terminal,
`kspout run` prints the metrics URL it bound, and `status` names no stopped instance as owner.

Each test runs the real command (click's CliRunner) over the session's stack.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from tests.commands import subcommands
from tests.integration.helpers import PARTITIONS, open_store, produce, register, topic_file

WIDE = {"COLUMNS": "240"}
# Commands the JSON test does not run, and why (each still must have --json).
NOT_RUN = {
    ("demo",): "starts its own stack and Spark for a minute",
    ("dev", "up"): "starts a stack: test_devstack.py reads its --json object",
}


def ignore(record: Record) -> None:
    """A handler that acks every record."""


HANDLER = f"{__name__}:{ignore.__name__}"


def leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every runnable command under `group`, as its words (`("offsets", "set")`)."""
    for name, command in sorted(subcommands(group).items()):
        if isinstance(command, click.Group):
            yield from leaves(command, (*prefix, name))
        else:
            yield (*prefix, name)


def command_of(words: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for word in words:
        assert isinstance(command, click.Group)
        command = subcommands(command)[word]
    return command


def singular(verb: str, text: str) -> bool:
    """`<verb> 1 partition` is in `text`, not `1 partitions`."""
    return re.search(rf"{verb} 1 partition\b(?!s)", " ".join(text.split())) is not None


def kspout(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env or WIDE)


@pytest.fixture
def config(make_config: Callable[..., TopicConfig]) -> TopicConfig:
    return make_config()


@pytest.fixture
def toml(tmp_path: Path, stack: DevStack, config: TopicConfig, producer: Producer) -> Path:
    """The topic file, over a topic with 5 messages in each partition."""
    produce(producer, config.topic, {p: range(5) for p in PARTITIONS})
    return topic_file(tmp_path / "topic.toml", stack, config)


def test_every_command_has_json_and_its_help_says_what_it_prints() -> None:
    for words in leaves(main):
        command = command_of(words)
        assert any("--json" in p.opts for p in command.params), f"kspout {' '.join(words)}"
        shown = kspout(*words, "--help")
        assert shown.exit_code == 0, shown.output
        assert "--json" in shown.stdout and "Print one JSON object" in shown.stdout, words
        assert "Prints" in shown.stdout, f"`kspout {' '.join(words)} --help` says what it prints"


def test_every_command_answers_json_with_one_object(
    toml: Path, config: TopicConfig, tmp_path: Path
) -> None:
    conf = ("--config", str(toml))
    dev = ("--dir", str(tmp_path / "no-stack"))
    calls: dict[tuple[str, ...], tuple[str, ...]] = {
        ("run",): ("--handler", HANDLER, "--until-caught-up", *conf),
        ("status",): conf,
        ("lag",): conf,
        ("offsets", "show"): conf,
        ("offsets", "set"): ("--partition", "0", "--to", "2", *conf),
        ("offsets", "reset"): ("--all", *conf),
        ("pause",): ("--partition", "1", *conf),
        ("resume",): ("--partition", "1", *conf),
        ("rebalance",): ("--dry-run", *conf),
        ("dlq", "show"): conf,
        ("dlq", "replay"): ("--all", "--dry-run", *conf),
        ("dev", "status"): dev,  # no stack there: exit 1, and still an object
        ("dev", "down"): dev,
        ("produce",): ("--count", "3", *conf),
    }
    assert set(calls) | set(NOT_RUN) == set(leaves(main)), "a command this test does not run"
    answers = {}
    for words, args in calls.items():
        with open_store(config, instance_id="agree-1") as instance:
            if words == ("rebalance",):
                register(instance)  # a live instance to balance over
            result = kspout(*words, *args, "--json")
        assert result.exit_code in (0, 1), (words, result.output)
        answers[words] = json.loads(result.stdout)
        assert isinstance(answers[words], dict), (words, result.stdout)
    # One shape per kind of answer.
    for words in [("status",), ("lag",), ("offsets", "show"), ("run",), ("produce",)]:
        assert answers[words]["topic"] == config.topic
        assert {row["partition"] for row in answers[words]["partitions"]} == set(PARTITIONS)
    changes = [("offsets", "set"), ("offsets", "reset"), ("pause",), ("resume",), ("rebalance",)]
    for words in changes:
        answer = answers[words]
        assert answer.keys() == {"topic", "spout", "action", "dry_run", "partitions"}, words
        assert answer["action"] == words[-1] and answer["spout"] == config.zk_spout_path
        assert all({"partition", "changed"} <= row.keys() for row in answer["partitions"]), words
    assert answers["rebalance",]["dry_run"] is True
    assert answers["pause",]["partitions"][0]["changed"] is True
    assert answers["resume",]["partitions"] == [{"partition": 1, "changed": True, "paused": False}]
    for words in [("dlq", "show"), ("dlq", "replay")]:
        assert answers[words]["dlq_topic"] == config.dlq_topic and answers[words]["letters"] == []
    for words in [("dev", "status"), ("dev", "down")]:
        assert answers[words]["up"] is False
    assert answers["dev", "down"]["stopped"] is False


def test_counts_agree_in_number_and_tables_print_words(toml: Path, config: TopicConfig) -> None:
    with open_store(config, instance_id="agree-2") as instance:
        register(instance)
        one = kspout(
            "rebalance", "--move", "3", "--to", "agree-2", "--dry-run", "--config", str(toml)
        )
        assert one.exit_code == 0, one.output
        assert singular("would move", one.stdout)
        every = kspout("rebalance", "--dry-run", "--config", str(toml))
        assert f"would move {len(PARTITIONS)} partitions" in every.stdout

    paused = kspout("pause", "--partition", "2", "--config", str(toml))
    assert paused.exit_code == 0, paused.output
    assert singular("paused", paused.stdout)
    row = next(line for line in paused.stdout.splitlines() if re.match(r"\W+2\W", line))
    assert re.split(r"[│|]", row)[2].strip() == "yes"  # newly paused: a word, not True
    again = kspout("pause", "--partition", "2", "--config", str(toml))
    assert "paused 0 partitions" in again.stdout
    resumed = kspout("resume", "--all", "--config", str(toml))
    assert singular("resumed", resumed.stdout)
    for result in (paused, again, resumed):
        assert "True" not in result.stdout and "False" not in result.stdout

    status = kspout("status", "--config", str(toml))
    assert "0 live instances" not in status.stdout  # no instance: a sentence instead
    assert "no live instance" in status.stdout


def test_a_lone_instance_logs_its_balance_as_info_in_the_singular(
    config: TopicConfig, toml: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kspout.ownership.membership"):
        for _ in range(2):  # the second start takes the partitions over from the first
            with Driver(config, LocalExecutor(config, ignore)) as driver:
                driver.run(until_caught_up=True)
    balanced = [r for r in caplog.records if r.getMessage().startswith("balanced")]
    assert balanced and all(r.levelno == logging.INFO for r in balanced)
    assert f"balanced {len(PARTITIONS)} partitions over 1 instance (" in balanced[-1].getMessage()
    assert "partitions moved" in balanced[-1].getMessage()


def test_run_prints_the_metrics_url_it_bound_with_port_0(
    tmp_path: Path, stack: DevStack, config: TopicConfig, producer: Producer
) -> None:
    produce(producer, config.topic, {0: range(3)})
    extra = '[metrics]\nport = 0\nhost = "127.0.0.1"\n'
    toml = topic_file(tmp_path / "metrics.toml", stack, config, extra)
    ran = kspout("run", "--config", str(toml), "--handler", HANDLER, "--until-caught-up")
    assert ran.exit_code == 0, ran.output
    found = re.search(r"metrics at http://127\.0\.0\.1:(\d+)/metrics", ran.stderr)
    assert found is not None, ran.stderr
    assert int(found.group(1)) > 0


def test_the_final_table_fits_a_narrow_terminal(toml: Path) -> None:
    ran = kspout(
        "run", "--config", str(toml), "--handler", HANDLER, "--until-caught-up",
        env={"COLUMNS": "60"},
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    lines = ran.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert "…" not in ran.stdout  # no number cut to an ellipsis
    assert "hidden to fit the terminal" in " ".join(ran.stdout.split())
    wide = kspout("run", "--config", str(toml), "--handler", HANDLER, "--until-caught-up")
    assert "hidden" not in wide.stdout and "acked" in wide.stdout


def test_status_after_every_instance_stopped_names_no_owner(
    config: TopicConfig, toml: Path
) -> None:
    with Driver(config, LocalExecutor(config, ignore)) as driver:
        driver.run(until_caught_up=True)
        gone = driver.progress().instance

    answer: dict[str, Any] = json.loads(kspout("status", "--config", str(toml), "--json").stdout)
    assert answer["instances"] == []
    for row in answer["partitions"]:
        assert (row["owner"], row["moving_to"]) == (None, None)
        assert row["last_writer"] == gone
    table = kspout("status", "--config", str(toml))
    assert table.exit_code == 0, table.output
    assert f"none (last: {gone}, not running)" in table.stdout
    assert "->" not in table.stdout

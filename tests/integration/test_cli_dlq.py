"""`kspout dlq show|replay` against the session's Kafka broker, ZooKeeper and Redis.

Each test dead-letters messages for real: a dedup chain (`IdempotencyBolt`) runs in-process
(`Driver` with `LocalExecutor`) over messages of which some always fail (EXCEPTION) and some
have no id (INVALID). The commands then run through click's CliRunner, or as the installed
`kspout` script where exit codes and stderr matter.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from dedup import Effects, IdempotencyBolt
from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver, Progress
from kspout.executor.local import LocalExecutor
from kspout.kafka import PartitionFetcher, Record
from kspout.kafka.deadletter import LETTER_HEADERS
from tests.integration.helpers import (
    dead_letter_headers,
    highs,
    kspout_command,
    produce,
    topic_file,
)

MESSAGES = 8  # per partition
POISON = {(0, 3), (2, 5)}  # (partition, offset): always fails while the flag is up
NO_ID = {(1, 4)}  # no key: INVALID
LETTERS = POISON | NO_ID


def id_of(partition: int, offset: int) -> str:
    return f"id-{partition}-{offset}"


class Apply:
    """Counts each applied id in a Redis hash (an effect applied with DONE); raises for the ids
    in `failing`, on every attempt, while they are there."""

    def __init__(self, effect_key: str, failing: set[str]) -> None:
        self.effect_key = effect_key
        self.failing = failing

    def __call__(self, record: Record, effects: Effects) -> None:
        if effects.id in self.failing:
            raise RuntimeError(f"poison {effects.id}")
        effects.hincrby(self.effect_key, effects.id)


def run(config: TopicConfig, handler: Apply) -> Progress:
    bolt = IdempotencyBolt(handler, config)
    with Driver(config, LocalExecutor(config, bolt)) as driver:
        return driver.run(until_caught_up=True)


def applied(client: redis.Redis, key: str) -> dict[str, int]:
    return {bytes(k).decode(): int(v) for k, v in client.hgetall(key).items()}


def dlq(toml: Path, *args: str) -> Result:
    """`kspout dlq <args> --config <toml>` in this process."""
    return CliRunner().invoke(main, ["dlq", *args, "--config", str(toml)], env={"COLUMNS": "200"})


def dlq_json(toml: Path, *args: str) -> list[dict[str, Any]]:
    """The letters of `dlq show|replay --json`, after checking the answer's shape."""
    result = dlq(toml, *args, "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert {"topic", "dlq_topic", "letters"} <= answer.keys()
    rows: list[dict[str, Any]] = answer["letters"]
    return rows


def at(rows: list[dict[str, Any]]) -> set[tuple[int, int]]:
    """The source (partition, offset) of each letter."""
    return {(row["source_partition"], row["source_offset"]) for row in rows}


@pytest.fixture
def dead_lettered(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    stack: DevStack,
    tmp_path: Path,
) -> tuple[TopicConfig, Path]:
    """A run that dead-lettered POISON (EXCEPTION) and NO_ID (INVALID); the config and its file."""
    config = dedup_config(max_retries=1)
    produce(
        producer,
        config.topic,
        {p: range(MESSAGES) for p in (0, 1, 2)},
        key=lambda p, o: None if (p, o) in NO_ID else id_of(p, o).encode(),
    )
    effect = f"{config.topic}:applied"
    progress = run(config, Apply(effect, {id_of(*at) for at in POISON}))
    assert progress.total("dead_lettered") == len(LETTERS)
    assert len(applied(redis_client, effect)) == 3 * MESSAGES - len(LETTERS)
    return config, topic_file(tmp_path / "topic.toml", stack, config)


def test_show_lists_the_letters_of_a_run_and_filters_them(
    dead_lettered: tuple[TopicConfig, Path], producer: Producer
) -> None:
    config, toml = dead_lettered
    producer.produce(config.dlq_topic, b"not a dead letter", partition=0)  # no kspout headers
    assert producer.flush(10) == 0

    rows = dlq_json(toml, "show")

    assert at(rows) == LETTERS and len(rows) == len(LETTERS)
    by_at = {(row["source_partition"], row["source_offset"]): row for row in rows}
    for partition, offset in POISON:
        row = by_at[partition, offset]
        assert row["reason"] == "exception (retries exhausted)"
        assert row["attempts"] == 2  # max_retries = 1
        assert row["error"] == f"RuntimeError: poison {id_of(partition, offset)}"
        assert row["key"] == id_of(partition, offset)
        assert row["source_topic"] == config.topic
    [invalid] = [by_at[a] for a in NO_ID]
    assert invalid["reason"].startswith("invalid") and invalid["key"] is None
    assert "no message id" in invalid["error"]
    assert [r["timestamp"] for r in rows] == sorted(r["timestamp"] for r in rows)

    assert at(dlq_json(toml, "show", "--partition", "0", "--partition", "1")) == {(0, 3), (1, 4)}
    assert at(dlq_json(toml, "show", "--reason", "INVALID")) == NO_ID
    assert at(dlq_json(toml, "show", "--reason", "exception", "--partition", "2")) == {(2, 5)}
    assert len(dlq_json(toml, "show", "--limit", "2")) == 2
    newest = max(row["timestamp"] for row in rows)
    assert dlq_json(toml, "show", "--since", str(newest + 1)) == []
    assert at(dlq_json(toml, "show", "--since", str(min(r["timestamp"] for r in rows)))) == LETTERS
    assert dlq_json(toml, "show", "--until", "2001-01-01T00:00:00Z") == []
    assert at(dlq_json(toml, "show", "--until", str(newest + 1))) == LETTERS

    none = dlq(toml, "show", "--reason", "timeout", "--json")
    assert none.exit_code == 0 and json.loads(none.stdout)["letters"] == []
    assert "matches the filters" in none.stderr

    table = dlq(toml, "show")
    assert table.exit_code == 0, table.output
    assert "dead letters of" in table.stdout and id_of(0, 3) in table.stdout
    assert table.stdout.count("exception") == 2 and table.stdout.count("invalid") == 1
    assert "3 letters" in table.stdout and "1 other record skipped" in table.stdout
    assert f"kspout dlq replay --config {toml} --offset" in table.stdout  # runs as printed


def test_show_says_so_when_nothing_was_dead_lettered(
    make_config: Callable[..., TopicConfig], stack: DevStack, tmp_path: Path
) -> None:
    toml = topic_file(tmp_path / "topic.toml", stack, make_config())

    result = dlq(toml, "show")

    assert result.exit_code == 0, result.output
    assert "no dead letters" in result.stdout and "does not exist" in result.stdout
    assert dlq_json(toml, "show") == []


def test_a_replayed_letter_applies_once_under_the_dedup_bolt_however_often_it_is_replayed(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    stack: DevStack,
    tmp_path: Path,
) -> None:
    """The id comes from a header, so the replay must keep the original headers to apply."""
    config = dedup_config(max_retries=1, dedup={"id_source": "header:msg-id"})
    for offset in range(5):
        headers = [("msg-id", b"order-%d" % offset), ("trace", b"t%d" % offset)]
        producer.produce(config.topic, b"v%d" % offset, b"k%d" % offset, 1, headers=headers)
    assert producer.flush(10) == 0
    effect = f"{config.topic}:applied"
    handler = Apply(effect, {"order-2"})
    toml = topic_file(tmp_path / "topic.toml", stack, config)

    assert run(config, handler).total("dead_lettered") == 1
    assert "order-2" not in applied(redis_client, effect)
    handler.failing.clear()  # the cause is fixed

    [first] = dlq_json(toml, "replay", "--reason", "exception")
    assert first["replayed"] and first["replay_error"] is None
    assert first["error"] == "RuntimeError: poison order-2"
    assert (first["source_partition"], first["source_offset"]) == (1, 2)
    assert (first["to_topic"], first["to_partition"], first["to_offset"]) == (config.topic, 1, 5)
    assert run(config, handler).total("acked") == 1
    assert applied(redis_client, effect) == {f"order-{o}": 1 for o in range(5)}

    letter = f"{first['dlq_partition']}:{first['dlq_offset']}"
    [again] = dlq_json(toml, "replay", "--offset", letter)
    assert again["replayed"] and again["to_offset"] == 6
    assert run(config, handler).total("duplicates") == 1
    assert applied(redis_client, effect) == {f"order-{o}": 1 for o in range(5)}
    assert len(dead_letter_headers(config, stack.info.brokers)) == 1  # nothing failed again

    with PartitionFetcher(config) as fetcher:
        replayed = fetcher.fetch(config.topic, 1, [(5, 7)]).records
    assert [record.offset for record in replayed] == [5, 6]
    mark = f"{config.dlq_topic}/{letter.replace(':', '/')}".encode()
    for record in replayed:
        assert (record.key, record.value) == (b"k2", b"v2")
        names = [name for name, _ in record.headers]
        assert names == ["msg-id", "trace", "kspout.replayed_from", "kspout.replayed_at"]
        assert record.headers[:3] == (
            ("msg-id", b"order-2"),
            ("trace", b"t2"),
            ("kspout.replayed_from", mark),
        )
        replayed_at = record.headers[3][1]
        assert replayed_at is not None and abs(int(replayed_at) - record.timestamp) < 60_000


def test_a_dry_run_writes_nothing(dead_lettered: tuple[TopicConfig, Path]) -> None:
    config, toml = dead_lettered
    before = highs(config)

    rows = dlq_json(toml, "replay", "--reason", "exception", "--dry-run")

    assert at(rows) == POISON
    for row in rows:
        assert not row["replayed"] and row["to_offset"] is None and row["replay_error"] is None
        assert (row["to_topic"], row["to_partition"]) == (config.topic, row["source_partition"])
    letter = f"{rows[0]['dlq_partition']}:{rows[0]['dlq_offset']}"
    later = str(max(row["timestamp"] for row in rows) + 1)
    assert dlq_json(toml, "replay", "--offset", letter, "--since", later, "--dry-run") == []
    table = dlq(toml, "replay", "--all", "--dry-run")
    assert table.exit_code == 0, table.output
    assert "would replay 3 letters" in table.stdout
    assert highs(config) == before


def test_replay_refuses_to_guess_which_letters(dead_lettered: tuple[TopicConfig, Path]) -> None:
    config, toml = dead_lettered
    before = highs(config)

    def kspout(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(kspout_command()), "dlq", "replay", "--config", str(toml), *args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    unchosen = kspout()
    assert unchosen.returncode == 2 and unchosen.stdout == ""
    assert "--all to replay every dead letter" in unchosen.stderr
    both = kspout("--all", "--reason", "exception")
    assert both.returncode == 2 and "drop the filters" in both.stderr
    unknown = kspout("--offset", "0:999")
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert "no dead letter at 0:999" in unknown.stderr and "kspout dlq show" in unknown.stderr
    nothing = kspout("--reason", "timeout")
    assert nothing.returncode == 0 and "matches the filters" in nothing.stdout
    assert highs(config) == before


def test_a_letter_kafka_refuses_fails_the_replay_and_is_named(
    dead_lettered: tuple[TopicConfig, Path], producer: Producer
) -> None:
    """A letter from a source partition the topic no longer has (it was recreated smaller)."""
    config, toml = dead_lettered
    values = (config.topic, "9", "0", "1", "exception (retries exhausted)", "boom")
    headers = [(name, value.encode()) for name, value in zip(LETTER_HEADERS, values, strict=True)]
    producer.produce(config.dlq_topic, b"v", b"k", partition=0, headers=headers)
    assert producer.flush(10) == 0
    [forged] = [row for row in dlq_json(toml, "show") if row["source_partition"] == 9]
    letter = f"{forged['dlq_partition']}:{forged['dlq_offset']}"

    result = dlq(toml, "replay", "--all", "--json")

    assert result.exit_code == 1
    rows = {
        (row["source_partition"], row["source_offset"]): row
        for row in json.loads(result.stdout)["letters"]
    }
    assert set(rows) == LETTERS | {(9, 0)}
    assert all(rows[at]["replayed"] for at in LETTERS)
    assert not rows[9, 0]["replayed"] and "partition" in rows[9, 0]["replay_error"].lower()
    assert "1 of 4 dead letters not replayed" in result.stderr
    assert f"--offset {letter}" in result.stderr

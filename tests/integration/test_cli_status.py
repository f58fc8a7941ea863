"""`kspout status` and `kspout lag` over a real driver, the session's ZooKeeper and Kafka
broker."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer
from kazoo.client import KazooClient

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from kspout.ownership.assignment import Assignment
from kspout.ownership.tree import SpoutTree
from tests.integration.helpers import (
    PARTITIONS,
    highs,
    open_store,
    produce,
    register,
    stored,
    topic_file,
)

POISON = (0, 5)  # (partition, offset) the handler always fails: it ends in the dead-letter topic


def handler(record: Record) -> None:
    if (record.partition, record.offset) == POISON:
        raise RuntimeError("poison")


def kspout(config_file: Path, *args: str) -> Result:
    """`kspout <args> --config <config_file>`, with a wide terminal for the tables."""
    return CliRunner().invoke(main, [*args, "--config", str(config_file)], env={"COLUMNS": "240"})


def status_json(config_file: Path) -> dict[str, Any]:
    result = kspout(config_file, "status", "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def by_partition(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {row["partition"]: row for row in rows}


def by_id(instances: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {instance["id"]: instance for instance in instances}


def with_commit_interval(path: Path, seconds: float) -> Path:
    """`path`'s topic file with another commit interval (which sets when a report is stale)."""
    text = path.read_text().replace("commit_interval = 0.5", f"commit_interval = {seconds}")
    out = path.with_name(f"{path.stem}-{seconds}.toml")
    out.write_text(text)
    return out


@pytest.fixture
def config(make_config: Callable[..., TopicConfig]) -> TopicConfig:
    return make_config()


@pytest.fixture
def config_file(tmp_path: Path, stack: DevStack, config: TopicConfig) -> Path:
    """The topic file the commands read, with a commit interval long enough that the driver's
    report never goes stale during a test."""
    return with_commit_interval(topic_file(tmp_path / "topic.toml", stack, config), 30)


@pytest.fixture
def driver(config: TopicConfig, producer: Producer) -> Iterator[Driver]:
    """A driver that processed 30 + 10 messages (partitions 0 and 1; one poison message went
    to the dead-letter topic) and committed; still running (registered, owning every
    partition)."""
    produce(producer, config.topic, {0: range(30), 1: range(10)})
    with Driver(config, LocalExecutor(config, handler)) as running:
        running.run(until_caught_up=True)
        running.commit()
        yield running


def test_status_shows_the_instance_its_partitions_and_their_counts(
    config: TopicConfig, config_file: Path, driver: Driver, producer: Producer
) -> None:
    progress = driver.progress()
    me = progress.instance
    data = status_json(config_file)
    assert (data["topic"], data["spout"]) == (config.topic, config.zk_spout_path)

    (instance,) = data["instances"]
    assert instance["id"] == me
    assert (instance["host"], instance["pid"]) == (socket.gethostname(), os.getpid())
    assert instance["partitions"] == instance["assigned"] == list(PARTITIONS)
    assert instance["leader"] is True and instance["stale"] is False
    assert instance["commits_refused"] == 0
    assert 0 <= instance["report_age_s"] < 30 and instance["since"].endswith("Z")

    rows = by_partition(data["partitions"])
    committed = stored(config)
    views = {v.partition: v for v in progress.partitions}
    assert sorted(rows) == list(PARTITIONS)
    for p, row in rows.items():
        assert row["owner"] == me and row["moving_to"] is None
        assert row["committed"] == committed[p] == views[p].committed
        assert row["high"] == views[p].high and row["lag"] == views[p].lag == 0
        assert (row["in_flight"], row["waiting"], row["lost"]) == (0, 0, 0)
        assert row["dead_lettered"] == (1 if p == POISON[0] else 0)
        assert row["status"] == "running" and row["pause"] is None
        assert 0 <= row["commit_age_s"] < 30
    assert data["totals"]["dead_lettered"] == 1 and data["totals"]["owned"] == 4

    # New messages are lag at once: Kafka's high watermark against the record, not the report.
    produce(producer, config.topic, {1: range(10, 25)})
    rows = by_partition(status_json(config_file)["partitions"])
    assert rows[1]["lag"] == highs(config)[1] - stored(config)[1] == 15
    lag = kspout(config_file, "lag", "--json")
    assert lag.exit_code == 0, lag.output
    assert json.loads(lag.stdout)["lag"] == 15
    assert {r["partition"]: r["lag"] for r in json.loads(lag.stdout)["partitions"]} == {
        p: row["lag"] for p, row in rows.items()
    }

    table = kspout(config_file, "status")
    assert table.exit_code == 0, table.output
    assert f"{me} (leader)" in table.stdout and "running" in table.stdout
    assert "4/4 owned" in table.stdout

    # A report older than 3 commit intervals is stale (this file's interval is 0.1 s).
    time.sleep(0.5)
    quick = with_commit_interval(config_file.with_name("topic.toml"), 0.1)
    data = status_json(quick)
    assert data["instances"][0]["stale"] is True
    assert all(row["report_stale"] for row in data["partitions"])
    assert "(stale)" in kspout(quick, "status").stdout


def test_status_shows_a_pause_and_the_owners_ack(
    config: TopicConfig, config_file: Path, driver: Driver, zk: KazooClient
) -> None:
    me = driver.progress().instance
    paused = kspout(config_file, "pause", "--partition", "1", "--no-wait")
    assert paused.exit_code == 0, paused.output

    row = by_partition(status_json(config_file)["partitions"])[1]
    assert row["status"] == "paused" and row["owner"] == me
    assert row["pause"]["by"].startswith("operator@") and row["pause"]["acked"] is False
    assert by_partition(status_json(config_file)["partitions"])[0]["status"] == "running"

    # An ack by another instance (a former owner) is not the current owner's.
    node = SpoutTree(config.zk_spout_path).pause(1)
    pause = json.loads(zk.get(node)[0]) | {"ack": {"instance": "gone-1", "offset": 3, "at": 0}}
    zk.set(node, json.dumps(pause).encode())
    row = by_partition(status_json(config_file)["partitions"])[1]
    assert row["pause"]["acked_by"] == "gone-1" and row["pause"]["acked"] is False

    deadline = time.monotonic() + 10
    while json.loads(zk.get(node)[0])["ack"]["instance"] != me:
        assert time.monotonic() < deadline, "the driver never acked the pause"
        driver.step()
    driver.commit()

    row = by_partition(status_json(config_file)["partitions"])[1]
    assert row["status"] == "paused"
    assert row["pause"]["acked"] is True and row["pause"]["acked_by"] == me
    assert row["pause"]["acked_offset"] == row["committed"] == 10
    table = kspout(config_file, "status")
    assert "paused, acked" in table.stdout
    assert f"acked by {me} at offset 10" in table.stdout
    assert "kspout resume --config" in table.stdout


def test_status_marks_a_partition_another_instance_takes_over(
    config: TopicConfig, config_file: Path, driver: Driver, zk: KazooClient
) -> None:
    me = driver.progress().instance
    owners = {p: me for p in PARTITIONS} | {3: "other-1"}
    moved = Assignment(owners, (me, "other-1"), PARTITIONS, "operator@test", 0)
    zk.set(SpoutTree(config.zk_spout_path).assignment, moved.encode())

    with open_store(config, instance_id="other-1") as other:
        register(other)  # live, not holding partition 3 yet
        data = status_json(config_file)
        table = kspout(config_file, "status").stdout
    rows = by_partition(data["partitions"])
    assert rows[3]["owner"] == me and rows[3]["assigned"] == rows[3]["moving_to"] == "other-1"
    assert all(rows[p]["moving_to"] is None for p in (0, 1, 2))
    assert by_id(data["instances"])[me]["assigned"] == [0, 1, 2]
    assert f"{me} -> other-1" in table and "0-3 (assigned 0-2)" in table

    # Once other-1 is gone, the assignment naming it moves nothing.
    rows = by_partition(status_json(config_file)["partitions"])
    assert rows[3]["owner"] == me and rows[3]["moving_to"] is None
    assert "->" not in kspout(config_file, "status").stdout


def test_status_without_instances_shows_records_stops_and_start(
    config: TopicConfig, config_file: Path, producer: Producer
) -> None:
    produce(producer, config.topic, {0: range(6), 2: range(8)})
    reason = "offset 3 is below Kafka's low watermark 5"
    with open_store(config) as store:
        store.commit(2, 3, version=None, stopped=reason)

    data = status_json(config_file)
    assert data["instances"] == []
    rows = by_partition(data["partitions"])
    stop = rows[2]
    assert (stop["owner"], stop["status"], stop["stopped"]) == (None, "stopped", reason)
    assert (stop["committed"], stop["high"], stop["lag"]) == (3, 8, 5)
    assert stop["in_flight"] is None and stop["report_stale"] is None
    assert rows[0]["committed"] is None and rows[0]["status"] is None
    assert rows[0]["start"] == {"position": "earliest", "offset": 0} and rows[0]["lag"] == 6
    assert data["totals"]["lag"] == 11 and data["totals"]["stopped"] == 1

    table = kspout(config_file, "status")
    assert table.exit_code == 0, table.output
    assert "no live instance" in table.stdout and "kspout run" in table.stdout
    assert f"partition 2 stopped: {reason}" in table.stdout
    assert f"--config {config_file} --partition 2 --to earliest" in table.stdout


def test_lag_exit_codes_follow_the_threshold(
    config: TopicConfig, config_file: Path, producer: Producer
) -> None:
    produce(producer, config.topic, {0: range(10), 1: range(4)})
    with open_store(config) as store:
        store.commit(0, 4, version=None)  # partition 1 has no record: lag from start (earliest)

    result = kspout(config_file, "lag", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["lag"], data["threshold"], data["above"]) == (10, None, False)
    rows = by_partition(data["partitions"])
    assert (rows[0]["committed"], rows[0]["high"], rows[0]["lag"]) == (4, 10, 6)
    assert rows[1]["committed"] is None and rows[1]["start"] == {
        "position": "earliest",
        "offset": 0,
    }
    assert rows[1]["lag"] == 4 and rows[2]["lag"] == rows[3]["lag"] == 0

    assert kspout(config_file, "lag", "--threshold", "10").exit_code == 0
    above = kspout(config_file, "lag", "--threshold", "9")
    assert above.exit_code == 1, above.output
    assert "total lag 10 is above 9; partitions behind: 0 (6), 1 (4)" in above.stdout

    produce(producer, config.topic, {1: range(4, 9)})
    more = kspout(config_file, "lag", "--threshold", "10", "--json")
    assert more.exit_code == 1, more.output
    data = json.loads(more.stdout)
    assert (data["lag"], data["above"], data["behind"]) == (15, True, [1, 0])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("command", ["lag", "status"])
def test_exit_3_with_what_to_check_when_zookeeper_is_unreachable(
    config_file: Path, stack: DevStack, command: str
) -> None:
    unreachable = config_file.with_name("no-zk.toml")
    text = config_file.read_text()
    unreachable.write_text(text.replace(stack.info.zookeeper, f"127.0.0.1:{closed_port()}"))
    args = ("lag", "--threshold", "0") if command == "lag" else ("status",)
    result = kspout(unreachable, *args)
    assert result.exit_code == 3, result.output
    assert "could not tell" in result.stderr and "ZooKeeper" in result.stderr
    assert "check that the ensemble is running" in result.stderr
    assert "Traceback" not in result.output

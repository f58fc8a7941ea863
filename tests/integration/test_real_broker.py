"""What only Apache Kafka's real broker does, end to end against the session's stack: its log
cleaner compacting a topic before the spout reads it, `DeleteRecords` cutting the log under a
running spout, and its consumer-group API reading back the commit points the spout mirrors.
(Partitions added while several instances run: test_ownership.py.)

Each test first checks that the broker really did what the test is about (offsets compacted
away, the low watermark moved, the group holds offsets), then judges the spout against a ledger
the test keeps itself: what it produced, and what a plain consumer reads back from Kafka.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from tests.conftest import TopicFactory
from tests.integration.helpers import (
    PARTITIONS,
    highs,
    kspout_command,
    open_store,
    produce,
    stored,
    topic_file,
    watermarks,
)
from tests.integration.test_ownership import eventually, running

At = tuple[int, int]  # (partition, offset)
Written = dict[At, tuple[bytes | None, bytes | None]]  # what was produced where: (key, value)


class Ledger:
    """A handler that notes every record it is given, thread-safe (the drivers run in threads)."""

    def __init__(self) -> None:
        self.counts: Counter[At] = Counter()
        self.records: dict[At, tuple[bytes | None, bytes | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        with self._lock:
            at = (record.partition, record.offset)
            self.counts[at] += 1
            self.records[at] = (record.key, record.value)

    def offsets(self, partition: int) -> set[int]:
        return {o for p, o in self.counts if p == partition}

    def twice(self) -> dict[At, int]:
        return {at: n for at, n in self.counts.items() if n != 1}


def produce_writes(
    producer: Producer, topic: str, writes: Iterable[tuple[int, bytes, bytes | None]]
) -> Written:
    """Produce (partition, key, value) in order; where each landed, from the delivery reports."""
    landed: Written = {}

    def delivered(err: Any, msg: Any) -> None:
        assert err is None, err
        landed[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    for partition, key, value in writes:
        producer.produce(topic, value, key, partition=partition, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0
    return landed


def read_back(brokers: str, topic: str, partitions: Iterable[int]) -> Written:
    """Every record Kafka holds now in `partitions`, read with a plain consumer up to each
    partition's high watermark (whose last offset must hold a record)."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"check-{uuid.uuid4().hex}"})
    try:
        ends = {}
        for p in partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > 0:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        found: Written = {}
        last = dict.fromkeys(ends, -1)
        deadline = time.monotonic() + 20
        while any(last[p] < ends[p] - 1 for p in ends):
            assert time.monotonic() < deadline, f"{topic}: read to {last} of {ends}"
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                at = (cast(int, msg.partition()), cast(int, msg.offset()))
                found[at] = (msg.key(), msg.value())
                last[at[0]] = at[1]
        return found
    finally:
        consumer.close()


def survivors(written: Written) -> Written:
    """What a fully compacted log keeps of `written`: each key's last write, unless that write
    is a tombstone (gone too, once `delete.retention.ms` passed)."""
    last: dict[tuple[int, bytes | None], At] = {}
    for at in sorted(written):
        last[(at[0], written[at][0])] = at
    return {at: written[at] for at in last.values() if written[at][1] is not None}


# -- compaction ------------------------------------------------------------------------------------

COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",  # a write 100 ms after a segment began rolls it (and makes it cleanable)
    "segment.bytes": "1048576",  # Kafka 4's minimum: rolling by time does the work here
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",  # tombstones go at the cleaning after next
}


def compaction_writes(partition: int) -> list[tuple[int, bytes, bytes | None]]:
    """Keys k0..k29 written once, k0..k19 overwritten, k0..k9 overwritten again, k20..k24
    deleted (a tombstone each): only k0..k19's last values and k25..k29 survive."""
    writes: list[tuple[int, bytes, bytes | None]] = []
    for generation, keys in enumerate((range(30), range(20), range(10))):
        writes += [(partition, b"k%d" % k, b"g%d-k%d" % (generation, k)) for k in keys]
    writes += [(partition, b"k%d" % k, None) for k in range(20, 25)]
    return writes


def test_a_compacted_topic_reads_its_gaps_as_gaps_and_every_survivor_once(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    topic_factory: TopicFactory,
    producer: Producer,
) -> None:
    topic = topic_factory("compacted", config=COMPACTED)
    config = make_config(topic=topic, batch_size=16)
    written: Written = {}
    for p in PARTITIONS:
        written |= produce_writes(producer, topic, compaction_writes(p))
    # The cleaner never touches the active segment: a later write (a "tail", under a key of
    # its own so that it survives) rolls the segment that holds the data. Each pass of the
    # cleaner needs new dirty data, and a tombstone goes at the pass after the one that set its
    # deletion horizon: another tail brings that pass.
    deadline = time.monotonic() + 60
    while (found := read_back(stack.info.brokers, topic, PARTITIONS)) != survivors(written):
        assert time.monotonic() < deadline, f"not compacted within 60 s: {sorted(found)}"
        time.sleep(1.0)
        late = sorted({at[0] for at in set(found) ^ set(survivors(written))})
        tails = [(p, b"tail-%d" % len(written), b"tail") for p in late]  # a new key: it stays
        written |= produce_writes(producer, topic, tails)
    # The cleaner struck: overwritten values and deleted keys (their tombstones too) are gone,
    # leaving gaps inside [0, high) on every partition.
    ends = highs(config)
    for p in PARTITIONS:
        held = {o for q, o in found if q == p}
        gone = set(range(ends[p])) - held
        assert set(range(25)) <= gone  # k0..k24's first values
        assert any(written[(p, o)][1] is None for o in gone)  # tombstones removed as well
        assert max(held) == ends[p] - 1 and watermarks(config)[p][0] == 0

    handler = Ledger()
    with Driver(config, LocalExecutor(config, handler)) as driver:
        progress = driver.run(until_caught_up=True)

    # Every record Kafka kept was handled exactly once, as Kafka holds it; nothing else was.
    assert handler.twice() == {}
    assert handler.records == {at: kv for at, kv in found.items()}
    assert read_back(stack.info.brokers, topic, PARTITIONS) == found  # the ledger held still
    # The gaps finished as gaps, nothing counted lost, and the commit point is the high mark.
    for view in progress.partitions:
        kept = sum(1 for q, _ in found if q == view.partition)
        assert view.stats.gaps == ends[view.partition] - kept > 0
        assert view.stats.lost == 0 and view.stats.acked == kept
    assert progress.resets == []
    assert stored(config) == ends


# -- DeleteRecords under a running spout -----------------------------------------------------------


class Gated(Ledger):
    """A ledger whose handler stops at one record until `gate` opens; `reached` says it is
    there. The in-process executor runs batches on the driver's thread: the spout holds still
    there, its position known, while the test acts on Kafka."""

    def __init__(self, at: At) -> None:
        super().__init__()
        self.at = at
        self.reached = threading.Event()
        self.gate = threading.Event()

    def __call__(self, record: Record) -> None:
        if (record.partition, record.offset) == self.at:
            self.reached.set()
            assert self.gate.wait(30), "the gate never opened"
        super().__call__(record)


GATE = (0, 100)
CUT = 400  # DeleteRecords moves partition 0's log start here, far past the spout's position
FIRST = {0: range(600), 1: range(50), 2: range(50), 3: range(50)}


def delete_records_below(stack: DevStack, topic: str, partition: int, offset: int) -> int:
    """Kafka's DeleteRecords on one partition; returns the new low watermark it reports."""
    admin = AdminClient({"bootstrap.servers": stack.info.brokers})
    (future,) = admin.delete_records([TopicPartition(topic, partition, offset)]).values()
    low: int = future.result(30).low_watermark
    return low


def cut_under_the_gate(
    stack: DevStack, config: TopicConfig, handler: Gated, producer: Producer
) -> None:
    """Produce FIRST; once the running spout sits at GATE, cut partition 0 at CUT."""
    produce(producer, config.topic, FIRST)
    assert handler.reached.wait(30), "the spout never reached the gate"
    assert delete_records_below(stack, config.topic, 0, CUT) == CUT
    assert watermarks(config)[0] == (CUT, 600)  # the fault struck: Kafka no longer has [0, CUT)
    assert stored(config).get(0, 0) <= GATE[1]  # ... below the spout's position
    handler.gate.set()


def as_offsets(ranges: Iterable[tuple[int, int]]) -> list[int]:
    return [o for lo, hi in ranges for o in range(lo, hi)]


def test_delete_records_under_a_running_spout_loses_exactly_the_cut_range(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kspout")
    config = make_config(out_of_range="earliest", batch_size=20)
    handler = Gated(GATE)
    with running(config, handler) as (driver,):
        cut_under_the_gate(stack, config, handler, producer)
        eventually(lambda: stored(config) == highs(config), what="every partition caught up")
        progress = driver.progress()

    ((partition, reset),) = progress.resets
    assert partition == 0 and (reset.low, reset.new_start) == (CUT, CUT)
    lost = as_offsets(reset.lost)
    handled = handler.offsets(0)
    # Exactly the cut part the spout had not finished is lost; everything else ran once.
    assert sorted(handled | set(lost)) == list(range(600)) and not handled & set(lost)
    assert len(lost) == len(set(lost)) and lost and max(lost) == CUT - 1
    assert min(lost) > GATE[1]  # the record under the gate (and all before it) finished
    assert handler.twice() == {}
    assert all(handler.offsets(p) == set(FIRST[p]) for p in (1, 2, 3))
    assert progress.partitions[0].stats.lost == len(lost)
    assert progress.total("lost") == len(lost)
    (said,) = [r for r in caplog.records if "out of range" in r.getMessage()]
    assert said.levelno == logging.WARNING
    assert f"lost {len(lost)} offsets {list(reset.lost)}" in said.getMessage()
    assert stored(config) == {0: 600, 1: 50, 2: 50, 3: 50}


def test_delete_records_with_fail_stops_one_partition_until_the_printed_command_runs(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.ERROR, logger="kspout")
    config = make_config(out_of_range="fail", batch_size=20)
    toml = topic_file(tmp_path / "topic.toml", stack, config)
    handler = Gated(GATE)
    with running(config, handler) as (driver,):
        cut_under_the_gate(stack, config, handler, producer)

        def stopped() -> str | None:
            return driver.progress().partitions[0].stopped

        reason = eventually(stopped, what="partition 0 stops")

        def recorded() -> Any:
            with open_store(config) as store:
                record = store.read(0)
            return record if record is not None and record.stopped is not None else None

        record = eventually(recorded, what="the stop is recorded in ZooKeeper")
        at = record.offset
        assert record.stopped == reason
        assert GATE[1] < at < CUT  # what ran before the cut was committed, no further
        assert reason == f"offset {at} is out of range; Kafka holds [{CUT}, 600)"
        assert any(reason in r.getMessage() for r in caplog.records)

        # The other partitions go on: new messages there are handled and committed.
        produce(producer, config.topic, {p: range(50, 80) for p in (1, 2, 3)})
        eventually(lambda: stored(config) == {0: at, 1: 80, 2: 80, 3: 80}, what="1-3 go on")
        assert handler.offsets(0) == set(range(at))
        assert driver.progress().partitions[0].status == "stopped"

        # The operator runs the command `kspout offsets show` prints for the stopped partition.
        shown = subprocess.run(
            [str(kspout_command()), "offsets", "show", "--config", str(toml)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0, shown.stderr
        (command,) = [line.strip() for line in shown.stdout.splitlines() if "offsets set" in line]
        argv = shlex.split(command)
        assert argv[0] == "kspout" and str(toml) in argv
        moved = subprocess.run(
            [str(kspout_command()), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert moved.returncode == 0, moved.stderr
        eventually(lambda: stored(config)[0] == 600, what="the running spout resumes 0")
        assert driver.progress().partitions[0].status == "running"
        progress = driver.progress()

    # Nothing ran twice; partition 0 ran what it held before the cut and all Kafka kept after.
    assert handler.twice() == {}
    assert handler.offsets(0) == set(range(at)) | set(range(CUT, 600))
    assert all(handler.offsets(p) == set(range(80)) for p in (1, 2, 3))
    assert progress.resets == [] and progress.total("lost") == 0  # fail skips nothing itself


# -- the consumer-group mirror ---------------------------------------------------------------------


def group_offsets(stack: DevStack, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets for `topic`, through Kafka's own group API."""
    admin = AdminClient({"bootstrap.servers": stack.info.brokers})
    (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    answer = future.result(30)
    return {tp.partition: tp.offset for tp in answer.topic_partitions if tp.topic == topic}


def kspout_lag(toml: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(kspout_command()), "lag", "--config", str(toml), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_the_consumer_group_holds_the_commit_points_and_kafka_lag_matches_kspout_lag(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    group = f"kspout-mirror-{uuid.uuid4().hex[:8]}"
    config = make_config(consumer_group=group)
    toml = topic_file(tmp_path / "topic.toml", stack, config, f'consumer_group = "{group}"\n')
    produce(producer, config.topic, {0: range(40), 1: range(25), 2: range(10)})
    handler = Ledger()
    with running(config, handler):
        eventually(lambda: stored(config) == {0: 40, 1: 25, 2: 10, 3: 0}, what="caught up")
        # While it runs, the group follows ZooKeeper (commits are asynchronous).
        eventually(
            lambda: group_offsets(stack, group, config.topic) == stored(config),
            what="the group holds the commit points",
        )
    assert handler.twice() == {} and len(handler.counts) == 75

    # Stopped, with new messages it has not read: Kafka's lag and kspout's must agree.
    behind: Mapping[int, int] = {0: 7, 1: 0, 2: 13, 3: 4}
    produce(
        producer,
        config.topic,
        {p: range(stored(config)[p], stored(config)[p] + n) for p, n in behind.items() if n},
    )
    committed = group_offsets(stack, group, config.topic)
    assert committed == stored(config) == {0: 40, 1: 25, 2: 10, 3: 0}
    kafka_lag = {p: high - committed[p] for p, high in highs(config).items()}
    assert kafka_lag == behind  # the condition struck: the group is behind on three partitions
    report = kspout_lag(toml)
    assert {row["partition"]: row["lag"] for row in report["partitions"]} == kafka_lag
    assert {row["partition"]: row["committed"] for row in report["partitions"]} == committed
    assert report["lag"] == sum(kafka_lag.values()) == 24

"""Chained topologies, exactly once end to end: the example in examples/chained/.

Stage one (trades -> notifications, through `kspout.output.Publish` and `KafkaOutput`) runs on
Spark `local[2]` with the demo's faults, so its timeout replay really runs beside the original.
It is at least once: the test checks that the notifications topic holds duplicates. Stage two
(the dedup bolt keyed on the `kspout.id` header) runs in process and must push every
notification exactly once. Real Kafka, ZooKeeper, Redis and Spark throughout.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from examples.chained.stages import (
    FAULTS,
    inbox,
    produce_trades,
    published,
    pushed,
    stage_one,
    stage_two,
    struck,
)
from kspout.config import TopicConfig
from kspout.devstack import DevStack, KafkaBroker, create_topic
from kspout.driver import Driver, Progress
from kspout.executor.local import LocalExecutor
from kspout.executor.topology import ChainItem
from kspout.kafka import Record
from kspout.output import ID_HEADER, KafkaOutput, Publish, output_id
from kspout.spout import KafkaSpout
from tests.integration.helpers import (
    TopicFactory,
    dead_letter_headers,
    highs,
    produce,
    read_topic,
    stored,
)

TRADES = 400


def run_in_process(config: TopicConfig, chain: ChainItem) -> Progress:
    with Driver(config, LocalExecutor(config, chain)) as driver:
        return driver.run(until_caught_up=True)


def test_output_ids_come_from_the_source_message_and_the_output_index() -> None:
    record = Record("trades", 3, 1742, b"k", b"v", -1, ())

    assert output_id(record) == "trades@3:1742#0"
    assert output_id(record, 2) == "trades@3:1742#2"
    assert output_id(record, 1, source_id="T-7") == "trades/T-7#1"
    # Topic names cannot hold "@", "/" or "#": a source id never reads as an offset form.
    assert output_id(record, 0, source_id="@3:1742") == "trades/@3:1742#0"
    for index in (-1, True, 1.0):
        with pytest.raises(ValueError, match="index"):
            output_id(record, index)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source_id"):
        output_id(record, 0, source_id="")


def test_every_notification_is_pushed_once_although_stage_one_published_duplicates(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    dedup_config: Callable[..., TopicConfig],
    topic_factory: Callable[[str], str],
) -> None:
    # message_timeout: above a cold session's worker start-up, which at 3 s timed out the
    # whole first batch (harmless here, only more duplicates, but it hides the slow trade's).
    upstream = make_config(
        batch_size=50, max_retries=2, message_timeout=5.0, redis={"url": stack.info.redis_url}
    )
    downstream = dedup_config(
        topic=topic_factory("notes"),
        spout_id=f"{upstream.spout_id}-push",
        dedup={"id_source": f"header:{ID_HEADER}"},
    )
    stream = produce_trades(upstream, TRADES)
    assert stream.injected == {"none": TRADES - sum(FAULTS.values()), **FAULTS}
    # Slower than message_timeout, shorter than the 2 x message_timeout that cancels a batch.
    slow = upstream.message_timeout + 2

    one = KafkaSpout(upstream, spark).run(
        stage_one(upstream, downstream.topic, slow), until_caught_up=True
    )

    # Stage one: every fault struck, the slow trade timed out, the poison ones dead-lettered.
    strikes = struck(upstream)
    for kind in ("flaky", "late", "slow"):
        assert strikes[kind] == FAULTS[kind], strikes
    assert strikes["poison"] >= FAULTS["poison"] * 3  # max_retries = 2: three attempts each
    assert one.total("timed_out") >= 1
    assert one.total("dead_lettered") == FAULTS["poison"]
    assert one.total("acked") == TRADES - FAULTS["poison"]
    assert stored(upstream) == highs(upstream)

    # The notifications topic: one id per (user, trade), kept across re-publishes...
    copies = published(downstream)
    ids = {id_ for id_, _ in copies}
    assert {entry for _, entry in copies} == stream.inbox
    assert len(copies) == len(ids) == len(stream.inbox)
    pattern = re.compile(rf"{re.escape(upstream.topic)}@\d+:\d+#[01]")
    assert all(pattern.fullmatch(id_) for id_ in ids)
    # ... and duplicates: what the flaky, late and slow trades published before replaying.
    for (id_, entry), n in copies.items():
        kind = stream.kinds[entry.split(":")[1]]
        first = id_.endswith("#0")  # the buyer's: a late trade failed right after sending it
        if kind in ("flaky", "slow") or (kind == "late" and first):
            assert n >= 2, (id_, entry, kind, n)
    expected_extra = 2 * FAULTS["flaky"] + FAULTS["late"] + 2 * FAULTS["slow"]
    assert copies.total() - len(ids) >= expected_extra

    two = run_in_process(downstream, stage_two(downstream))

    # Stage two: every notification pushed once, every re-published copy a duplicate.
    assert pushed(downstream) == dict.fromkeys(ids, 1)
    assert inbox(downstream) == dict.fromkeys(stream.inbox, 1)
    assert two.total("acked") == len(ids)
    assert two.total("duplicates") == copies.total() - len(ids)
    assert two.total("dead_lettered") == 0
    assert stored(downstream) == highs(downstream)


@dataclass(frozen=True)
class SendAndFlush:
    """A plain handler: one output per record, flushed before it returns."""

    output: KafkaOutput
    value: bytes = b"note"

    def __call__(self, record: Record) -> None:
        self.output.send(record, self.value)
        self.output.flush()


@dataclass(frozen=True)
class SendOne:
    """`Publish`'s function: one output per record (the bolt flushes)."""

    value: bytes = b"note"

    def __call__(self, record: Record, output: KafkaOutput) -> None:
        output.send(record, self.value)


def sending(path: str, output: KafkaOutput, value: bytes) -> ChainItem:
    """The chain that sends one output of `value` per record, as a handler or a bolt."""
    return SendAndFlush(output, value) if path == "handler" else Publish(SendOne(value), output)


@pytest.mark.parametrize("path", ["handler", "bolt"])
def test_an_output_kafka_refuses_fails_its_source_message(
    make_config: Callable[..., TopicConfig],
    topic_factory: TopicFactory,
    producer: Producer,
    stack: DevStack,
    path: str,
) -> None:
    """The output topic takes records of 1,000 bytes at most and each output is 4,000: Kafka
    refuses them (MESSAGE_TOO_LARGE, not an outage), so the source messages fail, are retried
    and end on the dead-letter topic, never acked."""
    config = make_config(max_retries=1)
    produce(producer, config.topic, {0: range(2)})
    notes = topic_factory("notes", partitions=1, config={"max.message.bytes": "1000"})
    output = KafkaOutput(config, notes)

    progress = run_in_process(config, sending(path, output, b"x" * 4000))

    assert progress.total("acked") == 0
    assert progress.total("retried") == 2 and progress.total("dead_lettered") == 2
    errors = {
        h["kspout.source.offset"]: h["kspout.error"]
        for h in dead_letter_headers(config, stack.info.brokers)
    }
    for offset in ("0", "1"):
        assert errors[offset].startswith(f"OutputFailed: 1 output to {notes} not acknowledged")
        assert f"{config.topic}@0:{offset}#0" in errors[offset]
    assert stored(config)[0] == 2
    assert read_topic(stack.info.brokers, notes, expected=1) == []


@pytest.mark.parametrize("path", ["handler", "bolt"])
def test_an_output_kafka_that_is_down_costs_no_attempt(
    make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path, path: str
) -> None:
    """The output goes to a Kafka broker of its own, stopped while the run starts and started
    again 4 s later: the sends it could not take are the infrastructure's fault, so the source
    messages are released (no attempt spent, nothing dead-lettered) until it is back, and then
    acked, each output in the output topic."""
    config = make_config(max_retries=1)
    produce(producer, config.topic, {0: range(2)})
    broker = KafkaBroker(tmp_path)
    broker.start()
    try:
        create_topic(broker.address, "notes", 1)
        broker.stop()
        settings = make_config(brokers=broker.address, fetch_timeout=1.0, kafka={"log_level": 0})
        back = threading.Timer(4.0, broker.start)
        back.start()
        try:
            progress = run_in_process(config, sending(path, KafkaOutput(settings, "notes"), b"n"))
        finally:
            back.join()
        assert progress.total("released") >= 2  # the outage struck every message at least once
        assert progress.total("acked") == 2
        assert progress.total("retried") == 0 and progress.total("dead_lettered") == 0
        assert stored(config)[0] == 2
        notes = read_topic(broker.address, "notes", expected=2)
        sent = {dict(m.headers() or [])[ID_HEADER].decode() for m in notes}
        assert sent == {f"{config.topic}@0:0#0", f"{config.topic}@0:1#0"}
    finally:
        broker.kill()

"""Kafka transactions against the real broker: aborted records never reach user code, an open
transaction makes its partition wait at the last stable offset.

A transactional producer writes committed and aborted transactions between plain records, on
every partition. The test keeps its own ledger of what it committed, aborted and wrote plainly,
and judges what user code saw against it, not against kspout's records: a handler run in
process, and on Spark a bolt chain, a `foreach_batch` frame, the streaming source and a
`spark.read` batch read. The broker keeps Kafka's default `transaction.max.timeout.ms` (15
minutes), and the producers ask for 5, so no transaction is aborted behind a test's back.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from kspout import Fields, KafkaSpout
from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver, Progress
from kspout.executor.local import LocalExecutor
from kspout.executor.topology import ChainItem
from kspout.kafka import Record
from tests.integration.helpers import PARTITIONS, highs, stored, topic_file
from tests.integration.spark_jobs import StoreValue, ValueOf

# Longer than any test here: the broker must not abort an open transaction on its own
# (the broker's `transaction.max.timeout.ms` is Kafka's default, 15 minutes).
TRANSACTION_TIMEOUT_MS = 300_000


@contextmanager
def transactional_producer(brokers: str) -> Iterator[Producer]:
    """A producer with a transactional id of its own, its transactions initialised."""
    producer = Producer(
        {
            "bootstrap.servers": brokers,
            "transactional.id": f"txn-test-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
        }
    )
    producer.init_transactions(30)
    try:
        yield producer
    finally:
        producer.flush(10)


@dataclass
class Ledger:
    """What the test wrote: values it committed or wrote plainly (`kept`, by partition, in
    order) and values it aborted."""

    kept: dict[int, list[bytes]] = field(default_factory=lambda: {p: [] for p in PARTITIONS})
    aborted: set[bytes] = field(default_factory=set)

    def expected(self) -> Counter[bytes]:
        return Counter(v for values in self.kept.values() for v in values)


def send(producer: Producer, topic: str, partition: int, values: list[bytes]) -> None:
    for value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0


def write_interleaved(
    plain: Producer, txn: Producer, topic: str, ledger: Ledger, rounds: int = 4
) -> None:
    """Per round and partition: plain records, a committed transaction, an aborted one (some
    rounds' transactions span every partition at once)."""
    for r in range(rounds):
        for p in PARTITIONS:
            values = [b"plain-%d-%d-%d" % (r, p, i) for i in range(3 + p)]
            send(plain, topic, p, values)
            ledger.kept[p] += values
        txn.begin_transaction()
        committed = {p: [b"commit-%d-%d-%d" % (r, p, i) for i in range(5 + r)] for p in PARTITIONS}
        for p, values in committed.items():
            send(txn, topic, p, values)
        txn.commit_transaction(30)
        for p, values in committed.items():
            ledger.kept[p] += values
        txn.begin_transaction()
        # Odd rounds abort on every partition, even ones on two only.
        aborted_on = PARTITIONS if r % 2 else PARTITIONS[r % 4 // 2 :: 2]
        for p in aborted_on:
            values = [b"abort-%d-%d-%d" % (r, p, i) for i in range(7)]
            send(txn, topic, p, values)
            ledger.aborted.update(values)
        txn.abort_transaction(30)


class Seen:
    """A handler that notes each record's value by partition, in the order handled."""

    def __init__(self) -> None:
        self.values: dict[int, list[bytes]] = {p: [] for p in PARTITIONS}

    def __call__(self, record: Record) -> None:
        assert record.value is not None
        self.values[record.partition].append(record.value)


def assert_clean(progress: Progress) -> None:
    """No timeouts, retries, failures, dead letters or losses in the run."""
    for name in ("timed_out", "retried", "exceptions", "dead_lettered", "lost", "waiting"):
        assert progress.total(name) == 0, (name, progress)
    assert progress.failed_records == 0, progress.failures


def test_aborted_records_never_reach_a_handler_and_their_offsets_finish_as_gaps(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=10)
    ledger = Ledger()
    with transactional_producer(stack.info.brokers) as txn:
        write_interleaved(producer, txn, config.topic, ledger)
    seen = Seen()
    with Driver(config, LocalExecutor(config, seen)) as driver:
        progress = driver.run(until_caught_up=True)

    handled = Counter(v for values in seen.values.values() for v in values)
    assert not set(handled) & ledger.aborted
    assert handled == ledger.expected()  # each kept record exactly once
    assert seen.values == ledger.kept  # in partition order
    assert_clean(progress)
    ends = highs(config)
    assert stored(config) == ends
    records = sum(len(v) for v in ledger.kept.values())
    assert progress.total("acked") == records
    # Every offset not a kept record is a gap: aborted records and transaction markers.
    assert progress.total("gaps") == sum(ends.values()) - records > len(ledger.aborted)


def values(df: DataFrame) -> Counter[bytes]:
    return Counter(row.value for row in df.select("value").collect())


def stream_once(spark: SparkSession, toml: Path, checkpoint: Path) -> Counter[bytes]:
    """One `availableNow` run of the streaming source: the values it read."""
    rows: Counter[bytes] = Counter()
    query = (
        spark.readStream.format("kspout")
        .option("config", str(toml))
        .load()
        .writeStream.foreachBatch(lambda df, _batch: rows.update(values(df)))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow run did not end within 120 s"
    return rows


def test_aborted_records_reach_no_bolt_frame_or_stream_on_spark(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    """One transactional topic read four ways on Spark, each under a spout id of its own: a
    bolt chain, `foreach_batch`, the streaming source and a `spark.read` batch read."""
    config = make_config(batch_size=25)
    ledger = Ledger()
    with transactional_producer(stack.info.brokers) as txn:
        write_interleaved(producer, txn, config.topic, ledger, rounds=2)
    expected = ledger.expected()

    key = f"{config.topic}:values"
    chain: list[ChainItem] = [ValueOf(), Fields("value"), StoreValue(stack.info.redis_url, key)]
    progress = KafkaSpout(config, spark).run(chain, until_caught_up=True)
    assert Counter(redis_client.lrange(key, 0, -1)) == expected
    assert_clean(progress)
    assert stored(config) == highs(config)

    framed = make_config(batch_size=25, spout_id=f"{config.spout_id}-frames")
    frames: Counter[bytes] = Counter()
    progress = KafkaSpout(framed, spark).foreach_batch(
        lambda df, _batch: frames.update(values(df)), until_caught_up=True
    )
    assert frames == expected
    assert_clean(progress)
    assert stored(framed) == highs(framed)

    streamed = make_config(spout_id=f"{config.spout_id}-stream")
    toml = topic_file(tmp_path / "stream.toml", stack, streamed)
    assert stream_once(spark, toml, tmp_path / "checkpoint") == expected
    assert stored(streamed) == highs(streamed)

    read = values(spark.read.format("kspout").option("config", str(toml)).load())
    assert read == expected


def test_the_streaming_source_stops_at_an_open_transaction_and_reads_it_once_committed(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
) -> None:
    config = make_config()
    topic = config.topic
    toml = topic_file(tmp_path / "topic.toml", stack, config)
    before = {p: [b"before-%d-%d" % (p, i) for i in range(5)] for p in PARTITIONS}
    for p, sent in before.items():
        send(producer, topic, p, sent)
    with transactional_producer(stack.info.brokers) as txn:
        txn.begin_transaction()
        pending = [b"open-0-%d" % i for i in range(3)]
        send(txn, topic, 0, pending)
        behind = [b"behind-0-%d" % i for i in range(2)]  # after the LSO: waits with it
        send(producer, topic, 0, behind)

        first = stream_once(spark, toml, tmp_path / "checkpoint")
        assert first == Counter(v for sent in before.values() for v in sent)
        assert stored(config) == {0: 5, 1: 5, 2: 5, 3: 5}

        txn.commit_transaction(30)
    second = stream_once(spark, toml, tmp_path / "checkpoint")
    assert second == Counter(pending + behind)
    assert stored(config) == highs(config)


def status(config_file: Path, *options: str) -> str:
    result = CliRunner().invoke(main, ["status", "--config", str(config_file), *options])
    assert result.exit_code == 0, result.output
    return result.stdout


def until(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.1)


def test_an_open_transaction_holds_its_partition_at_the_lso_without_timeouts(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    # Short timeouts: a span planned past the LSO would time out, be retried and dead-lettered
    # within the seconds this test waits.
    config = make_config(
        batch_size=10, message_timeout=2.0, fetch_timeout=1.0, max_retries=1, metrics={"port": 0}
    )
    topic = config.topic
    ledger = Ledger()
    for p in PARTITIONS:
        values = [b"before-%d-%d" % (p, i) for i in range(20)]
        send(producer, topic, p, values)
        ledger.kept[p] += values
    lso = 20  # partition 0's open transaction begins there
    with transactional_producer(stack.info.brokers) as txn:
        began_ms = int(time.time() * 1000)
        txn.begin_transaction()
        pending = [b"open-0-%d" % i for i in range(5)]
        send(txn, topic, 0, pending)
        sent_ms = int(time.time() * 1000)
        for p in PARTITIONS:  # behind the open transaction on 0, free on the others
            values = [b"after-%d-%d" % (p, i) for i in range(10)]
            send(producer, topic, p, values)
            ledger.kept[p] += values

        seen = Seen()
        latest: list[Progress] = []
        stop = threading.Event()
        driver = Driver(config, LocalExecutor(config, seen), on_progress=latest.append)
        outcome: list[Progress] = []
        with driver:
            runner = threading.Thread(target=lambda: outcome.append(driver.run(stop=stop)))
            runner.start()
            try:
                # The other partitions finish; partition 0 stops at the LSO and says why.
                def held() -> bool:
                    if not latest:
                        return False
                    views = {v.partition: v for v in latest[-1].partitions}
                    return views[0].open_transaction is not None and all(
                        views[p].stats.commit_point == 30 for p in PARTITIONS[1:]
                    )

                until(held, "partitions 1-3 finished and partition 0 held by the transaction")
                waiting = {v.partition: v for v in latest[-1].partitions}[0]
                assert waiting.stats.commit_point == waiting.high == lso
                assert waiting.open_transaction is not None
                assert waiting.open_transaction.stable == lso
                assert waiting.open_transaction.written == lso + 5 + 10
                assert began_ms - 1000 <= waiting.open_transaction.since_ms <= sent_ms
                time.sleep(3 * config.message_timeout)  # long enough for any timeout to fire
                assert_clean(latest[-1])
                assert stored(config) == {0: lso, 1: 30, 2: 30, 3: 30}
                assert seen.values[0] == ledger.kept[0][:lso]
                for p in PARTITIONS[1:]:
                    assert seen.values[p] == ledger.kept[p]

                # The metrics endpoint and `kspout status` say why, and since when.
                url = driver.metrics_url
                assert url is not None
                with urllib.request.urlopen(url, timeout=5) as page:
                    metrics = page.read().decode()
                gauge = {
                    line.split('partition="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith("kspout_open_transaction_since_timestamp_seconds{")
                }
                since_s = waiting.open_transaction.since_ms / 1000
                assert gauge == {"0": since_s, "1": 0.0, "2": 0.0, "3": 0.0}, metrics
                config_file = topic_file(tmp_path / "topic.toml", stack, config)
                found: dict[str, Any] = json.loads(status(config_file, "--json"))
                rows = {row["partition"]: row for row in found["partitions"]}
                assert rows[0]["status"] == "waiting: open transaction"
                assert rows[0]["open_transaction"] == {
                    "stable": lso,
                    "written": lso + 15,
                    "since_ms": waiting.open_transaction.since_ms,
                }
                assert all(rows[p]["open_transaction"] is None for p in PARTITIONS[1:])
                text = status(config_file)
                assert "partition 0 waiting on an open transaction since " in text, text
                assert "offsets 20-34 are written but not committed" in text, text

                # Committed, its records are handled, then the plain ones behind it.
                txn.commit_transaction(30)
                ledger.kept[0][lso:lso] = pending
                until(lambda: seen.values[0] == ledger.kept[0], "partition 0's records handled")
                until(lambda: stored(config)[0] == lso + 5 + 1 + 10, "partition 0 committed")
            finally:
                stop.set()
                runner.join(30)
    [progress] = outcome
    assert_clean(progress)
    assert stored(config) == highs(config)
    assert all(v.open_transaction is None for v in progress.partitions)

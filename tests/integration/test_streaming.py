"""`spark.readStream.format("kspout")` on Spark `local[2]` against the session's Kafka broker,
ZooKeeper and Redis.

Every query runs with `Trigger.AvailableNow` and a checkpoint in the test's directory; the
`spark` fixture's session (made by `kspout.spark.spark_session`) has the source registered.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from confluent_kafka import Producer
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession

from dedup import Effects
from dedup.batch import ExactlyOnce
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.streaming.positions import admit
from tests.integration.helpers import (
    PARTITIONS,
    delete_records,
    highs,
    kspout_command,
    open_store,
    produce,
    stored,
    topic_file,
    value_of,
    watermarks,
)

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def unique_key(partition: int, offset: int) -> bytes:
    """A key for `[dedup] id_source = "key"` that no other message of the topic has."""
    return b"p%d-o%d" % (partition, offset)


def run(
    spark: SparkSession,
    toml: Path,
    checkpoint: Path,
    sink: Callable[[DataFrame, int], None],
    **options: object,
) -> None:
    """One `availableNow` run of the topic file's stream into `sink`, until it ends."""
    reader = spark.readStream.format("kspout").option("config", str(toml))
    for name, value in options.items():
        reader = reader.option(name, str(value))
    query = (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow run did not end within 120 s"


def test_admit_splits_a_limit_in_proportion_to_the_backlogs_exactly() -> None:
    assert admit({0: 10, 1: 20}, None) == {0: 10, 1: 20}
    assert admit({0: 10, 1: 20}, 100) == {0: 10, 1: 20}
    assert admit({0: 100, 1: 100, 2: 100}, 100) == {0: 34, 1: 33, 2: 33}
    assert admit({0: 1, 1: 999}, 10) == {0: 1, 1: 9}  # a small backlog is not rounded away
    assert sum(admit({p: 7 * p + 3 for p in range(9)}, 50).values()) == 50


def test_an_available_now_query_applies_each_message_once_through_a_crash_and_a_restart(
    spark: SparkSession,
    stack: DevStack,
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    config = dedup_config()
    topic = config.topic
    toml = topic_file(tmp_path / "topic.toml", stack, config)
    checkpoint = tmp_path / "checkpoint"
    produce(producer, topic, {p: range(300) for p in PARTITIONS}, key=unique_key)

    def apply(row: Row, effects: Effects) -> None:
        assert row.value == value_of(row.partition, row.offset) and row.timestamp is not None
        effects.sadd(f"{topic}:seen", f"{row.partition}:{row.offset}")
        effects.incrby(f"{topic}:applied", 1)

    once = ExactlyOnce(apply, config)  # keyed by message id: the key
    batches: list[int] = []
    crash = [True]

    def sink(df: DataFrame, batch_id: int) -> None:
        assert df.columns == COLUMNS
        before = once.applied + once.duplicates
        once(df, batch_id)
        batches.append(once.applied + once.duplicates - before)
        if crash:  # the effects are in Redis; Spark's commit log never hears of the batch
            crash.pop()
            raise RuntimeError("crash after the effects, before Spark's commit")

    with pytest.raises(StreamingQueryException, match="crash after the effects"):
        run(spark, toml, checkpoint, sink, maxOffsetsPerTrigger=500)
    run(spark, toml, checkpoint, sink, maxOffsetsPerTrigger=500)

    # The first batch ran twice; its second run found every row done (duplicates).
    assert batches[0] == batches[1] == once.duplicates == 500
    assert max(batches) <= 500 and len(batches) >= 4  # 1,200 offsets at most 500 a batch
    assert once.applied == 1200
    assert redis_client.scard(f"{topic}:seen") == 1200
    assert int(redis_client.get(f"{topic}:applied") or 0) == 1200
    assert stored(config) == highs(config)  # the ZooKeeper copy reached the end

    produce(producer, topic, {p: range(300, 400) for p in PARTITIONS}, key=unique_key)
    run(spark, toml, checkpoint, sink)

    assert (once.applied, once.duplicates) == (1600, 500)  # exactly the new messages
    assert redis_client.scard(f"{topic}:seen") == 1600
    assert int(redis_client.get(f"{topic}:applied") or 0) == 1600
    assert stored(config) == highs(config)


def test_a_checkpointed_offset_that_retention_deleted_follows_the_out_of_range_policy(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
) -> None:
    """Two queries on one topic, one per policy, whose checkpoints stand at offset 20 of
    partition 0 when Kafka deletes it (DeleteRecords, as retention would).

    `earliest`: the planner finds 20 gone, counts [20, low) lost and starts the batch at low;
    the sink then deletes the start of the batch too, before its executor reads it: the
    executor goes on at the new low. `fail`: the query stops, naming the command that moves the
    partition; after it, the query resumes there.
    """
    earliest = make_config(out_of_range="earliest")
    fail = make_config(out_of_range="fail", spout_id=f"{earliest.spout_id}-fail")
    topic = earliest.topic
    tomls = {
        name: topic_file(tmp_path / f"{name}.toml", stack, c, f'out_of_range = "{name}"\n')
        for name, c in (("earliest", earliest), ("fail", fail))
    }
    read: defaultdict[str, list[int]] = defaultdict(list)  # offsets of partition 0, per query
    before_reading: list[Callable[[], None]] = []

    def runs(name: str) -> None:
        def sink(df: DataFrame, batch_id: int) -> None:
            while before_reading:
                before_reading.pop()()
            read[name] += [r.offset for r in df.where("partition = 0").select("offset").collect()]

        run(spark, tomls[name], tmp_path / f"checkpoint-{name}", sink)

    produce(producer, topic, {0: range(20)})
    for name in tomls:
        runs(name)
        assert read.pop(name) == list(range(20))
    produce(producer, topic, {0: range(20, 1520)})
    delete_records(earliest.brokers, topic, {0: 500})
    low, high = watermarks(earliest)[0]
    assert low == 500, "the checkpointed offset was not deleted"

    before_reading.append(lambda: delete_records(earliest.brokers, topic, {0: 900}))
    runs("earliest")
    moved_low = watermarks(earliest)[0][0]
    assert low < moved_low == 900 < high, "the sink did not move low into the batch"
    assert read.pop("earliest") == list(range(moved_low, high))
    with open_store(earliest) as store:
        record = store.read(0)
    assert record is not None and record.offset == high
    assert record.data["kspout"]["lost"] == low - 20  # the planner's count

    command = f"kspout offsets set --config {tomls['fail']} --partition 0 --to earliest"
    with pytest.raises(StreamingQueryException, match=command):
        runs("fail")
    assert read.pop("fail", []) == []
    with open_store(fail) as store:
        record = store.read(0)
    assert record is not None and record.offset == 20 and record.stopped is not None
    argv = [str(kspout_command()), *command.split()[1:]]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)

    runs("fail")  # from its checkpoint: partition 0 resumes where the operator moved it
    low, high = watermarks(fail)[0]
    assert read["fail"] == list(range(low, high))
    with open_store(fail) as store:
        record = store.read(0)
    assert record is not None and record.offset == high and record.stopped is None
    assert record.data["kspout"]["lost"] == low - 20

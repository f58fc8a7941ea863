"""Spark's Kafka-source habits on `format("kspout")`: its option names, `spark.read` batch reads,
and one Kafka schema (with `timestampType`) for streams, batch reads and `foreach_batch`
frames; on Spark `local[2]` against the session's broker.

Every stream runs with `Trigger.AvailableNow` and a checkpoint in the test's directory. Records
are produced with known timestamps, and each read is judged against what the test produced.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.errors import AnalysisException, StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

import kspout
from kspout import KafkaSpout
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.streaming.columns import SCHEMA
from kspout.streaming.errors import ReadStopped
from kspout.streaming.options import WHERE, SourceSettings
from kspout.streaming.planner import StreamPlanner
from tests.integration.helpers import (
    PARTITIONS,
    TopicFactory,
    delete_records,
    topic_file,
    value_of,
)

# partition, offset, key, value, timestamp (ms), timestampType
Seen = tuple[int, int, bytes, bytes, int, int]
COLUMNS = ("partition", "offset", "key", "value", "unix_millis(timestamp)", "timestampType")
# The producer's timestamps: an hour ago, so neither the broker's clock (LogAppendTime) nor
# retention (7 days by default, judged by the records' timestamps) is near them.
T0 = int(time.time() * 1000) - 3_600_000
CREATE_TIME, LOG_APPEND_TIME = 0, 1


def stamp(partition: int, offset: int) -> int:
    return T0 + 1000 * partition + offset


def produce(producer: Producer, topic: str, count: int) -> list[Seen]:
    """`count` records per partition, timestamped by the producer; what a reader should see
    (with CREATE_TIME)."""
    for p in PARTITIONS:
        for o in range(count):
            producer.produce(topic, value_of(p, o), b"k%d" % o, partition=p, timestamp=stamp(p, o))
    assert producer.flush(30) == 0
    return [
        (p, o, b"k%d" % o, value_of(p, o), stamp(p, o), CREATE_TIME)
        for p in PARTITIONS
        for o in range(count)
    ]


def seen(df: DataFrame) -> list[Seen]:
    """The rows of `df` as `Seen`; the frame must have Spark's Kafka source's schema."""
    assert df.schema == SCHEMA
    rows = df.selectExpr(*COLUMNS).collect()
    return [(r[0], r[1], bytes(r[2]), bytes(r[3]), r[4], r[5]) for r in rows]


def stream(spark: SparkSession, options: Mapping[str, object], checkpoint: Path) -> list[Seen]:
    """What one `availableNow` run of `format("kspout")` with `options` reads, sorted."""
    rows: list[Seen] = []
    reader = spark.readStream.format("kspout")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda df, _: rows.extend(seen(df)))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow run did not end within 120 s"
    return sorted(rows)


def batch(spark: SparkSession, options: Mapping[str, object]) -> list[Seen]:
    """What `spark.read.format("kspout")` with `options` reads, sorted."""
    reader = spark.read.format("kspout")
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return sorted(seen(reader.load()))


def where(rows: Iterable[Seen], keep: Callable[[int, int], bool]) -> list[Seen]:
    return sorted(r for r in rows if keep(r[0], r[1]))


def test_spark_option_names_read_what_the_topic_file_reads_in_streams_and_batch_reads(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
) -> None:
    config = make_config()
    topic = config.topic
    produced = produce(producer, topic, 10)
    toml = topic_file(tmp_path / "topic.toml", stack, config, 'out_of_range = "fail"\n')
    spark_options = {
        "kafka.bootstrap.servers": stack.info.brokers,
        "subscribe": topic,
        "failOnDataLoss": "true",
        "kafka.client.id": "spark-habits",  # a librdkafka setting, passed through
    }

    from_file = stream(spark, {"config": toml}, tmp_path / "c-file")
    from_options = stream(
        spark,
        {**spark_options, "startingOffsets": "earliest", "maxOffsetsPerTrigger": 15},
        tmp_path / "c-options",
    )
    assert from_file == from_options == sorted(produced)

    offsets = {topic: {"0": 4, "1": -2, "2": -1}}  # partition 3: `start`, earliest
    by_partition = stream(
        spark,
        {**spark_options, "startingOffsets": json.dumps(offsets)},
        tmp_path / "c-json",
    )
    assert by_partition == where(produced, lambda p, o: {0: o >= 4, 1: True, 2: False, 3: True}[p])

    assert batch(spark, {"config": toml}) == sorted(produced)  # earliest to latest
    ranged = batch(
        spark,
        {
            **spark_options,
            "startingOffsets": json.dumps({topic: {"0": 2, "1": -2, "2": 3, "3": 9}}),
            "endingOffsets": json.dumps({topic: {"0": 7, "1": -1, "2": 3}}),
        },
    )
    assert ranged == where(
        produced,
        lambda p, o: {0: 2 <= o < 7, 1: True, 2: False, 3: o >= 9}[p],
    )
    # The options override the file's keys: here where the read starts.
    assert batch(spark, {"config": toml, "startingOffsets": json.dumps({topic: {"1": 8}})}) == (
        where(produced, lambda p, o: p != 1 or o >= 8)
    )


def test_a_batch_read_from_offsets_kafka_deleted_follows_fail_on_data_loss(
    spark: SparkSession, stack: DevStack, topic_name: str, producer: Producer
) -> None:
    produced = produce(producer, topic_name, 10)
    delete_records(stack.info.brokers, topic_name, {0: 5})
    options = {
        "kafka.bootstrap.servers": stack.info.brokers,
        "subscribe": topic_name,
        "startingOffsets": json.dumps({topic_name: {"0": 2}}),
    }

    with pytest.raises(AnalysisException) as failed:
        batch(spark, {**options, "failOnDataLoss": "true"})
    lines = [line for line in str(failed.value).splitlines() if "ReadStopped:" in line]
    assert len(lines) == 1 and lines[0].endswith(
        f"{topic_name}[0]: offset 2 is out of range; Kafka holds [5, 10). out_of_range = "
        '"fail" (failOnDataLoss true) stops the read: start at 5 or later (startingOffsets), '
        "or set failOnDataLoss to false to read what Kafka holds"
    )
    read = batch(spark, {**options, "failOnDataLoss": "false"})
    assert read == where(produced, lambda p, o: p != 0 or o >= 5)


def test_an_option_that_does_not_map_fails_with_one_line_naming_what_to_use(
    spark: SparkSession, stack: DevStack, topic_name: str, tmp_path: Path
) -> None:
    base = {"kafka.bootstrap.servers": stack.info.brokers, "subscribe": topic_name}

    def load_error(options: Mapping[str, str]) -> str:
        reader = spark.readStream.format("kspout")
        for name, value in {**base, **options}.items():
            reader = reader.option(name, value)
        with pytest.raises(AnalysisException) as failed:
            reader.load()
        return str(failed.value)

    def kspout_line(message: str) -> str:
        """The one line of kspout's error; the traceback Spark adds is one frame long."""
        lines = [line for line in message.splitlines() if "ConfigError:" in line]
        assert len(lines) == 1, message
        assert message.count('File "') <= 1, message
        return lines[0]

    line = kspout_line(load_error({"subscribePattern": "orders.*"}))
    assert line.endswith(
        f"ConfigError: {WHERE}: subscribePattern: kspout reads one topic per source: use "
        "subscribe with one topic, and one query per topic"
    )
    assert "did you mean startingOffsets?" in kspout_line(load_error({"startingOffset": "x"}))
    assert "use startingOffsets" in kspout_line(load_error({"kafka.auto.offset.reset": "x"}))
    assert "subscribe: one topic (got 'a,b')" in kspout_line(load_error({"subscribe": "a,b"}))

    # What only a batch read takes stops a stream when it starts, with the same one line.
    query = (
        spark.readStream.format("kspout")
        .options(**base, endingOffsets="latest")
        .load()
        .writeStream.foreachBatch(lambda df, _: None)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match=r"endingOffsets: spark\.read only"):
        query.awaitTermination(120)
    with pytest.raises(AnalysisException, match="maxOffsetsPerTrigger: streams only") as failed:
        spark.read.format("kspout").options(**base, maxOffsetsPerTrigger="5").load().collect()
    kspout_line(str(failed.value))


def test_timestamp_type_is_create_time_or_log_append_time_in_every_kind_of_frame(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    topic_factory: TopicFactory,
    producer: Producer,
    tmp_path: Path,
) -> None:
    created = make_config()
    appended_topic = topic_factory("append", config={"message.timestamp.type": "LogAppendTime"})
    appended = make_config(topic=appended_topic, spout_id=f"{created.spout_id}-append")
    produced = sorted(produce(producer, created.topic, 5))
    before = int(time.time() * 1000) - 1
    produce(producer, appended.topic, 5)
    after = int(time.time() * 1000) + 1

    def frames(config: TopicConfig) -> list[Seen]:
        rows: list[Seen] = []
        KafkaSpout(config, spark).foreach_batch(
            lambda df, _: rows.extend(seen(df)), until_caught_up=True
        )
        return sorted(rows)

    def options(config: TopicConfig) -> dict[str, str]:
        return {"kafka.bootstrap.servers": config.brokers, "subscribe": config.topic}

    assert frames(created) == produced  # foreach_batch: the producer's time, CreateTime
    assert stream(spark, options(created), tmp_path / "c-created") == produced

    for rows in (
        frames(appended),
        stream(spark, options(appended), tmp_path / "c-appended"),
        batch(spark, options(appended)),
    ):
        assert [(p, o) for p, o, *_ in rows] == [(p, o) for p, o, *_ in produced]
        assert {kind for *_, kind in rows} == {LOG_APPEND_TIME}
        assert all(before <= ms <= after for *_, ms, _ in rows)  # the broker's time


def test_min_offsets_per_trigger_holds_a_batch_back_until_enough_or_the_delay(
    stack: DevStack, topic_name: str, producer: Producer
) -> None:
    """The stream's planner, in fake time: `latest` answers its start (no batch) while fewer
    than minOffsetsPerTrigger offsets wait, unless maxTriggerDelay passed since the last batch."""
    now = [0.0]
    settings = SourceSettings.of(
        {
            "kafka.bootstrap.servers": stack.info.brokers,
            "subscribe": topic_name,
            "minOffsetsPerTrigger": "12",
            "maxTriggerDelay": "30s",
        }
    ).for_stream()

    def add(per_partition: int) -> None:
        for p in PARTITIONS:
            for _ in range(per_partition):
                producer.produce(topic_name, b"v", partition=p)
        assert producer.flush(30) == 0
        now[0] += 1.0  # past the watermarks' throttle

    stopped = partial(ReadStopped, topic_name)
    with StreamPlanner(settings, stopped, zk_copy=False, clock=lambda: now[0]) as planner:
        start = planner.initial()
        assert start.offsets == dict.fromkeys(PARTITIONS, 0)
        add(2)
        start = planner.latest(start, None)  # the first batch never waits
        assert start.offsets == dict.fromkeys(PARTITIONS, 2)
        add(2)
        assert planner.latest(start, None) == start  # 8 < 12: held back
        add(1)
        start = planner.latest(start, None)
        assert start.offsets == dict.fromkeys(PARTITIONS, 5)  # 12: the batch runs
        add(1)
        assert planner.latest(start, None) == start
        now[0] += 30.0
        assert planner.latest(start, None).offsets == dict.fromkeys(PARTITIONS, 6)  # delay passed


def test_a_relative_config_path_is_the_driver_programs_file_not_the_jvms(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark runs the data source in a Python worker of its JVM, which started in another
    directory (the session's); `register` makes a relative path the driver program's."""
    config = make_config()
    produced = produce(producer, config.topic, 3)
    topic_file(tmp_path / "relative.toml", stack, config)
    monkeypatch.chdir(tmp_path)
    jvm_dir = Path(spark.sparkContext._jvm.System.getProperty("user.dir"))
    assert not (jvm_dir / "relative.toml").exists()  # the JVM would not find it
    kspout.register(spark)
    assert batch(spark, {"config": "relative.toml"}) == sorted(produced)

"""kspout on Spark `local[2]` against the session's Kafka broker, ZooKeeper and Redis.

Bolts run in Spark's Python workers (separate processes) and record their effects in Redis;
each test checks those effects, the outcome counts and the commit points in ZooKeeper.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from kspout import Fields, KafkaSpout
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Progress
from kspout.executor.topology import ChainItem
from tests.integration.helpers import PARTITIONS, highs, kspout_command, produce, stored, topic_file
from tests.integration.spark_jobs import (
    ColumnarCount,
    ColumnarSplit,
    Count,
    RecordEffect,
    SlowOnce,
    Split,
)
from tests.integration.word_count import check_word_count, word_count_topic


def test_word_count_with_fields_grouping_retries_failures_and_commits_the_high_watermark(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    per_partition = 750  # 3,000 sentences
    config, url, key = word_count_topic(make_config, producer, stack, per_partition, 400)
    chain: list[ChainItem] = [Split(url), Fields("word"), Count(url, key)]

    progress = KafkaSpout(config, spark).run(chain, until_caught_up=True)

    check_word_count(progress, config, stack, redis_client, per_partition)
    # What the bolts raised in Spark's workers reached the driver, with the bolts' lines: the
    # first stage's through its task results, the last stage's through the merged ledgers.
    kinds = {(f.failure.kind, f.failure.message, f.failure.place) for f in progress.failures}
    assert kinds == {
        ("RuntimeError", "injected: first attempt of a flaky sentence", "spark_jobs.py:56"),
        ("ValueError", "poison word", "spark_jobs.py:71"),
    }
    assert all('spark_jobs.py", line' in f.failure.traceback for f in progress.failures)


def test_columnar_word_count_retries_dead_letters_and_counts_as_the_row_bolts_do(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    """The same job as above with columnar bolts: same counts, dead letters and commits."""
    per_partition = 400
    config, url, key = word_count_topic(make_config, producer, stack, per_partition, 400)
    chain: list[ChainItem] = [ColumnarSplit(url), Fields("word"), ColumnarCount(url, key)]

    progress = KafkaSpout(config, spark).run(chain, until_caught_up=True)

    check_word_count(progress, config, stack, redis_client, per_partition)
    assert {f.failure.message for f in progress.failures} == {
        "injected: first attempt of a flaky sentence",
        "poison word",
    }


def test_only_the_record_past_message_timeout_times_out_not_those_queued_behind_it(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = make_config(batch_size=20, message_timeout=1.5, max_batches_in_flight=2)
    produce(producer, config.topic, {p: range(20) for p in PARTITIONS})

    progress = KafkaSpout(config, spark).run(
        SlowOnce(stack.info.redis_url, seconds=0.2, slowest=(5, 2.5)), until_caught_up=True
    )

    # Partition 0's task spends 0.2 s on each record and 2.5 s on offset 5: 6.3 s in all, far
    # past the 1.5 s timeout. Only offset 5 was ever handled for longer than that.
    assert progress.total("timed_out") == 1
    assert progress.total("acked") == 20 * len(PARTITIONS)
    assert redis_client.scard(f"{config.topic}:done") == 20 * len(PARTITIONS)
    assert stored(config) == highs(config)


def test_foreach_batch_hands_a_dataframe_and_settles_the_batch_as_a_whole(
    spark: SparkSession, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=100, max_retries=3, max_batches_in_flight=3)
    produce(producer, config.topic, {p: range(250) for p in PARTITIONS})
    seen: Counter[tuple[int, int]] = Counter()
    calls: list[int] = []
    running: list[int] = []
    overlaps: list[list[int]] = []

    def per_batch(df: DataFrame, batch_id: int) -> None:
        running.append(batch_id)
        if len(running) > 1:
            overlaps.append(list(running))
        calls.append(batch_id)
        try:
            check(df, batch_id)
        finally:
            running.remove(batch_id)

    def check(df: DataFrame, batch_id: int) -> None:
        assert df.columns == [
            "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"
        ]  # fmt: skip
        rows = df.select("partition", "offset", "value").collect()
        if len(calls) == 2:
            raise RuntimeError("injected: the second batch fails once")
        for row in rows:
            assert row.value == b"p%d-o%d" % (row.partition, row.offset)
            seen[(row.partition, row.offset)] += 1

    progress = KafkaSpout(config, spark).foreach_batch(per_batch, until_caught_up=True)

    assert not overlaps  # one call at a time, as Spark's foreachBatch
    assert calls == list(range(len(calls)))  # in batch order
    assert set(seen) == {(p, o) for p in PARTITIONS for o in range(250)}
    assert progress.total("acked") == 250 * len(PARTITIONS)
    assert progress.total("retried") > 0  # the failed batch's offsets came again
    assert stored(config) == highs(config)
    # What `per_batch` raised, with its place in this file, for each record of the batch.
    [kind] = progress.failures
    failure = kind.failure
    assert failure.kind == "RuntimeError"
    assert failure.message == "injected: the second batch fails once"
    assert failure.place.startswith("test_spark.py:") and kind.records == kind.failures > 0


def test_a_killed_driver_restarts_and_loses_nothing(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(3000) for p in PARTITIONS})
    path = topic_file(tmp_path / "topic.toml", stack, config)
    done = f"{config.topic}:done"
    env = {**os.environ, **stack.info.env()}
    command = [str(kspout_command()), "run", "--config", str(path), "--spark", "local[2]"]
    command += ["--handler", "tests.integration.spark_jobs:record_effect"]
    driver = subprocess.Popen(command, env=env, cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 120
        while redis_client.scard(done) < 2000:  # well into the run, not finished
            assert driver.poll() is None, "the driver exited before it was killed"
            assert time.monotonic() < deadline, "the driver made no progress"
            time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait(30)
    assert redis_client.scard(done) < 3000 * len(PARTITIONS)

    progress = KafkaSpout(config, spark).run(
        RecordEffect(stack.info.redis_url), until_caught_up=True
    )

    assert redis_client.scard(done) == 3000 * len(PARTITIONS)  # every message, none lost
    assert progress.total("acked") > 0
    assert stored(config) == highs(config)


def test_foreach_batch_plans_one_batch_at_a_time(
    spark: SparkSession, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    """A batch planned while another call runs would only wait, its message_timeout running."""
    config = make_config(batch_size=10, max_batches_in_flight=3)
    produce(producer, config.topic, {p: range(30) for p in PARTITIONS})
    finished: list[int] = []
    planned_ahead: list[int] = []

    def slow(df: DataFrame, batch_id: int) -> None:
        time.sleep(0.6)  # the driver reports progress every 0.25 s meanwhile
        finished.append(batch_id)

    def watch(progress: Progress) -> None:
        planned_ahead.append(progress.batches - len(finished))

    progress = KafkaSpout(config, spark).foreach_batch(
        slow, until_caught_up=True, on_progress=watch
    )

    assert planned_ahead and max(planned_ahead) <= 1
    assert progress.total("acked") == 30 * len(PARTITIONS)
    assert stored(config) == highs(config)

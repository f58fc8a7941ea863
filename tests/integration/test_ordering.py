"""`ordering = key` on Spark `local[2]`: records of a key run in order across retries and
batches, other keys proceed, and a hot partition split into two tasks by key hash keeps it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kspout import KafkaSpout
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.errors import ChainError
from tests.integration.helpers import highs, produce, stored
from tests.integration.spark_jobs import InKeyOrder, Split

KEYS = 7
PER_PARTITION = 420


def _key(partition: int, offset: int) -> bytes:
    return b"key-%d-%d" % (partition, offset % KEYS)


def _rank(partition: int, offset: int) -> bytes:
    return b"%d" % (offset // KEYS)


@pytest.mark.parametrize("tasks_per_partition", [1, 2])
def test_records_of_a_key_run_in_order_across_failures_and_batches(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tasks_per_partition: int,
) -> None:
    config = make_config(
        ordering="key",
        max_tasks_per_partition=tasks_per_partition,
        batch_size=60,
        max_batches_in_flight=2,
        max_retries=3,
        defer_delay=0.1,
    )
    partitions = [0, 1]
    produce(
        producer, config.topic, {p: range(PER_PARTITION) for p in partitions}, key=_key, value=_rank
    )

    progress = KafkaSpout(config, spark).run(InKeyOrder(stack.info.redis_url), until_caught_up=True)

    topic = config.topic
    assert redis_client.lrange(f"{topic}:violations", 0, -1) == []
    done = {k.decode(): int(redis_client.get(k) or 0) for k in redis_client.keys(f"{topic}:done:*")}
    assert done == {
        f"{topic}:done:" + _key(p, o).decode(): PER_PARTITION // KEYS
        for p in partitions
        for o in range(KEYS)
    }
    assert progress.total("exceptions") > 0, "the flaky records failed once"
    assert progress.total("deferred") > 0, "later records of their keys waited"
    assert progress.total("dead_lettered") == 0
    assert stored(config) == highs(config)
    tasks = Counter(t.split(b":")[0] for t in redis_client.smembers(f"{topic}:tasks"))
    assert max(tasks.values()) == len(partitions) * tasks_per_partition


def test_ordering_by_key_refuses_a_bolt_chain(
    spark: SparkSession, stack: DevStack, make_config: Callable[..., TopicConfig]
) -> None:
    config = make_config(ordering="key")
    with pytest.raises(ChainError, match="ordering"):
        KafkaSpout(config, spark).run(Split(stack.info.redis_url))

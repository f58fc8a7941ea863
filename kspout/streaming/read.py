"""Executor side of a stream or a `spark.read`: read one partition's range from Kafka.

PySpark runs `read()` in executors' Python workers, so the Kafka consumer is made there: the
worker's cached fetcher (`kspout.executor.fetchers`), shared with `KafkaSpout`'s tasks.
The range is fetched `PER_FETCH` offsets at a time, so a task never holds its whole range.

The driver planned the range from watermarks a moment old; retention can delete its start
before the fetch gets there. Then the partition's `out_of_range` policy applies here, as the
PartitionManager decides it: reading goes on at its new start, and the offsets skipped are
logged with their exact range, in the executor's log only (the driver's count, `lost` in the
ZooKeeper record, does not see them); `fail` stops the query with the reader's error
(`StreamStopped`, `ReadStopped`).
A `timestamp:` policy falls back to `earliest` here (no lookup from executors), never to
`latest`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from kspout.config import TopicConfig
from kspout.errors import KspoutError, PartitionStopped
from kspout.executor.fetchers import fetcher_for
from kspout.partition_manager import PartitionManager
from kspout.streaming.schema import Batch, to_batch

# Offsets per fetch: bounds a task's memory (one fetch's records and their Arrow batch) while
# keeping the per-fetch cost (one consumer re-assignment, ~2.5 ms on loopback) negligible.
PER_FETCH = 10_000


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One Spark task of a batch: offsets `[start, end)` of one Kafka partition."""

    partition: int
    start: int
    end: int


# The error `out_of_range = "fail"` raises: (partition, offset, low, high) -> error.
Stopped = Callable[[int, int, int, int], KspoutError]


def read_range(config: TopicConfig, part: KafkaRange, stopped: Stopped) -> Iterator[Batch]:
    """The records of `part`, as Arrow record batches of Spark's Kafka columns."""
    fetcher = fetcher_for(config)
    at = part.start
    while at < part.end:
        upto = min(part.end, at + PER_FETCH)
        fetched = fetcher.fetch(config.topic, part.partition, [(at, upto)])
        if fetched.records:
            yield to_batch(fetched.records)
        if fetched.out_of_range is None:
            at = upto
            continue
        low, high = fetched.out_of_range
        resumed = _resume_at(config, stopped, part.partition, fetched.reached(at), low, high)
        if resumed is None:
            return
        at = resumed


def _resume_at(
    config: TopicConfig, stopped: Stopped, partition: int, reached: int, low: int, high: int
) -> int | None:
    """Where reading goes on when offset `reached` is outside Kafka's `[low, high)`; None when
    the rest of the range is not in Kafka (at or past its high watermark)."""
    pm = PartitionManager(
        config.partition_policy(), reached, topic=config.topic, partition=partition
    )
    try:
        reset = pm.on_out_of_range(low, high)  # logs the offsets lost, with their range
    except PartitionStopped:
        raise stopped(partition, reached, low, high) from None
    if reset is None or reset.new_start <= reached:
        return None
    return reset.new_start

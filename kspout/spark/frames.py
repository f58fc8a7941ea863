"""`FrameExecutor`: micro-batches as DataFrames for `KafkaSpout.foreach_batch`.

The user's `f(df, batch_id)` runs on the driver; the DataFrame is lazy, and its rows are
fetched from Kafka by executors whenever `f` evaluates it (Spark's Kafka source columns:
key, value, topic, partition, offset, timestamp, headers). The batch is acked as a whole when
`f` returns and failed as a whole, with EXCEPTION, when it raises.

Offsets Kafka no longer had while the batch ran cannot be claimed as processed: after `f`
returns the watermarks are read again, and any planned offset outside `[low, high)` is
reported out of range (handled by the partition's policy) instead of acked.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kspout.config import TopicConfig
from kspout.kafka import KafkaMetadata, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind, describe_error
from kspout.spark.jobs import SparkJobs
from kspout.spark.worker import fetcher_for
from kspout.tasks import PartitionTask, TaskResult

BatchFunction = Callable[[DataFrame, int], object]

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
        StructField("timestamp", TimestampType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _row(record: Record) -> tuple[object, ...]:
    timestamp = (
        _EPOCH + dt.timedelta(milliseconds=record.timestamp) if record.timestamp >= 0 else None
    )
    headers = [Row(key=k, value=v) for k, v in record.headers]
    return (
        record.key,
        record.value,
        record.topic,
        record.partition,
        record.offset,
        timestamp,
        headers,
    )


def fetch_rows(config: TopicConfig, tasks: Iterable[PartitionTask]) -> Iterator[tuple[object, ...]]:
    """Executor side: the rows of the tasks' planned offsets, fetched from Kafka."""
    fetcher = fetcher_for(config)
    for task in tasks:
        fetched = fetcher.fetch(task.topic, task.partition, task.plan.ranges())
        for record in fetched.records:
            yield _row(record)


class FrameExecutor(SparkJobs):
    """Runs `f(df, batch_id)` per micro-batch and settles the batch by its outcome.

    Calls of `f` never overlap and come in batch order, as with Spark's `foreachBatch`: batches
    run one at a time, in the order submitted, whatever `max_batches_in_flight` says (the
    spout's driver also plans only one at a time for this executor). `batch_id` numbers the
    batches of this run (from 0); it is not kept across restarts, so an idempotent writer
    should key on the offsets in the frame, not on `batch_id`.
    """

    def __init__(self, spark: SparkSession, config: TopicConfig, function: BatchFunction) -> None:
        super().__init__(spark, config.model_copy(update={"max_batches_in_flight": 1}))
        self._function = function
        self._metadata = KafkaMetadata(config)

    def _start(self) -> None:
        self._metadata.start()

    def close(self, *, cancel: bool = False) -> None:
        super().close(cancel=cancel)
        self._metadata.close()

    def frame(self, tasks: Sequence[PartitionTask]) -> DataFrame:
        """The batch's records as a lazy DataFrame."""
        sc = self._spark.sparkContext
        rows = sc.parallelize(list(tasks), len(tasks)).mapPartitions(
            partial(fetch_rows, self._config)
        )
        return self._spark.createDataFrame(rows, SCHEMA)

    def _run(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        try:
            self._function(self.frame(tasks), batch)
        except Exception as exc:
            error = describe_error(exc)
            return [_settled(task, error=error) for task in tasks]
        return [self._acked(task) for task in tasks]

    def _acked(self, task: PartitionTask) -> TaskResult:
        """Ack the task's offsets that Kafka still has; report any it lost meanwhile."""
        low, high = self._metadata.watermarks(task.topic, task.partition)
        return _settled(task, low=low, high=high)


def _settled(
    task: PartitionTask, *, error: str | None = None, low: int = 0, high: int = 0
) -> TaskResult:
    """A whole task failed with `error`, or acked within Kafka's `[low, high)`.

    Planned offsets outside `[low, high)` were not in the DataFrame `f` saw (retention deleted
    them, or the log was truncated below them): they are reported out of range, never acked.
    """
    outcomes: list[Outcome] = []
    lost = False
    for span in task.plan.spans:
        start, end = span.start, span.end
        if error is not None:
            reason = FailReason.EXCEPTION
            outcomes.append(
                Outcome(start, OutcomeKind.FAIL, span.attempt, reason, error, end - start)
            )
            continue
        start, end = max(start, low), min(end, high)
        lost = lost or (start, end) != (span.start, span.end)
        if start < end:
            outcomes.append(Outcome(start, OutcomeKind.ACK, span.attempt, count=end - start))
    out_of_range = (low, high) if lost else None
    return TaskResult(task.topic, task.partition, task.plan.epoch, outcomes, out_of_range)

"""`FrameExecutor`: micro-batches as DataFrames for `KafkaSpout.foreach_batch`.

The user's `f(df, batch_id)` runs on the driver; the DataFrame is lazy, and its rows are
fetched from Kafka by executors whenever `f` evaluates it, with the columns of Spark's Kafka
source (`kspout.streaming.columns`). The batch is failed as a whole, with EXCEPTION, when `f`
raises. When `f` returns, only what the frame held is acked:

* Every evaluation of the frame reports, per partition, what its fetch did not return, through
  a Spark accumulator: the planned offsets it stopped before when Kafka answered out of range
  (retention moved the low watermark past them, or they lie at or above high), the offsets
  Kafka does not have inside `[low, high)` (compaction, transaction markers), and the `(low,
  high)` it saw. An offset counts as received only when every evaluation fetched it. The
  report also names the leader epoch of the highest record fetched, which the task result
  carries to the driver as `KafkaSpout.run`'s tasks do: an unclean leader election that
  truncated the log is found by it (`kspout.driver.truncation`), not taken for out of range.
* Received offsets are acked (as counted runs, at their planned attempt); offsets Kafka does
  not have are GONE; offsets a fetch stopped before get no outcome (they stay unfinished) and
  the task reports `out_of_range=(low, high)`, so the driver applies the partition's
  `out_of_range` policy, which counts those below the new start as lost with their exact
  ranges.
* A partition no evaluation reported on (`f` never evaluated the frame, or read only a few
  rows: Spark may stop a task early for `limit`/`take`/`show`, and its report is lost then)
  is settled as before: the watermarks are read again after `f` returns, planned offsets
  inside `[low, high)` are acked and any outside it reported out of range.
* A fetch Kafka refused the principal (Read revoked mid-run) hands on no rows and reports the
  refusal: whatever `f` did, the batch is released, no attempt spent, and the run stops with
  the refusal (`KafkaRefused`), since no retry cures it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

from pyspark.accumulators import Accumulator, AccumulatorParam
from pyspark.sql import DataFrame, SparkSession

from kspout.config import TopicConfig
from kspout.contract import PartitionTask, TaskResult
from kspout.errors import KafkaRefused
from kspout.executor.fetchers import fetcher_for
from kspout.executor.task import CUT_SHORT, released
from kspout.kafka import FetchResult, KafkaMetadata
from kspout.outcomes import (
    FailReason,
    Failure,
    FailureCatalog,
    Outcome,
    OutcomeKind,
    describe_error,
)
from kspout.ranges import Range, intersect, runs, subtract, union
from kspout.spark.jobs import SparkJobs
from kspout.streaming.columns import SCHEMA, to_row

BatchFunction = Callable[[DataFrame, int], object]


@dataclass(frozen=True, slots=True)
class FrameReport:
    """What evaluations of a frame fetched of one partition's planned offsets: what they did
    not return, and the leader epoch of the highest record.

    * `cut`: planned offsets a fetch stopped before because Kafka answered out of range; they
      were neither returned nor known missing.
    * `missing`: planned offsets Kafka does not have inside `[low, high)` (compacted away,
      transaction markers).
    * `bounds`: Kafka's `(low, high)` as the cut fetches saw it (None when none was cut).
    * `refused`: what Kafka refused the principal, when a fetch was refused (nothing fetched).
    * `leader_epoch`: `(position, epoch)` of the highest record fetched
      (`FetchResult.leader_epoch`), None when no fetch returned one.

    Merging is a union (and the larger low and high, the higher epoch), so a report counted
    twice (a retried Spark task, an evaluation repeated) changes nothing.
    """

    cut: tuple[Range, ...] = ()
    missing: tuple[Range, ...] = ()
    bounds: tuple[int, int] | None = None
    refused: KafkaRefused | None = None
    leader_epoch: tuple[int, int] | None = None

    @classmethod
    def of(cls, spans: Sequence[tuple[int, int]], fetched: FetchResult) -> FrameReport:
        """What one fetch of `spans` (sorted, disjoint ranges) did not return, and its epoch."""
        missing = union(fetched.missing)
        epoch = fetched.leader_epoch
        if fetched.out_of_range is None:  # every requested offset was returned or is missing
            return cls((), missing, None, leader_epoch=epoch)
        got = union(runs(record.offset for record in fetched.records), missing)
        cut = tuple((lo, hi) for lo, hi, _ in subtract(spans, got))
        return cls(cut, missing, fetched.out_of_range, leader_epoch=epoch)

    def merge(self, other: FrameReport) -> FrameReport:
        """What neither evaluation missed is what both fetched: the union of the rest."""
        if self.bounds is None or other.bounds is None:
            bounds = self.bounds or other.bounds
        else:
            bounds = (max(self.bounds[0], other.bounds[0]), max(self.bounds[1], other.bounds[1]))
        epochs = [e for e in (self.leader_epoch, other.leader_epoch) if e is not None]
        return FrameReport(
            union(self.cut, other.cut),
            union(self.missing, other.missing),
            bounds,
            self.refused or other.refused,
            max(epochs, default=None),
        )


# Keyed by (batch, partition): one accumulator serves every batch of a FrameExecutor.
FrameReports = dict[tuple[int, int], FrameReport]


class FrameReportsParam(AccumulatorParam[FrameReports]):
    """Merges the `FrameReport`s of a frame's evaluations, per batch and partition."""

    def zero(self, value: FrameReports) -> FrameReports:
        return {}

    def addInPlace(self, value1: FrameReports, value2: FrameReports) -> FrameReports:
        for key, report in value2.items():
            known = value1.get(key)
            value1[key] = report if known is None else known.merge(report)
        return value1


def fetch_rows(
    config: TopicConfig,
    reports: Accumulator[FrameReports],
    batch: int,
    tasks: Iterable[PartitionTask],
) -> Iterator[tuple[object, ...]]:
    """Executor side: the rows of the tasks' planned offsets, fetched from Kafka.

    What each fetch did not return is added to `reports` before any row is handed on, so the
    report does not depend on how many rows Spark then reads.
    """
    fetcher = fetcher_for(config)
    for task in tasks:
        spans = task.plan.ranges()
        try:
            fetched = fetcher.fetch(task.topic, task.partition, spans)
        except KafkaRefused as exc:  # raised, it would fail the job and lose the report
            reports.add({(batch, task.partition): FrameReport(refused=exc)})
            continue
        reports.add({(batch, task.partition): FrameReport.of(spans, fetched)})
        for record in fetched.records:
            yield to_row(record)


class FrameExecutor(SparkJobs):
    """Runs `f(df, batch_id)` per micro-batch and settles the batch by its outcome.

    Calls of `f` never overlap and come in batch order, as with Spark's `foreachBatch`: batches
    run one at a time, in the order submitted, whatever `max_batches_in_flight` says (the
    spout's driver also plans only one at a time for this executor). `batch_id` numbers the
    batches of this run (from 0); it is not kept across restarts, so an idempotent writer
    should key on the offsets in the frame, not on `batch_id`.

    When `f` returns, each partition is settled by what every evaluation of the frame fetched
    (`settle_fetched`): offsets a fetch did not return are never acked. When no evaluation
    reported on a partition (`f` never evaluated the frame, or only read a few rows of it),
    the planned offsets Kafka still holds per a fresh watermark query are acked, and any
    outside the watermarks reported out of range. When `f` raises, every planned offset fails
    with EXCEPTION.
    """

    def __init__(self, spark: SparkSession, config: TopicConfig, function: BatchFunction) -> None:
        super().__init__(spark, config.model_copy(update={"max_batches_in_flight": 1}))
        self._function = function
        self._metadata = KafkaMetadata(config)
        self._reports = spark.sparkContext.accumulator({}, FrameReportsParam())

    def _start(self) -> None:
        self._metadata.start()

    def close(self, *, cancel: bool = False) -> None:
        super().close(cancel=cancel)
        self._metadata.close()

    def frame(self, tasks: Sequence[PartitionTask], batch: int) -> DataFrame:
        """The batch's records as a lazy DataFrame; its evaluations report under `batch`."""
        sc = self._spark.sparkContext
        rows = sc.parallelize(list(tasks), len(tasks)).mapPartitions(
            partial(fetch_rows, self._config, self._reports, batch)
        )
        return self._spark.createDataFrame(rows, SCHEMA)

    def _run(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        failure: Failure | None = None
        try:
            self._function(self.frame(tasks, batch), batch)
        except Exception as exc:
            failure = FailureCatalog().of(exc)
        finally:
            reports = self._take_reports(batch)
        for refusal in (r.refused for r in reports.values() if r.refused is not None):
            return [released(task, describe_error(refusal), refusal) for task in tasks]
        if failure is not None:
            return [_settled(task, failure=failure) for task in tasks]
        results: list[TaskResult] = []
        for task in tasks:
            report = reports.get(task.partition)
            results.append(self._acked(task) if report is None else settle_fetched(task, report))
        return results

    def _take_reports(self, batch: int) -> dict[int, FrameReport]:
        """This batch's reports by partition, removed (with any late ones of earlier batches)."""
        value = self._reports.value
        # Jobs `f` left running could still add reports from Spark's accumulator thread:
        # copy first (a dict copy is atomic), then remove only what was taken.
        snapshot = dict(value)
        for key in snapshot:
            if key[0] <= batch:
                value.pop(key, None)
        return {p: report for (b, p), report in snapshot.items() if b == batch}

    def _acked(self, task: PartitionTask) -> TaskResult:
        """Ack the task's offsets that Kafka still has; report any it lost meanwhile."""
        low, high = self._metadata.watermarks(task.topic, task.partition)
        return _settled(task, low=low, high=high)


def settle_fetched(task: PartitionTask, report: FrameReport) -> TaskResult:
    """A task whose frame `f` evaluated and returned from, settled by what was fetched.

    Planned offsets every evaluation fetched are acked (counted runs at their span's attempt);
    missing ones are GONE; cut ones are RELEASED (no attempt spent: `f` never saw them), and
    the result carries `out_of_range=report.bounds` for the partition's out-of-range
    policy, which decides what becomes of them. The leader epoch of the highest record goes
    with the result, so the driver checks it before it applies these outcomes.
    """
    spans = task.plan.spans
    ranges = [(span.start, span.end) for span in spans]
    outcomes: list[Outcome] = []
    skipped = union(report.cut, report.missing)
    for lo, hi, i in subtract(ranges, skipped):
        outcomes.append(Outcome(lo, OutcomeKind.ACK, spans[i].attempt, count=hi - lo))
    for lo, hi, i in intersect(ranges, report.missing):
        outcomes.append(Outcome(lo, OutcomeKind.GONE, spans[i].attempt, count=hi - lo))
    cut = [(lo, hi) for lo, hi, _ in subtract(report.cut, report.missing)]
    for lo, hi, i in intersect(ranges, cut):
        outcomes.append(
            Outcome(lo, OutcomeKind.RELEASED, spans[i].attempt, error=CUT_SHORT, count=hi - lo)
        )
    outcomes.sort(key=lambda outcome: outcome.offset)
    return TaskResult(
        task.topic,
        task.partition,
        task.plan.generation,
        outcomes,
        report.bounds,
        leader_epoch=report.leader_epoch,
    )


def _settled(
    task: PartitionTask, *, failure: Failure | None = None, low: int = 0, high: int = 0
) -> TaskResult:
    """A whole task failed with what `f` raised (`failure`), or acked within Kafka's
    `[low, high)`.

    The second is for a task no evaluation of the frame reported on, with the watermarks read
    after `f` returned: planned offsets outside `[low, high)` are no longer in Kafka (retention
    deleted them, or the log was truncated below them), so they are reported out of range,
    never acked.
    """
    outcomes: list[Outcome] = []
    lost = False
    for span in task.plan.spans:
        start, end = span.start, span.end
        if failure is not None:
            reason, error = FailReason.EXCEPTION, failure.description
            outcomes.append(
                Outcome(start, OutcomeKind.FAIL, span.attempt, reason, error, end - start, failure)
            )
            continue
        start, end = max(start, low), min(end, high)
        lost = lost or (start, end) != (span.start, span.end)
        if start < end:
            outcomes.append(Outcome(start, OutcomeKind.ACK, span.attempt, count=end - start))
    out_of_range = (low, high) if lost else None
    return TaskResult(task.topic, task.partition, task.plan.generation, outcomes, out_of_range)


# -- ranges: sorted, disjoint, half-open ---------------------------------------------------------

"""What runs inside Spark's Python workers: fetch, run the chain's stages, report outcomes.

Each Python worker keeps its own `PartitionFetcher` (`kspout.executor.fetchers`); everything
else a task needs (the config, the plan, the bolts, the driver's channel address) arrives
pickled with the task.

Every task reports to the driver while it runs (`TaskReporter`): which root it is on and for
how long, and for a plain handler the offsets it settled so far; results are sent over the
channel as soon as they exist. A task never raises for a failure outside per-message code (a
fetch, a bolt's prepare/cleanup/execute_batch): it reports the infrastructure error instead,
so its partition is retried without spending the messages' attempts. A task that Spark runs
again because its previous attempt died reports just that (`attempt_died`), so the driver can
isolate the record that kills workers instead of letting Spark replay it into the same crash.

Between stages, items are `(target, payload)` pairs; `target` is the Spark partition the next
stage reads them in. A payload is a `Chunk` of tuples for the next stage's bolts (an
`ArrowChunk` after a columnar bolt: Arrow columns and numpy arrays), or a `Ledger`: part of the
batch's ack bookkeeping for one Kafka partition, merged at the end. A task sends one chunk per
receiving task and one ledger per Kafka partition, each a few lists of plain values or arrays:
Spark pickles a few large objects per task, not one per tuple.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from pyspark import TaskContext as SparkTaskContext

from kspout.acker import Acker, Ids, Ints, Mark, Note, RootState, xor_runs
from kspout.bolts import Chunk, RootKey, TaskContext
from kspout.channel.reporter import TaskReporter
from kspout.columnar import ArrowChunk, join_chunks
from kspout.config import TopicConfig
from kspout.contract import ChannelAddress, PartitionTask, TaskId, TaskResult
from kspout.executor.fetchers import fetcher_for
from kspout.executor.task import refused_by_kafka, released, run_task
from kspout.executor.topology import (
    FetchReport,
    StageFailed,
    Topology,
    fetch_input,
    first_input,
    partition_results,
    run_guarded,
    run_later_stage,
    runner_for,
    task_results,
)
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.outcomes import describe_error


@dataclass(frozen=True, slots=True)
class Ledger:
    """Ack values and marks of some roots of one Kafka partition, plus what its fetch found.

    Columns: `values[i]` is the ack value of the root at `offsets[i]` (arrays of machine
    integers, which pickle as one block of bytes); `marks` lists the few marked roots.
    """

    partition: int
    offsets: array[int]
    values: array[int]
    marks: tuple[tuple[int, int, Note | None], ...]  # (offset, mark, error)
    report: FetchReport | None = None

    @classmethod
    def cut(cls, acker: Acker[RootKey]) -> dict[int, Ledger]:
        """`acker` cut into one ledger per Kafka partition, its columns built at once in
        numpy (no reports: `_ledgers` adds them)."""
        partitions, offsets, values = acker.root_columns()
        marks: dict[int, list[tuple[int, int, Note | None]]] = {}
        for (partition, offset), mark, error in acker.marked():
            marks.setdefault(partition, []).append((offset, int(mark), error))
        found = set(np.unique(partitions).tolist())
        cut = {}
        for partition in found | marks.keys():
            mine = slice(None) if found == {partition} else partitions == partition
            cut[partition] = cls(
                partition,
                _array("q", offsets[mine]),
                _array("Q", values[mine]),
                tuple(marks.get(partition, ())),
            )
        return cut

    @staticmethod
    def merge(parts: Sequence[Ledger]) -> MergedLedger:
        """The parts of one partition's bookkeeping as one ledger: the values XORed per
        offset all at once in numpy, then the marks, in order."""
        offsets = np.concatenate([np.frombuffer(part.offsets, np.int64) for part in parts])
        values = np.concatenate([np.frombuffer(part.values, np.uint64) for part in parts])
        if len(offsets):
            order = np.argsort(offsets, kind="stable")
            offsets, values = offsets[order], values[order]
            starts, values = xor_runs(offsets[1:] != offsets[:-1], values)
            offsets = offsets[starts]
        marked: Acker[int] = Acker()
        for part in parts:
            for offset, mark, error in part.marks:
                marked.mark(offset, Mark(mark), error)
        roots = np.fromiter(marked.values, np.int64, len(marked.values))
        at = np.searchsorted(offsets, roots)  # where each marked root's value is, if it has one
        held = at < len(offsets)
        held[held] = offsets[at[held]] == roots[held]
        marked.values.update(zip(roots[held].tolist(), values[at[held]].tolist(), strict=True))
        return MergedLedger(offsets, values, marked)


@dataclass(frozen=True, slots=True)
class MergedLedger:
    """One partition's ledger merged from its parts (`Ledger.merge`): every root's ack value
    as columns, `offsets` ascending and each once, and the marked roots apart, as a small
    `Acker` (their marks, errors and values). It settles in numpy, with no Python object per
    unmarked root but those it hands back complete."""

    offsets: Ints
    values: Ids
    marked: Acker[int]

    def settled(self) -> tuple[list[int], list[tuple[int, RootState, Note | None]]]:
        """`Acker.settled`: the complete roots (ascending here), and the marked ones with
        their states and errors."""
        _, marked = self.marked.settled()
        complete = self.values == 0
        if marked:
            roots = np.fromiter((root for root, _, _ in marked), np.int64, len(marked))
            complete &= ~np.isin(self.offsets, roots)
        return self.offsets[complete].tolist(), marked


def _array(code: str, column: np.ndarray[Any, Any]) -> array[int]:
    """A numpy column as the `array` a `Ledger` pickles (one block of bytes)."""
    result = array(code)
    result.frombytes(column.tobytes())
    return result


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """Everything a task of one micro-batch needs, shipped to executors once per job."""

    config: TopicConfig
    topology: Topology
    batch: int
    partitions: tuple[int, ...]  # the Kafka partitions in the batch; index = combine target
    channel: ChannelAddress | None = None  # where the driver listens for beats

    def target_of(self, partition: int) -> int:
        """The Spark partition where a Kafka partition's ledgers are merged."""
        return self.partitions.index(partition)

    def reporter(self, stage: int, index: int, partition: int | None = None) -> TaskReporter:
        """The beat sender for one task of this batch."""
        return TaskReporter(self.channel, TaskId(self.batch, stage, index), partition)


Item = tuple[int, Chunk | ArrowChunk | Ledger]


def _retried() -> bool:
    """True when Spark runs this task again because an earlier attempt of it died."""
    context = SparkTaskContext.get()
    return context is not None and context.attemptNumber() > 0


def _died(task: PartitionTask) -> TaskResult:
    return TaskResult(task.topic, task.partition, task.plan.generation, [], attempt_died=True)


def handler_tasks(
    spec: BatchSpec, index: int, tasks: Iterable[PartitionTask]
) -> Iterator[TaskResult]:
    """The fast path for a plain function: no tuple tracking, acks as counted runs."""
    handler = spec.topology.handler
    assert handler is not None
    for task in tasks:
        if _retried():
            yield _died(task)
            continue
        # A slice of a split partition speaks only once its siblings are in: its result is
        # merged with theirs on the driver, and none of them streams acks for the others.
        whole = task.keys is None or task.keys.slices == 1
        with spec.reporter(0, index, task.partition) as reporter:
            try:
                fetcher = fetcher_for(spec.config)
            except Exception as exc:
                result = released(task, describe_error(exc), refused_by_kafka(exc))
            else:
                result = run_task(fetcher, task, handler, reporter.fetched if whole else None)
            if whole:
                reporter.final([result])
        yield result


def single_stage_tasks(
    spec: BatchSpec, index: int, tasks: Iterable[PartitionTask]
) -> Iterator[TaskResult]:
    """A chain without groupings: each task sees every tuple of its roots and settles them."""
    for task in tasks:
        if _retried():
            yield _died(task)
            continue
        with spec.reporter(0, index, task.partition) as reporter:
            acker, _, report = _stage_zero(spec, index, task, last=True)
            results = task_results([task], acker, [report])
            reporter.final(results)
        yield from results


def first_stage(spec: BatchSpec, index: int, tasks: Iterable[PartitionTask]) -> Iterator[Item]:
    """Stage 0 of a chain with groupings: fetch, run, route tuples onward, ship the ledger."""
    for task in tasks:
        if _retried():  # the merge step sees the report and settles the partition as died
            report = FetchReport(task.partition, (), None, attempt_died=True)
            yield from _ledgers(spec, Acker(), {task.partition: report})
            continue
        with spec.reporter(0, index, task.partition):
            acker, output, report = _stage_zero(spec, index, task, last=False)
        yield from _routed(spec, 1, output)
        yield from _ledgers(spec, acker, {task.partition: report})


def _stage_zero(
    spec: BatchSpec, index: int, task: PartitionTask, *, last: bool
) -> tuple[Acker[RootKey], Chunk | ArrowChunk, FetchReport]:
    """Fetch a task's records and run the chain's first stage on them.

    A failure outside per-message code discards the task's ledger and output: its report
    carries the error and every root of the task is released.
    """
    acker: Acker[RootKey] = Acker()
    nothing = Chunk(())
    context = TaskContext(spec.config.topic, 0, index, spec.batch)
    stage = spec.topology.stages[0]
    with cyclic_gc_paused_until_built() as built:
        try:
            fetcher = fetcher_for(spec.config)
            fetched = fetch_input(spec.topology, fetcher, task)
        except Exception as exc:
            return Acker(), nothing, FetchReport.failed(task.partition, exc)
        roots = first_input(spec.topology, fetched, acker)
        built()
        try:
            runner = run_guarded(roots, lambda: runner_for(stage, acker, context, last=last))
        except StageFailed as failed:
            report = FetchReport(task.partition, (), None, failed.error, refused=failed.refused)
            return Acker(), nothing, report
    return acker, runner.chunk, FetchReport.of(task.partition, fetched)


def later_stage(spec: BatchSpec, stage: int, index: int, items: Iterable[Item]) -> Iterator[Item]:
    """Stage `stage` >= 1: run the bolts on the tuples routed here; pass ledgers through."""
    acker: Acker[RootKey] = Acker()
    context = TaskContext(spec.config.topic, stage, index, spec.batch)
    stages = spec.topology.stages
    last = stage == len(stages) - 1
    passing: list[Item] = []
    parts: list[Chunk | ArrowChunk] = []
    with cyclic_gc_paused_until_built() as built:
        for item in items:  # unpickling builds a few objects per tuple, all kept
            if isinstance(item[1], Ledger):
                passing.append(item)
            else:
                parts.append(item[1])
        tuples = join_chunks(stages[stage - 1].bolts[-1].outputs, parts)
        built()
        with spec.reporter(stage, index):
            output = run_later_stage(
                tuples, acker, lambda: runner_for(stages[stage], acker, context, last=last)
            )
    if not last:
        yield from _routed(spec, stage + 1, output)
    yield from passing
    yield from _ledgers(spec, acker, {})


def _routed(spec: BatchSpec, stage: int, output: Chunk | ArrowChunk) -> Iterator[Item]:
    """A stage's output cut by the next stage's grouping: one chunk per receiving task."""
    grouping = spec.topology.stages[stage].grouping
    assert grouping is not None
    for target, chunk in enumerate(grouping.split(output, len(spec.partitions))):
        if len(chunk):
            yield target, chunk


def combine(
    spec: BatchSpec, tasks: Sequence[PartitionTask], index: int, items: Iterable[Item]
) -> Iterator[TaskResult]:
    """Merge the ledgers routed here and settle their partitions' roots."""
    parts: dict[int, list[Ledger]] = {}
    reports: list[FetchReport] = []
    for _, ledger in items:
        assert isinstance(ledger, Ledger)
        parts.setdefault(ledger.partition, []).append(ledger)
        if ledger.report is not None:
            reports.append(ledger.report)
    ledgers = {partition: Ledger.merge(group) for partition, group in parts.items()}
    mine = [task for task in tasks if task.partition in ledgers]
    with spec.reporter(len(spec.topology.stages), index) as reporter:
        results = partition_results(mine, ledgers, reports)
        reporter.final(results)
    yield from results


def _ledgers(
    spec: BatchSpec, acker: Acker[RootKey], reports: dict[int, FetchReport]
) -> Iterator[Item]:
    """Split a task's ledger by Kafka partition, each headed for its merge target."""
    parts = Ledger.cut(acker)
    for partition in reports.keys() - parts.keys():
        parts[partition] = Ledger(partition, array("q"), array("Q"), ())
    for partition, part in parts.items():
        yield spec.target_of(partition), replace(part, report=reports.get(partition))

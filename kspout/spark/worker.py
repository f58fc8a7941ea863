"""What runs inside Spark's Python workers: fetch, run the chain's stages, report outcomes.

Kafka consumers do not pickle, so each Python worker keeps its own `PartitionFetcher`, made on
first use and reused by every later task the worker runs. Everything else a task needs (the
config, the plan, the bolts, the driver's channel address) arrives pickled with the task.

Every task reports to the driver while it runs (`TaskReporter`): which root it is on and for
how long, and for a plain handler the offsets it settled so far; results are sent over the
channel as soon as they exist. A task never raises for a failure outside per-message code (a
fetch, a bolt's prepare/cleanup/execute_batch): it reports the infrastructure error instead,
so its partition is retried without spending the messages' attempts. A task that Spark runs
again because its previous attempt died reports just that (`attempt_died`), so the driver can
isolate the record that kills workers instead of letting Spark replay it into the same crash.

Between stages, items are `(target, payload)` pairs; `target` is the Spark partition the next
stage reads them in. A payload is a `Tuple` for the next stage's bolts, or a `Ledger`: part of
the batch's ack bookkeeping for one Kafka partition, merged at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from pyspark import TaskContext as SparkTaskContext

from kspout.acker import Acker, Mark
from kspout.bolts import RootKey, TaskContext, Tuple
from kspout.channel.messages import TaskId
from kspout.channel.reporter import ChannelAddress, TaskReporter
from kspout.config import TopicConfig
from kspout.kafka import PartitionFetcher
from kspout.outcomes import describe_error
from kspout.tasks import PartitionTask, TaskResult, released, run_task
from kspout.topology import (
    FetchReport,
    StageFailed,
    StageRunner,
    Topology,
    root_tuples,
    run_guarded,
    run_later_stage,
    task_results,
)

_fetchers: dict[str, PartitionFetcher] = {}


def fetcher_for(config: TopicConfig) -> PartitionFetcher:
    """This worker's fetcher for the config's cluster, started on first use."""
    key = repr((config.brokers, sorted(config.kafka_config().items())))
    fetcher = _fetchers.get(key)
    if fetcher is None:
        fetcher = PartitionFetcher(config)
        fetcher.start()
        _fetchers[key] = fetcher
    return fetcher


@dataclass(frozen=True, slots=True)
class Ledger:
    """Ack values and errors of some roots of one Kafka partition, plus what its fetch found."""

    partition: int
    entries: list[tuple[int, int, Mark, str | None]]  # (offset, ack value, mark, error)
    report: FetchReport | None = None


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


Item = tuple[int, Tuple | Ledger]


def _retried() -> bool:
    """True when Spark runs this task again because an earlier attempt of it died."""
    context = SparkTaskContext.get()
    return context is not None and context.attemptNumber() > 0


def _died(task: PartitionTask) -> TaskResult:
    return TaskResult(task.topic, task.partition, task.plan.epoch, [], attempt_died=True)


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
                result = released(task, describe_error(exc))
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
    grouping = spec.topology.stages[1].grouping
    assert grouping is not None
    width = len(spec.partitions)
    for task in tasks:
        if _retried():  # the merge step sees the report and settles the partition as died
            report = FetchReport(task.partition, (), None, attempt_died=True)
            yield from _ledgers(spec, Acker(), {task.partition: report})
            continue
        with spec.reporter(0, index, task.partition):
            acker, output, report = _stage_zero(spec, index, task, last=False)
        for tuple_ in output:
            yield grouping.route(tuple_, width), tuple_
        yield from _ledgers(spec, acker, {task.partition: report})


def _stage_zero(
    spec: BatchSpec, index: int, task: PartitionTask, *, last: bool
) -> tuple[Acker[RootKey], list[Tuple], FetchReport]:
    """Fetch a task's records and run the chain's first stage on them.

    A failure outside per-message code discards the task's ledger and output: its report
    carries the error and every root of the task is released.
    """
    acker: Acker[RootKey] = Acker()
    try:
        fetched = fetcher_for(spec.config).fetch(task.topic, task.partition, task.plan.ranges())
    except Exception as exc:
        return Acker(), [], FetchReport.failed(task.partition, exc)
    context = TaskContext(spec.config.topic, 0, index, spec.batch)
    stage = spec.topology.stages[0]
    roots = root_tuples(fetched, acker)
    try:
        runner = run_guarded(roots, lambda: StageRunner(stage, acker, context, last=last))
    except StageFailed as failed:
        return Acker(), [], FetchReport(task.partition, (), None, failed.error)
    return acker, runner.output, FetchReport.of(task.partition, fetched)


def later_stage(spec: BatchSpec, stage: int, index: int, items: Iterable[Item]) -> Iterator[Item]:
    """Stage `stage` >= 1: run the bolts on the tuples routed here; pass ledgers through."""
    acker: Acker[RootKey] = Acker()
    context = TaskContext(spec.config.topic, stage, index, spec.batch)
    stages = spec.topology.stages
    last = stage == len(stages) - 1
    width = len(spec.partitions)
    passing: list[Item] = []
    tuples: list[Tuple] = []
    for item in items:
        if isinstance(item[1], Tuple):
            tuples.append(item[1])
        else:
            passing.append(item)
    with spec.reporter(stage, index):
        output = run_later_stage(
            tuples, lambda: StageRunner(stages[stage], acker, context, last=last)
        )
    if not last:
        grouping = stages[stage + 1].grouping
        assert grouping is not None
        for tuple_ in output:
            yield grouping.route(tuple_, width), tuple_
    yield from passing
    yield from _ledgers(spec, acker, {})


def combine(
    spec: BatchSpec, tasks: Sequence[PartitionTask], index: int, items: Iterable[Item]
) -> Iterator[TaskResult]:
    """Merge the ledgers routed here and settle their partitions' roots."""
    acker: Acker[RootKey] = Acker()
    reports: list[FetchReport] = []
    partitions: set[int] = set()
    for _, ledger in items:
        assert isinstance(ledger, Ledger)
        partitions.add(ledger.partition)
        p = ledger.partition
        for offset, value, mark, error in ledger.entries:
            acker.add((p, offset), value, mark, error)
        if ledger.report is not None:
            reports.append(ledger.report)
    mine = [task for task in tasks if task.partition in partitions]
    with spec.reporter(len(spec.topology.stages), index) as reporter:
        results = task_results(mine, acker, reports)
        reporter.final(results)
    yield from results


def _ledgers(
    spec: BatchSpec, acker: Acker[RootKey], reports: dict[int, FetchReport]
) -> Iterator[Item]:
    """Split a task's ledger by Kafka partition, each headed for its merge target."""
    split: dict[int, list[tuple[int, int, Mark, str | None]]] = {p: [] for p in reports}
    for (partition, offset), value, mark, error in acker.entries():
        split.setdefault(partition, []).append((offset, value, mark, error))
    for partition, entries in split.items():
        yield spec.target_of(partition), Ledger(partition, entries, reports.get(partition))

"""What runs inside Spark's Python workers: fetch, run the chain's stages, report outcomes.

Kafka consumers do not pickle, so each Python worker keeps its own `PartitionFetcher`, made on
first use and reused by every later task the worker runs. Everything else a task needs (the
config, the plan, the bolts) arrives pickled with the task.

Between stages, items are `(target, payload)` pairs; `target` is the Spark partition the next
stage reads them in. A payload is a `Tuple` for the next stage's bolts, or a `Ledger`: part of
the batch's ack bookkeeping for one Kafka partition, merged at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from kspout.acker import Acker, Mark
from kspout.bolts import RootKey, TaskContext, Tuple
from kspout.config import TopicConfig
from kspout.kafka import PartitionFetcher
from kspout.tasks import PartitionTask, TaskResult, run_task
from kspout.topology import (
    FetchReport,
    StageRunner,
    Topology,
    run_first_stage,
    run_stage,
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

    def target_of(self, partition: int) -> int:
        """The Spark partition where a Kafka partition's ledgers are merged."""
        return self.partitions.index(partition)


Item = tuple[int, Tuple | Ledger]


def handler_tasks(spec: BatchSpec, tasks: Iterable[PartitionTask]) -> Iterator[TaskResult]:
    """The fast path for a plain function: no tuple tracking, acks as counted runs."""
    handler = spec.topology.handler
    assert handler is not None
    fetcher = fetcher_for(spec.config)
    for task in tasks:
        yield run_task(fetcher, task, handler)


def single_stage_tasks(
    spec: BatchSpec, index: int, tasks: Iterable[PartitionTask]
) -> Iterator[TaskResult]:
    """A chain without groupings: each task sees every tuple of its roots and settles them."""
    for task in tasks:
        acker, _, report = _stage_zero(spec, index, task, last=True)
        yield from task_results([task], acker, [report])


def first_stage(spec: BatchSpec, index: int, tasks: Iterable[PartitionTask]) -> Iterator[Item]:
    """Stage 0 of a chain with groupings: fetch, run, route tuples onward, ship the ledger."""
    grouping = spec.topology.stages[1].grouping
    assert grouping is not None
    width = len(spec.partitions)
    for task in tasks:
        acker, output, report = _stage_zero(spec, index, task, last=False)
        for tuple_ in output:
            yield grouping.route(tuple_, width), tuple_
        yield from _ledgers(spec, acker, {task.partition: report})


def _stage_zero(
    spec: BatchSpec, index: int, task: PartitionTask, *, last: bool
) -> tuple[Acker[RootKey], list[Tuple], FetchReport]:
    """Fetch a task's records and run the chain's first stage on them."""
    fetched = fetcher_for(spec.config).fetch(task.topic, task.partition, task.plan.ranges())
    acker: Acker[RootKey] = Acker()
    context = TaskContext(spec.config.topic, 0, index, spec.batch)
    runner = StageRunner(spec.topology.stages[0], acker, context, last=last)  # prepares bolts
    try:
        run_first_stage(fetched, runner, acker)
    finally:
        runner.close()
    return (
        acker,
        runner.output,
        FetchReport.of(task.partition, fetched),
    )


def later_stage(spec: BatchSpec, stage: int, index: int, items: Iterable[Item]) -> Iterator[Item]:
    """Stage `stage` >= 1: run the bolts on the tuples routed here; pass ledgers through."""
    acker: Acker[RootKey] = Acker()
    context = TaskContext(spec.config.topic, stage, index, spec.batch)
    stages = spec.topology.stages
    last = stage == len(stages) - 1
    runner = StageRunner(stages[stage], acker, context, last=last)
    width = len(spec.partitions)
    passing: list[Item] = []

    def tuples() -> Iterator[Tuple]:
        for item in items:
            if isinstance(item[1], Tuple):
                yield item[1]
            else:
                passing.append(item)

    try:
        run_stage(tuples(), runner)
    finally:
        runner.close()
    if not last:
        grouping = stages[stage + 1].grouping
        assert grouping is not None
        for tuple_ in runner.output:
            yield grouping.route(tuple_, width), tuple_
    yield from passing
    yield from _ledgers(spec, acker, {})


def combine(
    spec: BatchSpec, tasks: Sequence[PartitionTask], items: Iterable[Item]
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
    yield from task_results(mine, acker, reports)


def _ledgers(
    spec: BatchSpec, acker: Acker[RootKey], reports: dict[int, FetchReport]
) -> Iterator[Item]:
    """Split a task's ledger by Kafka partition, each headed for its merge target."""
    split: dict[int, list[tuple[int, int, Mark, str | None]]] = {p: [] for p in reports}
    for (partition, offset), value, mark, error in acker.entries():
        split.setdefault(partition, []).append((offset, value, mark, error))
    for partition, entries in split.items():
        yield spec.target_of(partition), Ledger(partition, entries, reports.get(partition))

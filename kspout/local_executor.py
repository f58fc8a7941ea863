"""The in-process executor: runs micro-batches in the driver's own process, one at a time.

What `kspout run` uses without Spark. It keeps one `PartitionFetcher` for its lifetime, as a
Spark Python worker keeps one cached consumer. A chain with groupings runs its stages one after
another over the whole batch: with a single task per stage, every grouping holds trivially.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial

from kspout.acker import Acker
from kspout.bolts import ROOT_FIELDS, Chunk, RootKey, TaskContext
from kspout.channel.reporter import ChannelAddress
from kspout.config import TopicConfig
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.kafka import PartitionFetcher
from kspout.ordering import check_runs_in_order
from kspout.tasks import PartitionTask, TaskResult, run_task
from kspout.topology import (
    ChainItem,
    FetchReport,
    StageFailed,
    StageRunner,
    Topology,
    root_tuples,
    run_guarded,
    run_later_stage,
    task_results,
)


class LocalExecutor:
    """Runs each submitted batch to completion before `submit` returns."""

    def __init__(
        self, config: TopicConfig, chain: Topology | ChainItem | Sequence[ChainItem]
    ) -> None:
        self._config = config
        self._topology = chain if isinstance(chain, Topology) else Topology.of(chain)
        check_runs_in_order(config.ordering, per_record=self._topology.handler is not None)
        self._fetcher = PartitionFetcher(config)
        self._started = False
        self._batches = 0

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Run the batch now; the returned future is already done."""
        if not self._started:
            self._topology.start()
            self._fetcher.start()
            self._started = True
        future: Future[list[TaskResult]] = Future()
        try:
            future.set_result(self._run(tasks))
        except Exception as exc:  # a fetch failure fails the batch, not the driver
            future.set_exception(exc)
        self._batches += 1
        return future

    def cancel(self, batch: int) -> None:
        """Nothing to cancel: a batch has finished by the time `submit` returns."""

    def channel_host(self) -> str | None:
        """In-process batches send no beats (they finish inside `submit`)."""
        return None

    def attach(self, address: ChannelAddress) -> None:
        """Nothing to attach: see `channel_host`."""

    def close(self, *, cancel: bool = False) -> None:
        """Close the fetcher (batches run inside `submit`, so none is ever left running)."""
        self._fetcher.close()
        self._started = False

    def _run(self, tasks: Sequence[PartitionTask]) -> list[TaskResult]:
        handler = self._topology.handler
        if handler is not None:
            return [run_task(self._fetcher, task, handler) for task in tasks]
        acker: Acker[RootKey] = Acker()
        with cyclic_gc_paused_until_built() as built:
            roots, reports = self._roots(tasks, acker)
            built()
            try:
                output = run_guarded(roots, lambda: self._runner(0, acker)).chunk
            except StageFailed as failed:
                reports = [
                    r if r.infra_error else FetchReport(r.partition, (), None, failed.error)
                    for r in reports
                ]
                return task_results(tasks, acker, reports)
            for stage in range(1, len(self._topology.stages)):
                output = run_later_stage(output, acker, partial(self._runner, stage, acker))
        return task_results(tasks, acker, reports)

    def _roots(
        self, tasks: Sequence[PartitionTask], acker: Acker[RootKey]
    ) -> tuple[Chunk, list[FetchReport]]:
        """Every task's records as root tuples registered with `acker`, and what each fetch
        found; a failed fetch releases its partition's offsets (its report says so)."""
        roots = Chunk(ROOT_FIELDS)
        reports: list[FetchReport] = []
        for task in tasks:
            try:
                fetched = self._fetcher.fetch(task.topic, task.partition, task.plan.ranges())
            except Exception as exc:  # the partition's offsets are released, not failed
                reports.append(FetchReport.failed(task.partition, exc))
                continue
            roots.rows.extend(root_tuples(fetched, acker).rows)
            reports.append(FetchReport.of(task.partition, fetched))
        return roots, reports

    def _runner(self, stage: int, acker: Acker[RootKey]) -> StageRunner:
        context = TaskContext(self._config.topic, stage, 0, self._batches)
        last = stage == len(self._topology.stages) - 1
        return StageRunner(self._topology.stages[stage], acker, context, last=last)

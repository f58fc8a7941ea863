"""The in-process executor: runs micro-batches in the driver's own process, on one thread.

What `kspout run` uses without Spark. Batches run one after another on a worker thread, so the
driver loop keeps turning while one runs: its tasks beat and stream their outcomes over the
outcome channel as Spark's do (live progress, per-message timeouts, the instance's heartbeat,
metrics), and `stop_soon` ends a plain handler's batch at its next record. It keeps one
`PartitionFetcher` for its lifetime, as a Spark Python worker keeps one cached consumer. A chain
with groupings runs its stages one after another over the whole batch: with a single task per
stage, every grouping holds trivially.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from functools import partial

from kspout.acker import Acker
from kspout.bolts import ROOT_FIELDS, Chunk, RootKey, TaskContext
from kspout.channel.reporter import TaskReporter
from kspout.config import TopicConfig
from kspout.contract import ChannelAddress, PartitionTask, TaskId, TaskResult
from kspout.executor.task import run_task
from kspout.executor.topology import (
    ChainItem,
    FetchReport,
    Runner,
    StageFailed,
    Topology,
    root_tuples,
    run_guarded,
    run_later_stage,
    runner_for,
    task_results,
)
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.kafka import PartitionFetcher
from kspout.ordering import check_runs_in_order

_Job = tuple[int, Sequence[PartitionTask], Future[list[TaskResult]]]


class LocalExecutor:
    """Runs submitted batches in order on one daemon thread; `submit` returns at once.

    States: idle (no thread) -> running (`submit` started the topology, the fetcher and the
    thread) -> stopping (`stop_soon`: a plain handler's task releases the records it has not
    started) -> closed (`close`: the thread ends after its batch; with `cancel`, at once, and
    a batch still running is abandoned: its offsets are not committed and run again later).
    """

    def __init__(
        self, config: TopicConfig, chain: Topology | ChainItem | Sequence[ChainItem]
    ) -> None:
        self._config = config
        self._topology = chain if isinstance(chain, Topology) else Topology.of(chain)
        check_runs_in_order(config.ordering, per_record=self._topology.handler is not None)
        self._fetcher = PartitionFetcher(config)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._address: ChannelAddress | None = None

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Queue the batch for the worker thread; its future ends with the batch."""
        if self._thread is None:
            self._topology.start()
            self._fetcher.start()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._work, name=f"kspout-local-{self._config.topic}", daemon=True
            )
            self._thread.start()
        future: Future[list[TaskResult]] = Future()
        self._jobs.put((batch, tasks, future))
        return future

    def cancel(self, batch: int) -> None:
        """A thread cannot be killed: a batch stuck in user code keeps running (Spark kills
        its worker instead); records after it still time out one by one."""

    def stop_soon(self) -> None:
        """A plain handler's tasks release the records they have not started; a bolt chain
        finishes its batch."""
        self._stop.set()

    def channel_host(self) -> str | None:
        """Tasks beat to a listener on the loopback interface."""
        return "127.0.0.1"

    def attach(self, address: ChannelAddress) -> None:
        self._address = address

    def close(self, *, cancel: bool = False) -> None:
        """Stop the thread after the batch in hand (`cancel`: without waiting for it), then
        close the fetcher (an abandoned batch's thread, a daemon, dies with the process)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            if cancel:
                self._stop.set()
            self._jobs.put(None)
            if not cancel:
                thread.join()
            if thread.is_alive():
                return  # it still uses the fetcher
        self._fetcher.close()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            batch, tasks, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._run(batch, tasks))
            except BaseException as exc:  # a fetch failure fails the batch, not the driver
                future.set_exception(exc)

    def _reporter(self, batch: int, partition: int | None) -> TaskReporter:
        return TaskReporter(self._address, TaskId(batch, 0, 0), partition)

    def _run(self, batch: int, tasks: Sequence[PartitionTask]) -> list[TaskResult]:
        handler = self._topology.handler
        if handler is not None:
            results = []
            for task in tasks:
                with self._reporter(batch, task.partition) as reporter:
                    results.append(
                        run_task(self._fetcher, task, handler, reporter.fetched, self._stop)
                    )
            return results
        with self._reporter(batch, None):
            return self._run_chain(batch, tasks)

    def _run_chain(self, batch: int, tasks: Sequence[PartitionTask]) -> list[TaskResult]:
        acker: Acker[RootKey] = Acker()
        with cyclic_gc_paused_until_built() as built:
            roots, reports = self._roots(tasks, acker)
            built()
            try:
                output = run_guarded(roots, lambda: self._runner(0, acker, batch)).chunk
            except StageFailed as failed:
                reports = [
                    r
                    if r.infra_error
                    else FetchReport(r.partition, (), None, failed.error, refused=failed.refused)
                    for r in reports
                ]
                return task_results(tasks, acker, reports)
            for stage in range(1, len(self._topology.stages)):
                runner = partial(self._runner, stage, acker, batch)
                output = run_later_stage(output, acker, runner)
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

    def _runner(self, stage: int, acker: Acker[RootKey], batch: int) -> Runner:
        context = TaskContext(self._config.topic, stage, 0, batch)
        last = stage == len(self._topology.stages) - 1
        return runner_for(self._topology.stages[stage], acker, context, last=last)

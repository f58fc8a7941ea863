"""What both Spark executors share: batches run as Spark jobs from a pool of driver threads.

Spark accepts jobs from several threads at once, so each submitted batch runs in its own
thread, at most `max_batches_in_flight` together, and `submit` returns its future at once.
Each batch is its own Spark job group, so the driver can cancel one stuck batch (Spark kills
its tasks, and with them a Python worker stuck in user code) without touching the others.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.contract import ChannelAddress, PartitionTask, TaskResult


class BatchCancelled(Exception):
    """The batch was cancelled before its Spark job started."""

    def __init__(self, batch: int) -> None:
        super().__init__(f"batch {batch} was cancelled before it started")
        self.batch = batch


class SparkJobs:
    """Base of the Spark executors: subclasses implement `_run(tasks, batch)`."""

    def __init__(self, spark: SparkSession, config: TopicConfig) -> None:
        self._spark = spark
        self._config = config
        self._pool = ThreadPoolExecutor(
            max_workers=config.max_batches_in_flight, thread_name_prefix="kspout-batch"
        )
        self._prefix = f"kspout-{config.topic}-{id(self):x}"
        self._running: set[int] = set()
        self._cancelled: set[int] = set()  # cancelled before their job started
        self._lock = threading.Lock()
        self._started = False

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Start the batch's Spark job in the background; the future holds its results."""
        if not self._started:
            self._start()
            self._started = True
        return self._pool.submit(self._job, list(tasks), batch)

    def cancel(self, batch: int) -> None:
        """Cancel the batch's job group: Spark kills its running tasks; its future fails."""
        with self._lock:
            if batch not in self._running:
                self._cancelled.add(batch)
                return
        self._spark.sparkContext.cancelJobGroup(self._group(batch))

    def stop_soon(self) -> None:
        """Nothing to do: a job runs to its end (`close(cancel=True)` stops it)."""

    def channel_host(self) -> str | None:
        """No beats by default (see `SparkExecutor`)."""
        return None

    def attach(self, address: ChannelAddress) -> None:
        """Nothing to do for an executor that sends no beats."""

    def _start(self) -> None:
        """Connect what the executor needs on the driver, once, before the first batch."""

    def close(self, *, cancel: bool = False) -> None:
        """Wait for running jobs, or with `cancel` stop them in Spark and return at once; the
        SparkSession stays up (it may be the user's)."""
        if cancel:
            with self._lock:
                running = list(self._running)
            for batch in running:
                self.cancel(batch)
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)

    def _group(self, batch: int) -> str:
        return f"{self._prefix}-{batch}"

    def _job(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        description = f"kspout {self._config.topic} batch {batch}"
        sc = self._spark.sparkContext
        sc.setJobGroup(self._group(batch), description, interruptOnCancel=True)
        with self._lock:
            if batch in self._cancelled:
                self._cancelled.discard(batch)
                raise BatchCancelled(batch)
            self._running.add(batch)
        try:
            return self._run(tasks, batch)
        finally:
            with self._lock:
                self._running.discard(batch)

    def _run(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        raise NotImplementedError

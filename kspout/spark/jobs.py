"""What both Spark executors share: batches run as Spark jobs from a pool of driver threads.

Spark accepts jobs from several threads at once, so each submitted batch runs in its own
thread, at most `max_batches_in_flight` together, and `submit` returns its future at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.tasks import PartitionTask, TaskResult


class SparkJobs:
    """Base of the Spark executors: subclasses implement `_run(tasks, batch)`."""

    def __init__(self, spark: SparkSession, config: TopicConfig) -> None:
        self._spark = spark
        self._config = config
        self._pool = ThreadPoolExecutor(
            max_workers=config.max_batches_in_flight, thread_name_prefix="kspout-batch"
        )
        self._batches = itertools.count()
        self._group = f"kspout-{config.topic}-{id(self):x}"  # every job of this executor
        self._started = False

    def submit(self, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Start the batch's Spark job in the background; the future holds its results."""
        if not self._started:
            self._start()
            self._started = True
        return self._pool.submit(self._job, list(tasks), next(self._batches))

    def _start(self) -> None:
        """Connect what the executor needs on the driver, once, before the first batch."""

    def close(self, *, cancel: bool = False) -> None:
        """Wait for running jobs, or with `cancel` stop them in Spark and return at once; the
        SparkSession stays up (it may be the user's)."""
        if cancel:
            self._spark.sparkContext.cancelJobGroup(self._group)
        self._pool.shutdown(wait=not cancel, cancel_futures=cancel)

    def _job(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        description = f"kspout {self._config.topic} batch {batch}"
        self._spark.sparkContext.setJobGroup(self._group, description, interruptOnCancel=True)
        return self._run(tasks, batch)

    def _run(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        raise NotImplementedError

"""The in-process executor: runs partition tasks in the driver's own process, one at a time.

What `kspout run` uses without Spark. It keeps one `PartitionFetcher` for its lifetime, as a
Spark Python worker keeps one cached consumer.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from kspout.config import TopicConfig
from kspout.kafka import PartitionFetcher
from kspout.tasks import Handler, PartitionTask, TaskResult, run_task


class LocalExecutor:
    """Runs each submitted batch to completion before `submit` returns."""

    def __init__(self, config: TopicConfig, handler: Handler) -> None:
        self._handler = handler
        self._fetcher = PartitionFetcher(config)
        self._started = False

    def submit(self, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Run the batch now; the returned future is already done."""
        if not self._started:
            self._fetcher.start()
            self._started = True
        future: Future[list[TaskResult]] = Future()
        try:
            future.set_result([run_task(self._fetcher, t, self._handler) for t in tasks])
        except Exception as exc:  # a fetch failure fails the batch, not the driver
            future.set_exception(exc)
        return future

    def close(self) -> None:
        self._fetcher.close()
        self._started = False

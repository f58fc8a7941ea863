"""What runs next: a group of suspects alone, or the next plan of every partition that may run.

A group waiting in isolation goes first, limited to what is still open in it. Otherwise every
partition that may run now is planned up to its high watermark (one batched query refreshes
them all): due retries and new offsets, with the suspects among them carved out to run alone.
A partition whose next offsets left Kafka goes through its `out_of_range` policy first, after
its leader-epoch anchor is validated (`truncation`): a truncated log is rolled back, not skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kspout.config import TopicConfig
from kspout.contract import PartitionTask
from kspout.driver.breaker import BreakerState
from kspout.driver.isolation import Isolation, Suspects
from kspout.driver.out_of_range import OutOfRangeHandler
from kspout.driver.owned import OwnedPartition
from kspout.driver.truncation import TruncationCheck
from kspout.driver.watermarks import WatermarkCache
from kspout.ordering import KeyOrder, blockers_of
from kspout.outcomes import describe_error
from kspout.partition_manager import PartitionManager, Plan, Span


class Planner:
    """Plans the next batch's tasks from the driver's partitions.

    `suspended()` says the claims are unsure (ZooKeeper away, `zk_outage.py`): nothing is
    planned, not even suspects to run alone;
    `running(partition)` says a task of the partition is still out (with `ordering = key`, a
    record in flight is never overtaken).
    """

    def __init__(
        self,
        config: TopicConfig,
        partitions: Mapping[int, OwnedPartition],
        isolation: Isolation,
        watermarks: WatermarkCache,
        out_of_range: OutOfRangeHandler,
        truncation: TruncationCheck,
        suspended: Callable[[], bool],
        running: Callable[[int], bool],
    ) -> None:
        self._config = config
        self._partitions = partitions
        self._isolation = isolation
        self._watermarks = watermarks
        self._out_of_range = out_of_range
        self._truncation = truncation
        self._suspended = suspended
        self._running = running

    def next(self) -> tuple[list[PartitionTask], Suspects | None]:
        """The next batch's tasks (none: nothing to run now), and the group it runs alone."""
        if self._suspended():
            return [], None
        group = self._isolation.next()
        if group is None:
            return self._plan(), None
        task = self._isolated(group)
        return ([] if task is None else [task]), group

    def _isolated(self, group: Suspects) -> PartitionTask | None:
        """The task that runs `group` alone, limited to what is still open in it."""
        part = self._partitions.get(group.partition)
        if part is None or part.manager.generation != group.generation:
            return None
        pm = part.manager
        spans = tuple(
            Span(lo, hi, span.attempt)
            for span in group.spans
            for lo, hi in pm.unsettled(span.start, span.end, span.attempt)
        )
        if not spans:
            return None
        return self._task(group.partition, Plan(spans, group.generation), pm)

    def _task(self, p: int, plan: Plan, pm: PartitionManager) -> PartitionTask:
        """The task for `plan`; with `ordering = key`, with the offsets that can hold back
        its records' keys (kspout.ordering)."""
        if self._config.ordering == "none":
            return PartitionTask(self._config.topic, p, plan)
        ranges = plan.ranges()
        blockers = blockers_of(pm.unfinished_below(ranges[-1][1]), ranges)
        return PartitionTask(self._config.topic, p, plan, KeyOrder(blockers))

    def _runnable(self) -> list[OwnedPartition]:
        """The partitions to plan now: running (not stopped, paused or moving away); with
        `ordering = key`, the last task over (a record in flight is never overtaken); and the
        breaker lets them run (a half-open one only while its probe batch is not out yet)."""
        keyed = self._config.ordering != "none"
        running = self._running
        return [
            part
            for p, part in self._partitions.items()
            if part.runnable and not (keyed and running(p)) and part.breaker.allow()
        ]

    def _plan(self) -> list[PartitionTask]:
        tasks: list[PartitionTask] = []
        runnable = self._runnable()
        # One batched watermark query for every partition that needs fresh ones.
        failed = self._watermarks.refresh(
            {part.number: part.manager.emitted_to for part in runnable}
        )
        known = self._watermarks.known
        unanswered = self._truncation.check(
            (part, known(part.number)[1]) for part in runnable if part.number not in failed
        )
        for part in runnable:
            p, pm, breaker = part.number, part.manager, part.breaker
            if p in failed:  # no leader, broker down: this partition waits
                breaker.failure(describe_error(failed[p]))
                continue
            if p in unanswered:
                continue  # a leader-epoch check got no answer: its breaker opened
            low, high = known(p)
            self._out_of_range.check(part, low, high)
            if part.stopped is not None:
                continue
            plan = pm.plan(high, self._config.batch_size)
            if not plan:
                if breaker.state is BreakerState.HALF_OPEN:
                    breaker.success()  # nothing to probe with: the next batch is the probe
                continue
            plan, alone = self._isolation.carve(p, plan)
            self._isolation.queue_front(alone)
            if plan:
                tasks.append(self._task(p, plan, pm))
        return tasks

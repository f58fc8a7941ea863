"""What the driver shows of itself: a snapshot per partition and for the whole run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kspout.driver.breaker import BreakerState, BreakerView
from kspout.driver.commits import Committer
from kspout.driver.failure_log import FailureSummary
from kspout.driver.owned import OwnedPartition, PartitionState
from kspout.driver.watermarks import WatermarkCache
from kspout.driver.window import StallWatch
from kspout.kafka.transactions import OpenTransaction
from kspout.partition_manager import OutOfRangeReset, Stats
from kspout.zk.record import now_ms
from kspout.zk.registry import InstanceRegistry

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PartitionView:
    """One partition as the driver last saw it."""

    partition: int
    stats: Stats
    low: int
    high: int
    committed: int | None  # the offset last written to ZooKeeper
    breaker: BreakerView | None = None  # None while its dependencies answer
    stopped: str | None = None  # why `out_of_range = "fail"` stopped it
    stalls: int = 0  # times its commit point stood still for half the replay window
    stuck_for: float | None = None  # seconds it has stood still with unfinished offsets above
    paused: bool = False  # an operator paused it (`kspout pause`)
    releasing: bool = False  # assigned to another instance: finishing what runs, then released
    # Driver clock when its record was last written (claim, commit, operator move): the
    # metrics endpoint's commit age.
    committed_at: float | None = None
    # The open transaction it waits on, caught up to its last stable offset (`TransactionWatch`)
    open_transaction: OpenTransaction | None = None

    @property
    def lag(self) -> int:
        """Offsets Kafka holds that are not finished yet."""
        return max(0, self.high - self.stats.commit_point)

    @property
    def status(self) -> str:
        """`running`, `stopped`, `paused`, `releasing`, or the breaker's state (`open`,
        `half-open`)."""
        if self.stopped is not None:
            return "stopped"
        if self.paused or self.releasing:
            return "paused" if self.paused else "releasing"
        return self.breaker.state.value if self.breaker is not None else "running"


@dataclass(slots=True)
class Progress:
    """A snapshot for progress displays and the final report."""

    topic: str
    batches: int
    elapsed: float
    partitions: list[PartitionView]
    resets: list[tuple[int, OutOfRangeReset]] = field(default_factory=list)
    batch_errors: int = 0  # jobs that failed (a worker died, or Spark could not run them)
    cancelled: int = 0  # batches cancelled because every task left in them was stuck
    isolation_runs: int = 0  # jobs that ran suspect records alone
    instance: str = ""  # this driver's instance id (its node under `instances/`)
    commits_refused: int = 0  # commits refused: another instance (or an operator) owned it
    partitions_dropped: int = 0  # partitions dropped after this instance lost them
    # What user code raised, by kind (type, message, place), the most frequent first.
    failures: list[FailureSummary] = field(default_factory=list)
    zookeeper_away: float | None = None  # seconds ZooKeeper has been away; None: it answers

    @property
    def failed_records(self) -> int:
        """Records that failed for their own fault (user code raised or failed them)."""
        return sum(f.records for f in self.failures)

    def total(self, name: str) -> int:
        """Sum one `Stats` field over the partitions."""
        return sum(int(getattr(p.stats, name)) for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)


def partition_views(
    partitions: Mapping[int, OwnedPartition],
    watermarks: WatermarkCache,
    committer: Committer,
    stalls: StallWatch,
    paused: Collection[int],
    open_transactions: Mapping[int, OpenTransaction],
) -> list[PartitionView]:
    """Each owned partition as the driver sees it now (`paused`: the operators' pauses;
    `open_transactions`: the partitions waiting on one)."""
    views = []
    for p, part in partitions.items():
        pm, breaker = part.manager, part.breaker
        views.append(
            PartitionView(
                p,
                pm.stats(),
                *watermarks.known(p),
                committer.committed(p),
                None if breaker.state is BreakerState.CLOSED else breaker.view(),
                part.stopped,
                stalls.stalls.get(p, 0),
                stalls.stuck_for(p, pm),
                p in paused,
                part.state is PartitionState.RELEASING,
                committed_at=committer.written_at(p),
                open_transaction=open_transactions.get(p),
            )
        )
    return views


def warn_if_every_record_failed(progress: Progress, dlq_topic: str) -> None:
    """Say loudly when no record succeeded and some failed: a broken handler must not look
    like a run that went through."""
    if not progress.failures or progress.total("acked") + progress.total("duplicates"):
        return
    kinds = "; ".join(
        f"{f.failure} ({f.records} {'record' if f.records == 1 else 'records'})"
        for f in progress.failures[:3]
    )
    log.error(
        "%s: EVERY RECORD FAILED in this run, none succeeded: %s. Fix the handler (the "
        "traceback is logged above); failed records are retried, then dead-lettered to %s "
        "(`kspout dlq show`) or skipped, per on_exhausted",
        progress.topic,
        kinds,
        dlq_topic,
    )


# What an instance publishes of each partition in its ZooKeeper node, for `kspout status`.
REPORTED = (
    "in_flight",
    "waiting",
    "dead_letter_pending",
    "acked",
    "retried",
    "dead_lettered",
    "lost",
)


def instance_report(progress: Progress) -> dict[str, Any]:
    """The report an instance keeps in its node: per partition, what only it knows."""
    return {
        "at": now_ms(),
        "refused": progress.commits_refused,
        "dropped": progress.partitions_dropped,
        "partitions": {
            str(v.partition): {
                "status": v.status,
                "emitted": v.stats.emitted_to,
                "commit_point": v.stats.commit_point,
                **{name: getattr(v.stats, name) for name in REPORTED},
            }
            for v in progress.partitions
        },
    }


# Commit intervals a quiet instance leaves its report unwritten at most (`kspout status` calls
# a report older than 3 stale).
REPORT_EVERY = 2


class InstanceReporter:
    """Writes `instance_report` into this instance's node when what it says changed, else
    every `REPORT_EVERY` commit intervals, so `kspout status` still sees the instance alive:
    an idle instance with a thousand partitions need not rewrite the same report (about 100
    bytes a partition) at every commit."""

    def __init__(
        self, registry: InstanceRegistry, clock: Callable[[], float], interval: float
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._heartbeat = REPORT_EVERY * interval
        self._said: dict[str, Any] | None = None  # the last report written, without its time
        self._written_at = float("-inf")

    def report(self, progress: Progress) -> None:
        """Write the report if it says something new, or the last one is a heartbeat old."""
        report = instance_report(progress)
        said = {key: value for key, value in report.items() if key != "at"}
        now = self._clock()
        if said == self._said and now - self._written_at < self._heartbeat:
            return
        self._registry.report({"report": report})
        self._said, self._written_at = said, now

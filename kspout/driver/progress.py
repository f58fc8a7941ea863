"""What the driver shows of itself: a snapshot per partition and for the whole run."""

from __future__ import annotations

from dataclasses import dataclass, field

from kspout.driver.breaker import BreakerView
from kspout.partition_manager import OutOfRangeReset, Stats


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

    @property
    def lag(self) -> int:
        """Offsets Kafka holds that are not finished yet."""
        return max(0, self.high - self.stats.commit_point)

    @property
    def status(self) -> str:
        """`running`, `stopped`, or the breaker's state (`open`, `half-open`)."""
        if self.stopped is not None:
            return "stopped"
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

    def total(self, name: str) -> int:
        """Sum one `Stats` field over the partitions."""
        return sum(int(getattr(p.stats, name)) for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)

"""`Stats`, the one counter type: the ledger counts its totals in one, and `stats()` hands out a
copy with the state counts filled in."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Stats:
    """Counts for one partition: states now (in_flight, waiting, ...) and totals since start.

    The ledger adds to the totals of its own instance as offsets change state (its state
    fields stay 0: the map counts states); what `PartitionManager.stats` returns is a copy to
    read, not to change. Not frozen: a frozen dataclass sets each field through
    `object.__setattr__`, and the driver takes one per partition for every progress snapshot.
    """

    commit_point: int = 0
    emitted_to: int = 0
    in_flight: int = 0
    waiting: int = 0  # failed or deferred, waiting for the next attempt
    dead_letter_pending: int = 0
    unplanned: int = 0  # unfinished gaps between restored spans, not handed out yet
    acked: int = 0
    duplicates: int = 0
    retried: int = 0
    deferred: int = 0
    timed_out: int = 0
    exceptions: int = 0  # failed as EXCEPTION: the handler raised
    skipped: int = 0
    dead_lettered: int = 0
    lost: int = 0  # data Kafka had that was never processed (out-of-range resets)
    replaced: int = 0  # handed out, then replaced by an unclean leader election (truncation)
    gaps: int = 0  # GONE: offsets Kafka never had for this consumer (markers, compaction)
    invalid: int = 0  # failed as INVALID (no id, undecodable): dead-lettered without a retry
    crashed: int = 0  # failed as CRASH: killed its worker when run alone
    released: int = 0  # handed back for an infrastructure failure, no attempt spent
    stale: int = 0  # outcomes ignored: late, duplicated, or from a finished attempt
    restored: int = 0  # finished before a restart (spans in the stored record): not replayed
    spans: int = 0  # memory in use: number of spans

    @property
    def finished(self) -> int:
        """Offsets finished since the start, however."""
        return (
            self.acked + self.duplicates + self.skipped + self.dead_lettered + self.lost + self.gaps
        )

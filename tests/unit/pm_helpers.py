"""Single-offset and single-range outcome calls for tests, as one-outcome `apply` batches.

The driver reports outcomes only through `PartitionManager.apply` (and `fail`); tests often
want to say "ack offset 3" or "fail [0, 5)". Each helper builds the outcomes and applies them
in the manager's current generation (or `generation`, when given), so a test exercises the
production path.
"""

from __future__ import annotations

from collections.abc import Iterable

from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager
from kspout.ranges import runs


def _apply(pm: PartitionManager, outcomes: list[Outcome], generation: int | None = None) -> None:
    pm.apply(outcomes, generation=pm.generation if generation is None else generation)


def ack(pm: PartitionManager, offset: int, *, generation: int | None = None) -> None:
    """The offset was fully processed (whichever attempt it came from, late or not)."""
    _apply(pm, [Outcome(offset, OutcomeKind.ACK)], generation)


def duplicate(pm: PartitionManager, offset: int) -> None:
    """The dedup bolt found the offset already done elsewhere: counts as an ack."""
    _apply(pm, [Outcome(offset, OutcomeKind.DUPLICATE)])


def defer(pm: PartitionManager, offset: int, attempt: int | None = None) -> None:
    """In flight elsewhere (a live dedup lease): offer it again later, no attempt spent."""
    _apply(pm, [Outcome(offset, OutcomeKind.DEFERRED, attempt)])


def gone(pm: PartitionManager, offset: int) -> None:
    """Kafka has no record at the offset: finished as a gap."""
    _apply(pm, [Outcome(offset, OutcomeKind.GONE)])


def ack_range(pm: PartitionManager, lo: int, hi: int) -> None:
    """Ack every offset in `[lo, hi)` (nothing when it is empty)."""
    _apply(pm, [Outcome(lo, OutcomeKind.ACK, count=hi - lo)] if hi > lo else [])


def fail_range(
    pm: PartitionManager,
    lo: int,
    hi: int,
    reason: FailReason,
    error: str | None = None,
    attempt: int | None = None,
) -> None:
    """Fail every in-flight offset in `[lo, hi)` (at `attempt`, when given)."""
    outcome = (
        Outcome(lo, OutcomeKind.FAIL, attempt, reason, error, count=hi - lo) if hi > lo else None
    )
    _apply(pm, [outcome] if outcome else [])


def ack_many(pm: PartitionManager, offsets: Iterable[int]) -> None:
    """Ack a batch of offsets (in any order; each run of consecutive ones as one outcome)."""
    _apply(pm, [Outcome(lo, OutcomeKind.ACK, count=hi - lo) for lo, hi in runs(offsets)])


def fail_many(
    pm: PartitionManager, offsets: Iterable[int], reason: FailReason, error: str | None = None
) -> None:
    """Fail a batch of offsets at their current attempts."""
    _apply(
        pm,
        [
            Outcome(lo, OutcomeKind.FAIL, None, reason, error, count=hi - lo)
            for lo, hi in runs(offsets)
        ],
    )

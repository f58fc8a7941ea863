"""Out of range: what the `out_of_range` policy does when Kafka no longer holds the offsets a
partition needs (retention deleted them, or the partition was truncated or recreated)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kspout.errors import PartitionStopped
from kspout.partition_manager.ledger import SpanLedger
from kspout.partition_manager.states import DONE
from kspout.policy import PositionKind
from kspout.wording import count as count_of

# The package's one logger name, as before it was split: operators filter on it.
log = logging.getLogger("kspout.partition_manager")


@dataclass(frozen=True, slots=True)
class OutOfRangeReset:
    """What an out-of-range policy did: where the partition moved and what was lost."""

    low: int
    high: int
    old_commit: int
    old_emitted: int
    new_start: int
    lost: tuple[tuple[int, int], ...]  # exact half-open ranges of unfinished offsets given up

    @property
    def lost_count(self) -> int:
        return sum(hi - lo for lo, hi in self.lost)


def is_out_of_range(ledger: SpanLedger, low: int, high: int) -> bool:
    """True when the partition's next offsets are outside Kafka's `[low, high)`."""
    return ledger.map.first < low or ledger.map.end > high


def reset(
    ledger: SpanLedger,
    low: int,
    high: int,
    timestamp_offset: int | None,
    restart: Callable[[int], None],
) -> OutOfRangeReset | None:
    """Apply the ledger's `out_of_range` policy (see `PartitionManager.on_out_of_range`);
    `restart(offset)` starts the partition over at `offset`, in a new generation."""
    if not is_out_of_range(ledger, low, high):
        return None
    m = ledger.map
    cp, emitted = m.first, m.end
    position = ledger.policy.out_of_range
    if position.kind is PositionKind.FAIL:
        raise PartitionStopped(
            ledger.topic, ledger.partition, cp if cp < low else emitted, low, high
        )
    if position.kind is PositionKind.LATEST:
        target = high
    elif position.kind is PositionKind.TIMESTAMP and timestamp_offset is not None:
        target = timestamp_offset
    else:
        target = low
    target = min(max(target, low), high)
    lost: list[tuple[int, int]] = []
    if emitted <= high and cp < target < emitted:
        # Only the head is gone: keep the state of what Kafka still has.
        lost = ledger.unfinished(cp, target)
        m.assign(cp, target, DONE)
        m.drop_front(DONE)
    else:
        lost = _clip_lost(ledger.unfinished(cp, emitted), target, high)
        if target > emitted:
            lost.append((emitted, target))
        restart(target)
    lost_offsets = sum(b - a for a, b in lost)
    ledger.counts.lost += lost_offsets
    log.warning(
        "%s[%s] out of range: needed [%d, %d), Kafka holds [%d, %d); policy %s moved to %d; "
        "lost %s %s",
        ledger.topic,
        ledger.partition,
        cp,
        emitted,
        low,
        high,
        position,
        target,
        count_of(lost_offsets, "offset"),
        lost,
    )
    return OutOfRangeReset(low, high, cp, emitted, target, tuple(lost))


def _clip_lost(ranges: list[tuple[int, int]], target: int, high: int) -> list[tuple[int, int]]:
    """Keep the parts of `ranges` that a reset to `target` will not reprocess.

    After a reset, offsets in `[target, high)` are fetched again, so only unfinished offsets
    below the target, or at/above `high` (no longer in Kafka), are lost.
    """
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if a < target:
            out.append((a, min(b, target)))
        if b > high:
            out.append((max(a, high, target), b))
    return [(a, b) for a, b in out if a < b]

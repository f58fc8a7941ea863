"""Truncation: an unclean leader election replaced offsets this partition already handed out.

Kafka's consumer detects it with leader epochs (KIP-320): every record batch carries the epoch
of the leader that wrote it, and a new leader answers OffsetForLeaderEpoch(e) with the end of
epoch `e` in its own log. kspout keeps an anchor, `(position, epoch)`: the record just below
`position` was written in leader epoch `epoch` (the highest record a fetch returned; stored beside
the commit point). When the broker's end of that epoch is below `position`, offsets
`[end, position)` and everything handed out above them now hold other messages.

The rollback starts the partition over at `min(end, commit point)` in a new generation, so the
new messages at the reused offsets are planned like new work (never skipped) and outcomes of
plans made before are ignored. Finished offsets between the commit point and `end` are processed
again: at-least-once, as after any replay; keeping their states would mean trusting outcomes of
plans made against the old log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kspout.partition_manager.ledger import SpanLedger
from kspout.wording import count as count_of

# The package's one logger name: operators filter on it.
log = logging.getLogger("kspout.partition_manager")

# `(position, epoch)`: the record at `position - 1` was written in leader epoch `epoch`.
Anchor = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Truncation:
    """What a rollback did: offsets `[end, seen)` were fetched from the old log and now hold
    new messages, and the partition restarts at `start`. Offsets from `seen` to `emitted`
    were handed out too; what fetches of them return now comes from the new log (their
    outcomes are stale and they are planned again), so they are not counted as replaced."""

    end: int  # the new leader's end of the anchor's epoch: the first replaced offset
    seen: int  # the anchor's position: offsets below it were fetched before the election
    emitted: int  # every offset below it had been handed out
    start: int  # where the partition starts over: min(end, commit point)
    old_epoch: int  # the anchor's epoch
    new_epoch: int | None  # the epoch of the records that revealed it (None: not fetched yet)

    @property
    def replaced(self) -> int:
        """How many offsets kspout fetched from the old log hold other messages now."""
        return self.seen - self.end


def newer(anchor: Anchor | None, seen: Anchor) -> Anchor:
    """The anchor after a fetch returned a record at `seen[0] - 1` in epoch `seen[1]`: the
    higher of the two (epochs never go down as offsets go up in one log)."""
    if anchor is None or seen[0] > anchor[0]:
        return seen
    return anchor


def roll_back(
    ledger: SpanLedger,
    anchor: Anchor,
    end: int,
    new_epoch: int | None,
    restart: Callable[[int], None],
) -> Truncation | None:
    """Kafka's log ends the anchor's epoch at `end`; records of `new_epoch` revealed it.

    None when `end` reaches the anchor: nothing kspout fetched was replaced. Otherwise restart
    at `min(end, commit point)`, count the replaced offsets and log their exact range at
    WARNING.
    """
    position, epoch = anchor
    at = end
    if at >= position:
        return None
    m = ledger.map
    cp, emitted = m.first, max(m.end, position)  # at a start, the anchor may lie above both
    cut = Truncation(at, position, emitted, min(at, cp), epoch, new_epoch)
    restart(cut.start)
    ledger.counts.replaced += cut.replaced
    report(ledger.topic, ledger.partition, cut)
    return cut


def cut_at(anchor: Anchor, end: int, new_epoch: int | None) -> Truncation | None:
    """The truncation of a log read up to `anchor` whose leader ends the anchor's epoch at
    `end` (None when nothing read was replaced), for a reader with no ledger behind it (a
    stream's batch, which begins at the anchor): it starts over at `end`."""
    position, epoch = anchor
    if end >= position:
        return None
    return Truncation(end, position, position, end, epoch, new_epoch)


def report(topic: str, partition: int | str, cut: Truncation) -> None:
    """Log the exact range `cut` replaced, at WARNING."""
    log.warning(
        "%s[%s]: offsets %d-%d were replaced by an unclean leader election (leader epoch %d "
        "-> %s): %s handed out before were lost from Kafka; the new messages at those offsets "
        "are processed now, from offset %d",
        topic,
        partition,
        cut.end,
        cut.seen - 1,
        cut.old_epoch,
        "?" if cut.new_epoch is None else cut.new_epoch,
        count_of(cut.replaced, "message"),
        cut.start,
    )

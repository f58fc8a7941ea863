"""Dead letters: offsets given up, handed to the driver to write to the dead-letter topic, and
finished once it confirms the write (or handed out again when the write failed)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from kspout.outcomes import FailReason
from kspout.partition_manager.ledger import SpanLedger
from kspout.partition_manager.states import DONE, NOW, DeadLetterPending
from kspout.ranges import runs


@dataclass(frozen=True, slots=True)
class DeadLetterTicket:
    """An offset the driver must write to the dead-letter topic, then confirm."""

    offset: int
    attempts: int
    reason: FailReason | None
    error: str | None
    cause: str


def take(ledger: SpanLedger, limit: int | None) -> list[DeadLetterTicket]:
    """Up to `limit` dead letters not handed out yet, lowest first, now marked handed."""
    out: list[DeadLetterTicket] = []
    letters = ledger.letters
    if not letters:
        return out
    pieces = letters.pop_due(math.inf)
    for k, (lo, hi, value, at) in enumerate(pieces):
        if limit is not None and len(out) >= limit:
            ledger.reschedule(letters, pieces[k:])
            break
        if not isinstance(value, DeadLetterPending):
            continue
        if limit is not None and lo + limit - len(out) < hi:
            letters.add(at, lo + limit - len(out), hi)
            hi = lo + limit - len(out)
        ledger.map.assign(lo, hi, value._replace(handed=True))
        out.extend(
            DeadLetterTicket(o, value.attempts, value.reason, value.error, value.cause)
            for o in range(lo, hi)
        )
    return out


def written(ledger: SpanLedger, offsets: Iterable[int]) -> None:
    """The dead-letter records for `offsets` are durable: they are finished."""
    m = ledger.map
    for lo, hi in runs(offsets):
        for a, b, value in m.spans(lo, hi):
            if isinstance(value, DeadLetterPending):
                m.assign(a, b, DONE)
                ledger.counts.dead_lettered += b - a
    m.drop_front(DONE)


def unwritten(ledger: SpanLedger, offsets: Iterable[int]) -> None:
    """Writing the dead letters for `offsets` failed: they are handed out again later."""
    for lo, hi in runs(offsets):
        for a, b, value in ledger.map.spans(lo, hi):
            if isinstance(value, DeadLetterPending) and value.handed:
                ledger.map.assign(a, b, value._replace(handed=False))
                ledger.letters.add(NOW, a, b)

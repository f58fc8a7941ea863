"""The states of an unfinished offset (see `manager` for the state machine), and which schedule
entries are still live for them."""

from __future__ import annotations

import math
from typing import Final, NamedTuple, TypeAlias

from kspout.outcomes import FailReason


class _Done:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


class _Unplanned:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNPLANNED"


DONE: Final = _Done()
UNPLANNED: Final = _Unplanned()


# The states with data are immutable named tuples: one value is shared by every span it covers
# (the map merges neighbours by identity), and a tuple is made several times faster than a
# frozen dataclass, which matters on the single-`fail` path.


class InFlight(NamedTuple):
    attempt: int  # 1 for the first attempt; +1 every time the offset is planned again
    deferrals: int  # attempts that ended DEFERRED or RELEASED (not charged to the budget)
    deadline: float  # clock value after which the attempt fails with TIMEOUT


class Waiting(NamedTuple):
    attempt: int  # the attempt that ended
    deferrals: int
    reason: FailReason | None  # None: deferred, not failed
    error: str | None


class DeadLetterPending(NamedTuple):
    attempts: int
    reason: FailReason | None
    error: str | None
    cause: str  # "retries exhausted", "max_offset_behind" or "not retried" (INVALID)
    handed: bool  # handed to the driver by take_dead_letters, write not yet confirmed


State: TypeAlias = _Done | _Unplanned | InFlight | Waiting | DeadLetterPending
Unplanned: TypeAlias = _Unplanned  # the type of UNPLANNED, for per-state counts


# Whether a span still holds what a schedule entry of time `at` was made for (entries are not
# updated when spans change). An in-flight span is expired by the entry of its own deadline
# (a hold leaves the entry of the old one behind); a waiting span or an unplanned gap has one
# entry (its due time, -inf for a gap), since it can only leave the state by being planned,
# which pops the entry, or by finishing; a dead letter is due at once until it is handed out.
NOW: Final = -math.inf  # due from the start, whatever the clock says


def expires_at(value: State, at: float) -> bool:
    return type(value) is InFlight and value.deadline == at


def is_ready(value: State, at: float) -> bool:
    return type(value) is Waiting or value is UNPLANNED


def is_letter(value: State, at: float) -> bool:
    return type(value) is DeadLetterPending and not value.handed

"""The fail batcher: single `fail` calls are logged, then applied to the ledger in one go.

Single calls come in floods (one per message of a failed batch). Logging them costs a few list
appends; applying them by span turns the alike failures inside one in-flight span into one
splice of the map. The ledger is reachable only through `ledger()`, which applies the log
first, so nothing reads or changes the ledger while a logged failure is pending.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from itertools import chain, islice
from operator import itemgetter, lt
from typing import TypeVar

from kspout.outcomes import FailReason
from kspout.partition_manager.ledger import SpanLedger

_T = TypeVar("_T")


class FailLog:
    """`fail` calls not applied yet, as columns: call k failed `offsets[k]` for `reasons[k]`
    (`errors[k]`) at `attempts[k]`, the clock reading `times[k]`. No object per call, so a
    flood of them costs the cyclic garbage collector nothing."""

    __slots__ = ("attempts", "errors", "offsets", "reasons", "times")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.reasons: list[FailReason] = []
        self.errors: list[str | None] = []
        self.attempts: list[int | None] = []
        self.times: list[float] = []

    def take(self) -> FailLog:
        """The calls logged so far, moved into a new log: this one is left empty (and keeps
        its identity, so a caller may hold it)."""
        taken = FailLog()
        for name in FailLog.__slots__:
            setattr(taken, name, getattr(self, name))
            setattr(self, name, [])
        return taken

    def pick(self, calls: Sequence[int]) -> FailLog:
        """The calls at `calls`, in that order."""
        picked = FailLog()
        for name in FailLog.__slots__:
            setattr(picked, name, _take(getattr(self, name), calls))
        return picked

    def alike(self) -> tuple[FailReason, str | None, int | None] | None:
        """The reason, error and attempt every call shares; None if they differ."""
        n, reason, error, attempt = (
            len(self.offsets),
            self.reasons[0],
            self.errors[0],
            self.attempts[0],
        )
        if (
            self.reasons.count(reason) == n
            and self.errors.count(error) == n
            and self.attempts.count(attempt) == n
        ):
            return reason, error, attempt
        return None


def _take(column: list[_T], calls: Sequence[int]) -> list[_T]:
    """`column`'s items at `calls`, in that order (a slice when they are a range)."""
    if isinstance(calls, range):
        return column[calls.start : calls.stop]
    if len(calls) == 1:
        return [column[calls[0]]]
    return list(itemgetter(*calls)(column))


class FailBatcher:
    """A ledger behind a log of pending failures: `log` takes calls (append to its columns),
    `ledger()` applies them, each at its own clock reading, and returns the ledger."""

    __slots__ = ("_ledger", "log")

    def __init__(self, ledger: SpanLedger) -> None:
        self._ledger = ledger
        self.log = FailLog()  # the same object for the batcher's life (`FailLog.take`)

    def ledger(self) -> SpanLedger:
        """The ledger, with every logged failure applied: the only way to reach it."""
        if self.log.offsets:
            self._apply(self.log.take())
        return self._ledger

    def _apply_one(self, log: FailLog, k: int) -> None:
        """Apply logged call `k` on its own."""
        ledger = self._ledger
        if not ledger.fail_one(
            log.offsets[k], log.reasons[k], log.errors[k], log.attempts[k], log.times[k]
        ):
            ledger.counts.stale += 1

    def _apply(self, log: FailLog) -> None:
        """Apply logged failures by span, with the result of applying them in call order.

        Failures of distinct offsets do not depend on one another, so they are taken by
        offset: the alike failures inside one in-flight span (`SpanLedger.fail_alike`) become
        one splice of the map, the others are applied one by one. Spans go from the highest
        down, so an edit never moves a span still to come. An offset failed twice in the log
        (its calls depend on each other) sends the whole log one by one, in call order.
        """
        offsets = log.offsets
        n = len(offsets)
        order: Sequence[int] = range(n)
        ascending = offsets
        if not all(map(lt, offsets, islice(offsets, 1, None))):
            order = sorted(order, key=offsets.__getitem__)
            ascending = _take(offsets, order)
            if not all(map(lt, ascending, islice(ascending, 1, None))):
                for k in range(n):
                    self._apply_one(log, k)
                return
        ledger = self._ledger
        m = ledger.map
        groups: list[tuple[int, int]] = []  # `ascending[a:b]` lie in one span each
        pos = 0
        while pos < n:
            i = bisect_right(m.starts, ascending[pos]) - 1
            end = m.span_end(i) if i >= 0 else m.first
            stop = max(pos + 1, bisect_left(ascending, end, pos + 1))
            groups.append((pos, stop))
            pos = stop
        shared = log.alike()  # a flood's calls mostly share them: no check per group then
        batched: dict[float, list[Sequence[int]]] = {}  # backoff delay -> calls that wait it
        for a, b in reversed(groups):
            calls = order[a:b]
            alike = shared if shared is not None or b - a < 2 else log.pick(calls).alike()
            delay = None
            if b - a >= 2 and alike is not None:
                delay = ledger.fail_alike(ascending[a:b], *alike)
            if delay is None:
                for k in calls:
                    self._apply_one(log, k)
            else:
                batched.setdefault(delay, []).append(calls)
        for delay, done in batched.items():  # their due times, as runs in call order
            if len(done) > 1 or not isinstance(done[0], range):
                calls = sorted(chain.from_iterable(done))
            else:
                calls = done[0]  # a flood logged in offset order: slices, no copy per call
            ledger.ready.add_singles(_take(log.times, calls), delay, _take(offsets, calls))

"""A piecewise-constant map over a contiguous offset range, costing memory per change of value.

`SpanMap` covers `[first, end)` with sorted breakpoints: `starts[i]` begins a span whose value
holds until `starts[i + 1]` (or `end`). A million in-flight offsets emitted together are one
span; acking one in the middle splits it into three. Memory therefore grows with the number of
gaps, never with the number of offsets — the requirement storm-kafka's `TreeSet<Long>` broke.

Values are compared by identity when deciding whether neighbouring spans merge: callers share
one value object for everything that is alike (one object per planned range, one `DONE`
sentinel), which makes merging an `is` test instead of a field-by-field comparison.

Two things spare callers a walk over every span: the map keeps how many offsets hold a value of
each type (`count`), and a `Schedule` finds the spans whose value comes due at some time.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from heapq import heappop, heappush
from itertools import chain, islice
from operator import itemgetter, le
from typing import Generic, TypeVar

V = TypeVar("V")


class SpanMap(Generic[V]):
    """Sorted, contiguous, gap-proportional map from offsets in `[first, end)` to values."""

    __slots__ = ("_totals", "end", "starts", "values")

    def __init__(self, start: int) -> None:
        self.starts: list[int] = []
        self.values: list[V] = []
        self.end = start
        # Offsets per type of value, kept by every edit: counting a state costs O(1).
        self._totals: defaultdict[type, int] = defaultdict(int)

    @property
    def first(self) -> int:
        """The lowest covered offset (equals `end` when the map is empty)."""
        return self.starts[0] if self.starts else self.end

    def __len__(self) -> int:
        """Number of spans (not offsets): the memory the map costs."""
        return len(self.starts)

    def count(self, kind: type) -> int:
        """How many offsets hold a value of exactly type `kind` (O(1): kept by every edit)."""
        return self._totals.get(kind, 0)

    def reset(self, start: int) -> None:
        """Forget everything; the map becomes the empty range at `start`."""
        self.starts.clear()
        self.values.clear()
        self._totals.clear()
        self.end = start

    def extend(self, end: int, value: V) -> None:
        """Cover `[self.end, end)` with `value`."""
        if end <= self.end:
            return
        self._totals[type(value)] += end - self.end
        if not (self.values and self.values[-1] is value):
            self.starts.append(self.end)
            self.values.append(value)
        self.end = end

    def index(self, offset: int) -> int:
        """Index of the span holding `offset` (which must be inside `[first, end)`)."""
        return bisect_right(self.starts, offset) - 1

    def span_end(self, i: int) -> int:
        """Exclusive end of span `i`."""
        return self.starts[i + 1] if i + 1 < len(self.starts) else self.end

    def get(self, offset: int) -> V | None:
        """The value at `offset`, or None outside `[first, end)`."""
        if not self.starts or offset < self.starts[0] or offset >= self.end:
            return None
        return self.values[bisect_right(self.starts, offset) - 1]

    def spans(self, lo: int | None = None, hi: int | None = None) -> Iterator[tuple[int, int, V]]:
        """Yield `(start, end, value)` for every span piece inside `[lo, hi)`, ascending.

        Yields from a snapshot, so callers may assign while iterating.
        """
        if not self.starts:
            return
        lo = self.starts[0] if lo is None else max(lo, self.starts[0])
        hi = self.end if hi is None else min(hi, self.end)
        if lo >= hi:
            return
        i = bisect_right(self.starts, lo) - 1
        j = bisect_left(self.starts, hi, i + 1)
        starts = [*self.starts[i:j], self.span_end(j - 1)]
        values = self.values[i:j]
        for k, value in enumerate(values):
            yield max(starts[k], lo), min(starts[k + 1], hi), value

    def assign(self, lo: int, hi: int, value: V) -> None:
        """Set every offset in `[lo, hi)` to `value` (the range must lie inside the map)."""
        starts, values = self.starts, self.values
        n = len(starts)
        i = bisect_right(starts, lo) - 1
        j = bisect_left(starts, hi, i + 1)  # spans i .. j-1 overlap [lo, hi)
        if j == i + 1:
            if values[i] is not value:
                self.assign_within(i, lo, hi, value)
            return
        self._recount(i, j, lo, hi, value)
        new_starts: list[int] = []
        new_values: list[V] = []
        a = i - 1 if i > 0 else i  # include the neighbours so merges happen in one place
        b = j + 1 if j < n else j
        if a < i:
            new_starts.append(starts[a])
            new_values.append(values[a])
        if starts[i] < lo:
            new_starts.append(starts[i])
            new_values.append(values[i])
        new_starts.append(lo)
        new_values.append(value)
        if hi < self.end and (j == n or starts[j] != hi):
            new_starts.append(hi)
            new_values.append(values[j - 1])
        if b > j:
            new_starts.append(starts[j])
            new_values.append(values[j])
        merged_starts = [new_starts[0]]
        merged_values = [new_values[0]]
        for s, v in zip(new_starts[1:], new_values[1:], strict=True):
            if v is merged_values[-1]:
                continue
            merged_starts.append(s)
            merged_values.append(v)
        starts[a:b] = merged_starts
        values[a:b] = merged_values

    def _recount(self, i: int, j: int, lo: int, hi: int, value: V) -> None:
        """`count` as it becomes when `[lo, hi)`, overlapping spans `i .. j-1`, takes `value`."""
        totals, starts, values = self._totals, self.starts, self.values
        for k in range(i, j):
            piece = min(self.span_end(k), hi) - max(starts[k], lo)
            totals[type(values[k])] -= piece
        totals[type(value)] += hi - lo

    def assign_within(self, i: int, lo: int, hi: int, value: V) -> None:
        """`assign` when `[lo, hi)` lies inside span `i`: the common, single-offset case.

        Edits the lists in place (a boundary move or one insert) instead of rebuilding the
        neighbourhood; the result is the same as the general path's.
        """
        starts, values = self.starts, self.values
        j = i + 1
        old = values[i]
        start = starts[i]
        end = starts[j] if j < len(starts) else self.end
        totals = self._totals
        totals[type(old)] -= hi - lo
        totals[type(value)] += hi - lo
        joins_left = start == lo and i > 0 and values[i - 1] is value
        joins_right = hi == end and j < len(starts) and values[j] is value
        if start < lo and hi < end:  # a hole in the middle of the span
            starts[j:j] = [lo, hi]
            values[j:j] = [value, old]
        elif start < lo:  # the span's tail
            if joins_right:
                starts[j] = lo
            else:
                starts.insert(j, lo)
                values.insert(j, value)
        elif hi < end:  # the span's head
            if joins_left:
                starts[i] = hi
            else:
                starts.insert(j, hi)
                values.insert(j, old)
                values[i] = value
        elif joins_left and joins_right:  # the whole span, and both neighbours match
            del starts[i : j + 1]
            del values[i : j + 1]
        elif joins_left:
            del starts[i]
            del values[i]
        elif joins_right:  # span i takes its right neighbour's value and range
            del starts[j]
            del values[i]
        else:
            values[i] = value

    def assign_runs(self, i: int, los: Sequence[int], his: Sequence[int], value: V) -> None:
        """`assign(los[k], his[k], value)` for every k, the runs ascending inside span `i`, none
        touching the next, `value` not span `i`'s: a flood of failures in one splice of the
        lists instead of one edit per run."""
        starts, values = self.starts, self.values
        old = values[i]
        new_starts = list(chain.from_iterable(zip(los, his, strict=True)))
        new_values = [value, old] * len(los)
        if los[0] > starts[i]:
            new_starts.insert(0, starts[i])
            new_values.insert(0, old)
        if his[-1] == self.span_end(i):
            new_starts.pop()
            new_values.pop()
        n = sum(his) - sum(los)
        self._totals[type(old)] -= n
        self._totals[type(value)] += n
        starts[i : i + 1] = new_starts
        values[i : i + 1] = new_values
        last = i + len(new_values) - 1
        if last + 1 < len(values) and values[last + 1] is values[last]:  # joins the right
            del starts[last + 1]
            del values[last + 1]
        if i > 0 and values[i - 1] is values[i]:  # joins the left
            del starts[i]
            del values[i]

    def drop_front(self, value: V) -> None:
        """Remove leading spans holding `value` (the finished prefix below the commit point)."""
        starts, values = self.starts, self.values
        k = 0
        while k < len(values) and values[k] is value:
            k += 1
        if k:
            self._totals[type(value)] -= self.span_end(k - 1) - starts[0]
            del starts[:k]
            del values[:k]

    def drop_first(self, done: V) -> None:
        """The lowest offset becomes `done` and leaves the map, with the `done` spans after it.

        `assign(first, first + 1, done)` then `drop_front(done)`, for the commonest edit of all
        (an in-order ack of the oldest offset in flight) without `assign`'s general path.
        """
        starts, values = self.starts, self.values
        self._totals[type(values[0])] -= 1
        first = starts[0] + 1
        if first < (starts[1] if len(starts) > 1 else self.end):
            starts[0] = first
        else:
            del starts[0]
            del values[0]
            self.drop_front(done)


_start = itemgetter(0)
# A due piece of the map: `(lo, hi, value, at)`, `at` the time its schedule entry gave it.
Due = tuple[int, int, V, float]
# A schedule entry: `[lo, hi)` due at `at`.
Entry = tuple[float, int, int]


class _Run:
    """Schedule entries in time order: entry k is `[los[k], his[k])` (`[los[k], los[k] + 1)`
    when `his` is None) due at `bases[k] + delay`; the first `pos` were popped already.

    A flood of failures becomes one run that keeps the lists it was made from: their clock
    readings as `bases`, the backoff they share as `delay`. Nothing is copied per failure.
    """

    __slots__ = ("bases", "delay", "his", "los", "pos")

    def __init__(
        self, bases: list[float], delay: float, los: list[int], his: list[int] | None
    ) -> None:
        self.bases, self.delay, self.los, self.his, self.pos = bases, delay, los, his, 0

    def last_at(self) -> float:
        """When its last entry comes due."""
        return self.bases[-1] + self.delay

    def pop(self, now: float) -> list[Entry]:
        """Its entries due by `now`, which it forgets."""
        delay, pos = self.delay, self.pos
        end = bisect_right(self.bases, now, pos, key=lambda base: base + delay)
        self.pos = end
        return self.entries(pos, end)

    def entries(self, pos: int, end: int | None = None) -> list[Entry]:
        """Entries `pos .. end-1` as `(at, lo, hi)`."""
        los = self.los[pos:end]
        his = self.his[pos:end] if self.his is not None else [lo + 1 for lo in los]
        ats = [base + self.delay for base in self.bases[pos:end]]
        return list(zip(ats, los, his, strict=True))


class Schedule(Generic[V]):
    """The spans of a `SpanMap` that come due at a time, found without walking the map.

    Whoever assigns a scheduled value to `[lo, hi)` calls `add(at, lo, hi)`, `at` being when
    it comes due; `pop_due(now)` returns the pieces of the map due by `now`, ascending, and
    forgets them: the caller acts on each, or adds back what it leaves. The schedule may be
    the only record of a span's time (values shared by spans due at different times).

    Entries are not touched when the map changes under them (an ack, a retry, a reset): an
    entry only says where to look, and `holds(value, at)` says whether a span holding `value`
    is still the one the entry was made for. So an entry costs nothing until its time comes;
    stale ones go then, or when the ranges held outnumber twice the live ones and the spans
    (plus `slack`): every entry is then filtered against the map, so stale entries stay a
    bounded share of the memory. `live_bound`, when given, says how many entries at most can
    be live (for instance the offsets in the scheduled states, when live entries never
    overlap): no filtering while the ranges held are within twice that, since it could not
    drop half of them (a flood of failures, each its own entry, is all live).

    Times mostly arrive in order (now + a fixed delay, with a monotonic `now`), so entries are
    kept in runs of ascending times, one after the other (`_Run`; adds append to the last
    one), and only adds earlier than the last run's end go to a heap.
    """

    __slots__ = (
        "_heap",
        "_holds",
        "_limit",
        "_live_bound",
        "_map",
        "_next_at",
        "_ranges",
        "_runs",
        "_seq",
        "_slack",
    )

    def __init__(
        self,
        spans: SpanMap[V],
        holds: Callable[[V, float], bool],
        slack: int = 64,
        live_bound: Callable[[], int] | None = None,
    ) -> None:
        self._map = spans
        self._holds = holds
        self._slack = slack
        self._live_bound = live_bound
        self._runs: deque[_Run] = deque()  # in time order, each and one after the other
        self._heap: list[tuple[float, int, int, int]] = []  # (at, seq, lo, hi)
        self._seq = 0  # heap tie-breaker
        self._ranges = 0  # ranges held, stale ones included
        self._limit = slack  # `_ranges` above which `_compact` drops the stale ones
        self._next_at = math.inf  # when the earliest entry comes due (`due` in one compare)

    def __len__(self) -> int:
        """Ranges held (stale ones included): 0 means nothing can be due."""
        return self._ranges

    def add(self, at: float, lo: int, hi: int) -> None:
        """`[lo, hi)` was just assigned a value due at `at`."""
        runs = self._runs
        tail = runs[-1] if runs else None
        if tail is None or at >= tail.last_at():
            his = tail.his if tail is not None and not tail.delay else None
            if tail is None or his is None:  # not a run of single adds: start one
                his = []
                tail = _Run([], 0.0, [], his)
                runs.append(tail)
            elif tail.bases[-1] == at and his[-1] == lo:  # touches the last add
                his[-1] = hi
                return
            tail.bases.append(at)
            tail.los.append(lo)
            his.append(hi)
        else:
            self._seq += 1
            heappush(self._heap, (at, self._seq, lo, hi))
        if at < self._next_at:
            self._next_at = at
        self._ranges += 1
        if self._ranges > self._limit and self._worth_filtering():
            self._compact()

    def add_singles(self, bases: list[float], delay: float, los: list[int]) -> None:
        """`add(bases[k] + delay, los[k], los[k] + 1)` for every k; the lists become the
        schedule's (a flood of failures: nothing is copied when the times ascend from the
        last one). Filtering waits a while: every entry is live when added."""
        if not bases:
            return
        runs = self._runs
        first = bases[0] + delay
        if (not runs or first >= runs[-1].last_at()) and all(
            map(le, bases, islice(bases, 1, None))
        ):
            runs.append(_Run(bases, delay, los, None))
            self._next_at = min(self._next_at, first)
            self._ranges += len(bases)
            self._limit += 2 * len(bases)
        else:
            for base, lo in zip(bases, los, strict=True):
                self.add(base + delay, lo, lo + 1)

    def due(self, now: float) -> bool:
        """Whether an entry (live or stale) is due by `now`: O(1), no piece is looked at."""
        return self._next_at <= now

    def _earliest(self) -> float:
        """When the earliest entry held comes due (infinity when none is held)."""
        heap, runs = self._heap, self._runs
        at = heap[0][0] if heap else math.inf
        if runs:
            at = min(at, runs[0].bases[runs[0].pos] + runs[0].delay)
        return at

    def pop_due(self, now: float) -> list[Due[V]]:
        """The pieces due by `now`, ascending, each once; they leave the schedule (add back
        what is not acted on)."""
        heap, runs = self._heap, self._runs
        entries: list[Entry] = []
        while heap and heap[0][0] <= now:
            at, _, lo, hi = heappop(heap)
            entries.append((at, lo, hi))
        while runs and runs[0].bases[runs[0].pos] + runs[0].delay <= now:
            entries += runs[0].pop(now)
            if runs[0].pos < len(runs[0].bases):
                break
            runs.popleft()
        if not entries:
            return []
        self._next_at = self._earliest()
        self._ranges -= len(entries)
        return self._pieces(entries)

    def clear(self) -> None:
        """Forget every entry (the map was reset)."""
        self._runs.clear()
        self._heap.clear()
        self._ranges = 0
        self._next_at = math.inf

    def _pieces(self, entries: Iterable[Entry]) -> list[Due[V]]:
        """The pieces of the map that `entries` still hold, ascending, with overlapping or
        touching pieces of one span and one time joined (entries may repeat)."""
        holds, m = self._holds, self._map
        starts, values = m.starts, m.values
        pieces = []
        for at, lo, hi in entries:
            i = bisect_right(starts, lo) - 1
            if i >= 0 and hi <= (starts[i + 1] if i + 1 < len(starts) else m.end):
                if holds(values[i], at):  # inside one span: the common case, no walk
                    pieces.append((lo, hi, values[i], at))
            else:
                pieces += ((a, b, v, at) for a, b, v in m.spans(lo, hi) if holds(v, at))
        pieces.sort(key=_start)
        out: list[Due[V]] = []
        for piece in pieces:
            if out:
                a, b, value, at = out[-1]
                if piece[0] <= b and piece[2] is value and piece[3] == at:  # found twice
                    if piece[1] > b:
                        out[-1] = (a, piece[1], value, at)
                    continue
            out.append(piece)
        return out

    def _worth_filtering(self) -> bool:
        """Whether more than half the ranges held may be stale (see `live_bound`)."""
        bound = self._live_bound
        return bound is None or self._ranges > 2 * bound() + self._slack

    def _compact(self) -> None:
        """Drop the stale entries: filter every entry against the map. The next filtering
        waits until the ranges held are twice the live ones and the spans (plus `slack`), so
        stale entries never outnumber those by much and the cost is amortised O(1) per add."""
        entries = [(at, lo, hi) for at, _, lo, hi in self._heap]
        for run in self._runs:
            entries += run.entries(run.pos)
        live = sorted(((at, a, b) for a, b, _, at in self._pieces(entries)), key=_start)
        self.clear()
        if live:
            ats, los, his = (list(column) for column in zip(*live, strict=True))
            self._runs.append(_Run(ats, 0.0, los, his))
        self._ranges = len(live)
        self._limit = 2 * (len(live) + len(self._map)) + self._slack
        self._next_at = self._earliest()

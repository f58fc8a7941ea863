"""A piecewise-constant map over a contiguous offset range, costing memory per change of value.

`SpanMap` covers `[first, end)` with sorted breakpoints: `starts[i]` begins a span whose value
holds until `starts[i + 1]` (or `end`). A million in-flight offsets emitted together are one
span; acking one in the middle splits it into three. Memory therefore grows with the number of
gaps, never with the number of offsets — the requirement storm-kafka's `TreeSet<Long>` broke.

Values are compared by identity when deciding whether neighbouring spans merge: callers share
one value object for everything that is alike (one object per planned range, one `DONE`
sentinel), which makes merging an `is` test instead of a field-by-field comparison.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class SpanMap(Generic[V]):
    """Sorted, contiguous, gap-proportional map from offsets in `[first, end)` to values."""

    __slots__ = ("end", "starts", "values")

    def __init__(self, start: int) -> None:
        self.starts: list[int] = []
        self.values: list[V] = []
        self.end = start

    @property
    def first(self) -> int:
        """The lowest covered offset (equals `end` when the map is empty)."""
        return self.starts[0] if self.starts else self.end

    def __len__(self) -> int:
        """Number of spans (not offsets): the memory the map costs."""
        return len(self.starts)

    def reset(self, start: int) -> None:
        """Forget everything; the map becomes the empty range at `start`."""
        self.starts.clear()
        self.values.clear()
        self.end = start

    def extend(self, end: int, value: V) -> None:
        """Cover `[self.end, end)` with `value`."""
        if end <= self.end:
            return
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

    def drop_front(self, value: V) -> None:
        """Remove leading spans holding `value` (the finished prefix below the commit point)."""
        starts, values = self.starts, self.values
        k = 0
        while k < len(values) and values[k] is value:
            k += 1
        if k:
            del starts[:k]
            del values[:k]


def runs(offsets: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Coalesce ascending offsets into half-open runs `[lo, hi)`."""
    it = iter(offsets)
    try:
        lo = prev = next(it)
    except StopIteration:
        return
    for o in it:
        if o != prev + 1:
            yield lo, prev + 1
            lo = o
        prev = o
    yield lo, prev + 1

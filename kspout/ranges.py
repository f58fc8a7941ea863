"""Half-open offset ranges `[lo, hi)`: the one alias and every operation on them (pure).

A list of ranges is sorted and disjoint unless a function says otherwise. `runs` makes them
from single offsets, `append` grows one at its end, `union` joins any ranges, `subtract` and
`intersect` cut ranges by others.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

Range = tuple[int, int]  # half-open [lo, hi)


def runs(offsets: Iterable[int]) -> Iterator[Range]:
    """Ascending offsets coalesced into ranges: [3, 4, 9] -> (3, 5), (9, 10)."""
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


def append(ranges: list[Range], lo: int, hi: int) -> None:
    """Add `[lo, hi)`, which starts at or above the last range's end, to `ranges`: joined to
    the last range when they touch."""
    if ranges and ranges[-1][1] == lo:
        ranges[-1] = (ranges[-1][0], hi)
    else:
        ranges.append((lo, hi))


def union(*parts: Iterable[Range]) -> tuple[Range, ...]:
    """The union of any ranges (unsorted, overlapping, empty), sorted, disjoint, non-empty."""
    out: list[Range] = []
    for lo, hi in sorted(r for part in parts for r in part):
        if hi <= lo:
            continue
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def subtract(ranges: Sequence[Range], removed: Sequence[Range]) -> Iterator[tuple[int, int, int]]:
    """The pieces of `ranges` outside `removed`, as `(lo, hi, index in ranges)`."""
    j = 0
    for i, (lo, hi) in enumerate(ranges):
        while j < len(removed) and removed[j][1] <= lo:
            j += 1
        k = j
        while lo < hi and k < len(removed) and removed[k][0] < hi:
            if removed[k][0] > lo:
                yield lo, removed[k][0], i
            lo = max(lo, removed[k][1])
            k += 1
        if lo < hi:
            yield lo, hi, i


def intersect(ranges: Sequence[Range], kept: Sequence[Range]) -> Iterator[tuple[int, int, int]]:
    """The pieces of `ranges` inside `kept`, as `(lo, hi, index in ranges)`."""
    j = 0
    for i, (lo, hi) in enumerate(ranges):
        while j < len(kept) and kept[j][1] <= lo:
            j += 1
        k = j
        while k < len(kept) and kept[k][0] < hi:
            a, b = max(lo, kept[k][0]), min(hi, kept[k][1])
            if a < b:
                yield a, b, i
            k += 1

"""kspout.ranges against the plain sets of offsets the ranges stand for."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from kspout.ranges import Range, append, intersect, runs, subtract, union

ranges_st = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=8)


def offsets_of(ranges: list[Range] | tuple[Range, ...]) -> set[int]:
    return {o for lo, hi in ranges for o in range(lo, hi)}


def is_normal(ranges: tuple[Range, ...] | list[Range]) -> bool:
    """Sorted, disjoint, non-empty and not touching."""
    return all(lo < hi for lo, hi in ranges) and all(a[1] < b[0] for a, b in pairwise(ranges))


def test_runs_coalesce_ascending_offsets() -> None:
    assert list(runs([3, 4, 9])) == [(3, 5), (9, 10)]
    assert list(runs([])) == []


def test_append_joins_a_touching_range_and_keeps_a_gap() -> None:
    out: list[Range] = []
    append(out, 0, 2)
    append(out, 2, 5)
    append(out, 7, 8)
    assert out == [(0, 5), (7, 8)]


@given(ranges_st, ranges_st)
def test_union_holds_every_offset_once_in_normal_form(a: list[Range], b: list[Range]) -> None:
    joined = union(a, b)
    assert offsets_of(joined) == offsets_of(a) | offsets_of(b)
    assert is_normal(joined)


@given(ranges_st, ranges_st)
def test_subtract_and_intersect_split_the_offsets(a: list[Range], b: list[Range]) -> None:
    ranges, other = union(a), union(b)
    outside = [(lo, hi) for lo, hi, _ in subtract(ranges, other)]
    inside = [(lo, hi) for lo, hi, _ in intersect(ranges, other)]
    assert offsets_of(outside) == offsets_of(ranges) - offsets_of(other)
    assert offsets_of(inside) == offsets_of(ranges) & offsets_of(other)
    for lo, hi, i in [*subtract(ranges, other), *intersect(ranges, other)]:
        assert ranges[i][0] <= lo < hi <= ranges[i][1], "each piece names the range it is from"

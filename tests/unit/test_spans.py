"""SpanMap against a plain per-offset dict: same values everywhere, minimal spans, by identity."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kspout.spans import SpanMap


class Token:
    """A value that *equals* every other token: only identity tells them apart.

    SpanMap merges neighbours by `is`; if it ever compared with `==` instead, distinct tokens
    would merge and `get` would return the wrong object.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Token)

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return self.name


TOKENS = [Token(name) for name in "ABCD"]
tokens = st.sampled_from(TOKENS)


class SpanMapMachine(RuleBasedStateMachine):
    """Random extend / assign / drop_front / reset, checked offset by offset after each step."""

    @initialize(start=st.integers(0, 50))
    def setup(self, start: int) -> None:
        self.map: SpanMap[Token] = SpanMap(start)
        self.first = self.end = start
        self.model: dict[int, Token] = {}

    @rule(length=st.integers(0, 12), value=tokens)
    def extend(self, length: int, value: Token) -> None:
        self.map.extend(self.end + length, value)
        for o in range(self.end, self.end + length):
            self.model[o] = value
        self.end += length

    @rule(data=st.data(), value=tokens)
    def assign(self, data: st.DataObject, value: Token) -> None:
        if self.first == self.end:
            return
        lo = data.draw(st.integers(self.first, self.end - 1))
        hi = data.draw(st.integers(lo + 1, self.end))
        self.map.assign(lo, hi, value)
        for o in range(lo, hi):
            self.model[o] = value

    @rule(value=tokens)
    def drop_front(self, value: Token) -> None:
        self.map.drop_front(value)
        while self.first < self.end and self.model[self.first] is value:
            del self.model[self.first]
            self.first += 1

    @rule(start=st.integers(0, 200))
    def reset(self, start: int) -> None:
        self.map.reset(start)
        self.first = self.end = start
        self.model = {}

    @invariant()
    def matches_model(self) -> None:
        m = self.map
        assert (m.first, m.end) == (self.first, self.end)
        for o in range(self.first - 2, self.end + 2):
            assert m.get(o) is self.model.get(o), o

        pieces = list(m.spans())
        covered = [o for lo, hi, _ in pieces for o in range(lo, hi)]
        assert covered == list(range(self.first, self.end)), "spans cover [first, end) in order"
        for lo, hi, value in pieces:
            assert lo < hi
            assert all(self.model[o] is value for o in range(lo, hi))

        # Minimal: neighbours never hold the same object, so spans == runs of identical values.
        for left, right in zip(m.values, m.values[1:], strict=False):
            assert left is not right
        runs = sum(
            1
            for o in range(self.first, self.end)
            if o == self.first or self.model[o] is not self.model[o - 1]
        )
        assert len(m) == runs
        assert len(m.starts) == len(m.values)
        assert m.starts == sorted(set(m.starts))

    @invariant()
    def windowed_spans_clip(self) -> None:
        lo, hi = self.first + 1, self.end - 1
        got = [(a, b, v) for a, b, v in self.map.spans(lo, hi)]
        covered = [o for a, b, _ in got for o in range(a, b)]
        assert covered == list(range(max(lo, self.first), min(hi, self.end)))
        for a, b, value in got:
            assert all(self.model[o] is value for o in range(a, b))


SpanMapMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
TestSpanMapAgainstDict = SpanMapMachine.TestCase


@settings(max_examples=100, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 99), unique=True, max_size=10),
    window=st.tuples(st.integers(-5, 105), st.integers(-5, 105)),
)
def test_spans_window_outside_the_map_is_clipped(cuts: list[int], window: tuple[int, int]) -> None:
    """`spans(lo, hi)` with bounds outside `[first, end)` yields only the part inside."""
    m: SpanMap[Token] = SpanMap(0)
    m.extend(100, TOKENS[0])
    for i, cut in enumerate(sorted(cuts)):
        m.assign(cut, 100, TOKENS[(i + 1) % 2])
    lo, hi = window
    covered = [o for a, b, _ in m.spans(lo, hi) for o in range(a, b)]
    assert covered == list(range(max(lo, 0), min(hi, 100)))


def test_spans_iterates_a_snapshot_so_callers_may_assign() -> None:
    """The manager assigns while it walks the spans; the walk sees the map as it was."""
    a, b, c = TOKENS[:3]
    m: SpanMap[Token] = SpanMap(0)
    m.extend(10, a)
    m.assign(3, 6, b)
    seen = []
    for lo, hi, value in m.spans():
        seen.append((lo, hi, value))
        m.assign(lo, hi, c)
    assert seen == [(0, 3, a), (3, 6, b), (6, 10, a)]
    assert [value for *_, value in seen] == [a, b, a]
    assert list(m.spans()) == [(0, 10, c)] and len(m) == 1


def test_million_offsets_one_value_is_one_span() -> None:
    """Memory per change of value: a huge uniform range is one span; one hole makes three."""
    a, b = TOKENS[:2]
    m: SpanMap[Token] = SpanMap(5)
    m.extend(5 + 10**6, a)
    m.extend(5 + 2 * 10**6, a)
    assert len(m) == 1
    m.assign(500_000, 500_001, b)
    assert len(m) == 3
    m.assign(500_000, 500_001, a)
    assert len(m) == 1
    m.drop_front(a)
    assert len(m) == 0 and m.first == m.end == 5 + 2 * 10**6


def test_assign_whole_span_joining_right_neighbour_takes_its_value() -> None:
    """Regression: assigning a whole span the value of its right neighbour must merge the two
    under that value (an in-place fast path once kept the *old* value over both)."""
    a, b = TOKENS[:2]
    m: SpanMap[Token] = SpanMap(0)
    m.extend(2, a)
    m.assign(0, 1, b)
    assert (m.starts, m.values) == ([0, 1], [b, a])
    m.assign(0, 1, a)
    assert m.get(0) is a and m.get(1) is a
    assert (m.starts, m.values) == ([0], [a])


def test_assign_whole_middle_span_between_different_neighbours() -> None:
    """Whole-span assigns in every neighbour combination, checked offset by offset."""
    a, b, c, d = TOKENS
    for left, right in ((a, a), (a, c), (c, a), (b, c)):
        m: SpanMap[Token] = SpanMap(0)
        m.extend(1, left)
        m.extend(2, d)
        m.extend(3, right)
        m.assign(1, 2, a)
        assert [m.get(o) for o in range(3)] == [left, a, right]
        runs = 1 + (left is not a) + (right is not a)
        assert len(m) == runs, (left, right)

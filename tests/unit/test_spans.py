"""SpanMap against a plain per-offset dict: same values everywhere, minimal spans, by identity;
Schedule against a per-offset record of what is due and not handed out yet."""

from __future__ import annotations

import math
from typing import NamedTuple, TypeAlias

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kspout.spans import Schedule, SpanMap


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


# -- Schedule ----------------------------------------------------------------------------------


class At(NamedTuple):
    """A scheduled value that carries its own due time (like an in-flight deadline)."""

    at: float


class _Finished:
    __slots__ = ()

    def __repr__(self) -> str:
        return "FINISHED"


FINISHED = _Finished()  # a value no entry holds: assigning it leaves the entries stale
Value: TypeAlias = At | _Finished


def _holds(value: Value, at: float) -> bool:
    return type(value) is At and value.at == at


# Due times relative to the machine's clock (some already past; -inf: due from the start).
whens = st.sampled_from([-1.0, 0.0, 0.0, 0.5, 1.0, 2.0, 5.0, -math.inf])


class ScheduleMachine(RuleBasedStateMachine):
    """A `Schedule` with a tiny `slack` (so `_compact` runs all the time) over a map of `At`
    values, against a reference that knows, per offset, its value and whether it is pending:
    scheduled and not handed out by `pop_due` since it was assigned (or added back).

    `pop_due(now)` must return exactly the pending offsets due by `now`, in ascending,
    disjoint pieces that carry the offset's value and due time. Stale entries come from
    offsets finished without telling the schedule, rescheduled, or dropped from the map.
    """

    @initialize(
        start=st.integers(0, 20),
        length=st.integers(0, 20),
        slack=st.sampled_from([0, 2, 8]),
        bounded=st.booleans(),
    )
    def setup(self, start: int, length: int, slack: int, bounded: bool) -> None:
        self.map: SpanMap[Value] = SpanMap(start)
        # `live_bound` only defers filtering: the offsets holding a scheduled value (a loose
        # bound here, where live entries may overlap) must not change what comes due.
        m = self.map
        bound = (lambda: m.count(At)) if bounded else None
        self.schedule = Schedule(m, _holds, slack=slack, live_bound=bound)
        self.now = 0.0
        self.values: dict[int, Value] = {}
        self.pending: set[int] = set()
        self.cache: dict[float, At] = {}  # values to share (alike neighbours merge)
        self._extend(length, FINISHED)

    def _value(self, at: float, share: bool) -> At:
        """A value due at `at`: a fresh object, or one made before for the same time."""
        if share and at in self.cache:
            return self.cache[at]
        value = self.cache[at] = At(at)
        return value

    def _extend(self, length: int, value: Value) -> None:
        lo = self.map.end
        self.map.extend(lo + length, value)
        for o in range(lo, lo + length):
            self.values[o] = value
        if isinstance(value, At) and length:
            self.schedule.add(value.at, lo, lo + length)
            self.pending.update(range(lo, lo + length))

    def _range(self, data: st.DataObject) -> tuple[int, int] | None:
        first, end = self.map.first, self.map.end
        if first == end:
            return None
        lo = data.draw(st.integers(first, end - 1))
        return lo, data.draw(st.integers(lo + 1, min(end, lo + 8)))

    @rule(length=st.integers(1, 10), scheduled=st.booleans(), when=whens, share=st.booleans())
    def extend(self, length: int, scheduled: bool, when: float, share: bool) -> None:
        self._extend(length, self._value(self.now + when, share) if scheduled else FINISHED)

    @rule(data=st.data(), when=whens, share=st.booleans())
    def schedule_range(self, data: st.DataObject, when: float, share: bool) -> None:
        """Assign a range a value due at a time, and tell the schedule."""
        span = self._range(data)
        if span is None:
            return
        lo, hi = span
        value = self._value(self.now + when, share)
        self.map.assign(lo, hi, value)
        self.schedule.add(value.at, lo, hi)
        for o in range(lo, hi):
            self.values[o] = value
            self.pending.add(o)

    @rule(data=st.data())
    def finish_range(self, data: st.DataObject) -> None:
        """Finish a range without telling the schedule: its entries there go stale."""
        span = self._range(data)
        if span is None:
            return
        lo, hi = span
        self.map.assign(lo, hi, FINISHED)
        for o in range(lo, hi):
            self.values[o] = FINISHED
            self.pending.discard(o)

    @rule(
        data=st.data(),
        ascending=st.booleans(),
        delay=st.sampled_from([0.0, 0.5, 2.0]),
        share=st.booleans(),
    )
    def add_singles(self, data: st.DataObject, ascending: bool, delay: float, share: bool) -> None:
        """Single offsets due at `bases[k] + delay` (a flood of failures): ascending bases
        extend the runs in one piece, others are added one by one. Offsets may repeat (the
        later value wins, the earlier entry goes stale) and need not ascend."""
        first, end = self.map.first, self.map.end
        if first == end:
            return
        los = data.draw(st.lists(st.integers(first, end - 1), min_size=1, max_size=8))
        bases = [
            self.now + when
            for when in data.draw(st.lists(whens, min_size=len(los), max_size=len(los)))
        ]
        if ascending:
            bases.sort()
        for base, lo in zip(bases, los, strict=True):
            value = self._value(base + delay, share)
            self.map.assign(lo, lo + 1, value)
            self.values[lo] = value
            self.pending.add(lo)
        self.schedule.add_singles(bases, delay, los)

    @rule()
    def drop_front(self) -> None:
        """Finished offsets at the front leave the map (entries may still name them)."""
        self.map.drop_front(FINISHED)
        for o in [o for o in self.values if o < self.map.first]:
            del self.values[o]

    @rule(start=st.integers(0, 40))
    def reset(self, start: int) -> None:
        self.map.reset(start)
        self.schedule.clear()
        self.values.clear()
        self.pending.clear()

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.5]), data=st.data())
    def pop_due(self, dt: float, data: st.DataObject) -> None:
        """Pop what is due by the (non-decreasing) clock; add some back, as a caller with a
        budget does with the tail of what it could not take."""
        self.now += dt
        now = self.now
        flagged = self.schedule.due(now)
        pieces = self.schedule.pop_due(now)
        expected = sorted(o for o in self.pending if _due_at(self.values[o]) <= now)
        got: list[int] = []
        for lo, hi, value, at in pieces:
            assert lo < hi and (not got or got[-1] < lo), f"pieces ascend, disjoint: {pieces}"
            assert at <= now and _holds(value, at), (lo, hi, value, at)
            assert all(self.values.get(o) is value for o in range(lo, hi)), (lo, hi, value)
            got.extend(range(lo, hi))
        assert got == expected, f"due by {now}: got {got}, expected {expected}"
        assert flagged or not expected, "due() says nothing is due, pop_due finds some"
        self.pending.difference_update(got)
        for lo, hi, _, at in pieces:
            if data.draw(st.booleans()):
                cut = data.draw(st.integers(lo, hi - 1))
                self.schedule.add(at, cut, hi)
                self.pending.update(range(cut, hi))

    @invariant()
    def pending_are_scheduled(self) -> None:
        if not hasattr(self, "schedule"):
            return
        assert all(type(self.values[o]) is At for o in self.pending)
        assert len(self.schedule) > 0 or not self.pending, "pending offsets, empty schedule"


def _due_at(value: Value) -> float:
    assert isinstance(value, At)
    return value.at


ScheduleMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestScheduleAgainstReference = ScheduleMachine.TestCase

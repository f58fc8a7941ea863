"""Property tests: the range-based PartitionManager against the per-offset reference model.

Arbitrary interleavings of plan / ack / fail / defer / gone / batch outcomes / dead-letter
writes / time / out-of-range must keep the two in lock-step, never move the commit point past
an unfinished offset nor backwards (except by an out-of-range reset), and end with every
offset acked, dead-lettered, or counted as skipped or lost.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import InFlight, PartitionManager
from kspout.policy import (
    Backoff,
    BehindPolicy,
    ExhaustedPolicy,
    PartitionPolicy,
    Position,
    PositionKind,
)
from tests.unit import pm_helpers
from tests.unit.pm_model import Model

policies = st.builds(
    PartitionPolicy,
    max_retries=st.none() | st.integers(0, 3),
    backoff=st.builds(
        Backoff,
        st.sampled_from([0.0, 0.5, 2.0]),
        st.sampled_from([1.0, 2.0]),
        st.sampled_from([1.0, 5.0]),
    ),
    on_exhausted=st.sampled_from(ExhaustedPolicy),
    max_offset_behind=st.none() | st.integers(1, 25),
    behind_policy=st.sampled_from(BehindPolicy),
    message_timeout=st.sampled_from([1.0, 3.0, 10.0]),
    max_uncommitted=st.none() | st.integers(1, 40),
    out_of_range=st.sampled_from([Position(PositionKind.EARLIEST), Position(PositionKind.LATEST)]),
    defer_delay=st.sampled_from([0.0, 1.0]),
)
reasons = st.sampled_from(FailReason)


@st.composite
def finished_spans(draw: st.DrawFn, start: int) -> list[tuple[int, int]]:
    """Ascending, disjoint ranges above `start`: finished spans restored from a record."""
    spans: list[tuple[int, int]] = []
    at = start
    for _ in range(draw(st.integers(0, 5))):
        lo = at + draw(st.integers(0, 4))
        hi = lo + draw(st.integers(1, 6))
        spans.append((lo, hi))
        at = hi
    return spans


# How `fail_many_singles` picks its offsets (see `_fail_offsets`).
fail_shapes = st.sampled_from(["run", "scatter", "spoilt", "across", "any"])


def _run_inside(span: tuple[int, int]) -> st.SearchStrategy[list[int]]:
    """2-8 contiguous offsets inside `[a, b)` (at least 2 wide)."""
    a, b = span
    return st.integers(2, min(8, b - a)).flatmap(
        lambda n: st.integers(a, b - n).map(lambda lo: list(range(lo, lo + n)))
    )


def _scatter_inside(span: tuple[int, int]) -> st.SearchStrategy[list[int]]:
    """2-8 ascending offsets inside `[a, b)`, gaps likely."""
    a, b = span
    return st.lists(st.integers(a, b - 1), min_size=2, max_size=min(8, b - a), unique=True).map(
        sorted
    )


def _spoil(drawn: tuple[list[int], int, int]) -> list[int]:
    """Offsets of a flood made not one: reversed, the last repeated, the last moved to `end`
    (where the span ends), or moved to the front."""
    offsets, end, how = drawn
    if how == 0:
        return offsets[::-1]
    if how == 1:
        return [*offsets, offsets[-1]]
    if how == 2:
        return [*offsets[:-1], end]
    return [offsets[-1], *offsets[:-1]]


class PartitionManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.last_commit = 0
        self.reset_happened = False

    @initialize(policy=policies, start=st.integers(0, 1000), data=st.data())
    def setup(self, policy: PartitionPolicy, start: int, data: st.DataObject) -> None:
        """A fresh partition, or a restart with finished spans above the stored offset."""
        finished = data.draw(finished_spans(start))
        self.pm = PartitionManager(policy, start, clock=lambda: self.now, finished=finished)
        self.model = Model(policy, start, finished)
        self.last_commit = start

    def _offset(self, data: st.DataObject) -> int:
        return data.draw(st.integers(self.model.base - 2, self.model.emitted + 2))

    def _attempt(self, data: st.DataObject, offset: int) -> int | None:
        current = self.model.offsets.get(offset)
        choices: list[int | None] = [None, 1, 2]
        if current is not None:
            choices.append(current.attempt)
        return data.draw(st.sampled_from(choices))

    @rule(dt=st.sampled_from([0.0, 0.3, 1.0, 2.5, 11.0]))
    def advance_time(self, dt: float) -> None:
        self.now += dt

    @rule(extra=st.integers(0, 30), max_new=st.integers(0, 15))
    def plan(self, extra: int, max_new: int) -> None:
        high = self.model.emitted + extra
        plan = self.pm.plan(high, max_new)
        expected = self.model.plan(self.now, high, max_new)
        got = [(o, plan.attempt_of(o)) for o in plan]
        assert got == sorted(expected)
        assert list(plan) == sorted(set(plan)), "a plan yields each offset once, ascending"

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        o = self._offset(data)
        pm_helpers.ack(self.pm, o)
        self.model.ack(o)

    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        o = self._offset(data)
        pm_helpers.duplicate(self.pm, o)
        self.model.ack(o, duplicate=True)

    @rule(data=st.data(), reason=reasons)
    def fail(self, data: st.DataObject, reason: FailReason) -> None:
        o = self._offset(data)
        attempt = self._attempt(data, o)
        self.pm.fail(o, reason, "boom", attempt)
        self.model.fail(o, self.now, attempt, reason)

    @rule(data=st.data(), shape=fail_shapes)
    def fail_many_singles(self, data: st.DataObject, shape: str) -> None:
        """Several `fail` calls in a row, nothing else between them but the clock moving: the
        manager logs them and applies them at its next call, alike failures inside one
        in-flight span (one reason, one attempt) in one go, the others one by one; either way
        each at its own clock reading, as the model applies them call by call."""
        if shape != "any" and not self._in_flight_spans():  # a flood needs a planned span
            self.plan(data.draw(st.integers(2, 30)), data.draw(st.integers(2, 15)))
        offsets = data.draw(self._fail_offsets(shape))
        n = len(offsets)
        if data.draw(st.booleans()):
            reason = data.draw(reasons)
            why = [reason] * n
        else:
            why = data.draw(st.lists(reasons, min_size=n, max_size=n))
        attempts = self._fail_attempts(data, offsets)
        moves = data.draw(  # how the clock moves between the calls: not at all, or a bit
            st.just([0.0] * (n - 1))
            | st.lists(st.sampled_from([0.0, 0.3, 1.0]), min_size=n - 1, max_size=n - 1)
        )
        for k, o in enumerate(offsets):
            if k:
                self.now += moves[k - 1]
            self.pm.fail(o, why[k], "boom", attempts[k])
            self.model.fail(o, self.now, attempts[k], why[k])

    def _in_flight_spans(self) -> list[tuple[int, int]]:
        """The manager's in-flight spans of 2 offsets or more (one value, one attempt)."""
        spans = [(a, b) for a, b, v in self.pm.spans() if type(v) is InFlight and b - a >= 2]
        for a, b in spans:  # the model agrees: in flight, one attempt
            attempt = self.model.offsets[a].attempt
            assert all(
                self.model.offsets[o].state == "inflight"
                and self.model.offsets[o].attempt == attempt
                for o in range(a, b)
            )
        return spans

    def _fail_offsets(self, shape: str) -> st.SearchStrategy[list[int]]:
        """2-8 offsets to fail: a run or an ascending scatter inside one in-flight span (a
        flood), one of those out of order or spilling over, offsets in flight anywhere (in
        offset or any order), or anything around the emitted range."""
        spans = self._in_flight_spans()
        anywhere = st.lists(
            st.integers(self.model.base - 2, self.model.emitted + 2), min_size=2, max_size=8
        )
        if shape == "any" or not spans:
            return anywhere
        if shape == "run":
            return st.sampled_from(spans).flatmap(_run_inside)
        if shape == "scatter":
            return st.sampled_from(spans).flatmap(_scatter_inside)
        if shape == "across":
            m = self.model
            live = [o for o in m.unfinished() if m.offsets[o].state == "inflight"]
            some = st.lists(st.sampled_from(live), min_size=2, max_size=8, unique=True)
            return some | some.map(sorted)
        return (
            st.sampled_from(spans)
            .flatmap(
                lambda span: st.tuples(_scatter_inside(span), st.just(span[1]), st.integers(0, 3))
            )
            .map(_spoil)
        )

    def _fail_attempts(self, data: st.DataObject, offsets: list[int]) -> list[int | None]:
        """Per call: None, the offset's current attempt, a mix of both, or anything."""
        mode = data.draw(st.sampled_from(["none", "current", "mixed", "any"]))
        out: list[int | None] = []
        for o in offsets:
            current = self.model.offsets.get(o)
            attempt = None if current is None else current.attempt
            if mode == "none":
                out.append(None)
            elif mode == "current":
                out.append(attempt)
            elif mode == "mixed":
                out.append(data.draw(st.sampled_from([None, attempt])))
            else:
                out.append(self._attempt(data, o))
        return out

    @rule(data=st.data())
    def defer(self, data: st.DataObject) -> None:
        o = self._offset(data)
        attempt = self._attempt(data, o)
        pm_helpers.defer(self.pm, o, attempt)
        self.model.defer(o, self.now, attempt)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lo = self._offset(data)
        hi = data.draw(st.integers(lo, lo + 12))
        attempt = self._attempt(data, lo)
        self.pm.release(lo, hi, attempt, "infrastructure")
        for o in range(lo, hi):
            self.model.release(o, self.now, attempt)

    @rule(data=st.data(), dt=st.sampled_from([0.5, 5.0, 30.0]))
    def hold(self, data: st.DataObject, dt: float) -> None:
        lo = self._offset(data)
        hi = data.draw(st.integers(lo, lo + 12))
        attempt = data.draw(st.sampled_from([1, 2, 3]))
        self.pm.hold(lo, hi, attempt, self.now + dt)
        for o in range(lo, hi):
            self.model.hold(o, attempt, self.now + dt)

    @rule(data=st.data())
    def gone(self, data: st.DataObject) -> None:
        o = self._offset(data)
        pm_helpers.gone(self.pm, o)
        self.model.gone(o)

    @rule(data=st.data())
    def ack_range(self, data: st.DataObject) -> None:
        lo = self._offset(data)
        hi = data.draw(st.integers(lo, lo + 12))
        pm_helpers.ack_range(self.pm, lo, hi)
        for o in range(lo, hi):
            self.model.ack(o)

    @rule(data=st.data(), reason=reasons)
    def fail_range(self, data: st.DataObject, reason: FailReason) -> None:
        lo = self._offset(data)
        hi = data.draw(st.integers(lo, lo + 12))
        pm_helpers.fail_range(self.pm, lo, hi, reason)
        for o in range(lo, hi):
            self.model.fail(o, self.now, None, reason)

    @rule(data=st.data())
    def apply_batch(self, data: st.DataObject) -> None:
        live = [o for o in self.model.unfinished() if self.model.offsets[o].state == "inflight"]
        chosen = data.draw(st.lists(st.sampled_from(live), unique=True) if live else st.just([]))
        outcomes = []
        for o in sorted(chosen):
            kind = data.draw(st.sampled_from(OutcomeKind))
            attempt = self.model.offsets[o].attempt
            reason = data.draw(reasons) if kind is OutcomeKind.FAIL else None
            outcomes.append(Outcome(o, kind, attempt, reason, "e" if reason else None))
        self.pm.apply(outcomes, generation=self.pm.generation)
        for out in outcomes:
            o = out.offset
            if out.kind is OutcomeKind.ACK:
                self.model.ack(o)
            elif out.kind is OutcomeKind.DUPLICATE:
                self.model.ack(o, duplicate=True)
            elif out.kind is OutcomeKind.FAIL:
                assert out.reason is not None
                self.model.fail(o, self.now, out.attempt, out.reason)
            elif out.kind is OutcomeKind.DEFERRED:
                self.model.defer(o, self.now, out.attempt)
            elif out.kind is OutcomeKind.RELEASED:
                self.model.release(o, self.now, out.attempt)
            else:
                self.model.gone(o)

    @rule(data=st.data())
    def dead_letters(self, data: st.DataObject) -> None:
        tickets = self.pm.take_dead_letters()
        expected = self.model.take_dead_letters()
        assert [t.offset for t in tickets] == expected
        written = data.draw(st.lists(st.sampled_from(expected), unique=True)) if expected else []
        self.pm.dead_lettered(sorted(written))
        self.pm.dead_letter_failed(sorted(set(expected) - set(written)))
        self.model.dead_lettered(sorted(written))
        for o in set(expected) - set(written):
            self.model.offsets[o].handed = False

    @precondition(lambda self: hasattr(self, "pm"))
    @rule(data=st.data())
    def out_of_range(self, data: st.DataObject) -> None:
        cp = self.model.commit_point()
        low = data.draw(st.integers(max(0, cp - 3), self.model.emitted + 10))
        high = data.draw(st.integers(low, self.model.emitted + 15))
        reset = self.pm.on_out_of_range(low, high)
        target = self.model.out_of_range(low, high)
        assert (reset is None) == (target is None)
        if reset is not None:
            assert reset.new_start == target
            self.reset_happened = True

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "pm"):
            return
        m, pm = self.model, self.pm
        cp = m.commit_point()
        assert pm.commit_point == cp
        assert pm.emitted_to == m.emitted
        for o in range(m.base, cp):
            assert m.offsets[o].state == "done", "commit point passed an unfinished offset"
        if not self.reset_happened:
            assert cp >= self.last_commit, "commit point moved backwards"
        self.last_commit, self.reset_happened = cp, False
        s = pm.stats()
        assert s.in_flight == m.count("inflight")
        assert s.waiting == m.count("waiting")
        assert s.dead_letter_pending == m.count("deadletter")
        assert s.unplanned == m.count("unplanned")
        for name, value in m.counts.items():
            assert getattr(s, name) == value, name
        finishing = ("acked", "duplicates", "skipped", "dead_lettered", "lost", "gaps")
        assert pm.finished_total == sum(m.counts[name] for name in finishing)
        # What a commit stores: exactly the model's finished runs above the commit point.
        done = [o for o in range(cp, m.emitted) if m.offsets[o].state == "done"]
        runs = _runs(done)
        spans, cut = pm.finished_spans(3)
        assert spans == runs[:3] and cut == (runs[3][0] if len(runs) > 3 else None)
        # Memory is per gap: at most one span per unfinished run and one per finished gap.
        unfinished = s.in_flight + s.waiting + s.dead_letter_pending + s.unplanned
        assert s.spans <= 2 * unfinished
        assert (s.spans == 0) == (unfinished == 0)

    def teardown(self) -> None:
        if not hasattr(self, "pm"):
            return
        # Drain: let every deadline and backoff pass, ack what is planned, write dead letters.
        for _ in range(50):
            if not self.model.unfinished():
                break
            self.now += 1000.0
            plan = self.pm.plan(self.model.emitted, 10_000)
            self.model.plan(self.now, self.model.emitted, 10_000)
            pm_helpers.ack_many(self.pm, list(plan))
            for o in plan:
                self.model.ack(o)
            tickets = self.pm.take_dead_letters()
            self.model.take_dead_letters()
            self.pm.dead_lettered([t.offset for t in tickets])
            self.model.dead_lettered([t.offset for t in tickets])
        assert not self.model.unfinished()
        assert self.pm.commit_point == self.pm.emitted_to == self.model.emitted
        s = self.pm.stats()
        assert s.in_flight == s.waiting == s.dead_letter_pending == 0
        for o in range(self.model.start, self.model.emitted):
            off = self.model.offsets.get(o)
            assert off is not None and off.how in {
                "acked",
                "duplicates",
                "dead_lettered",
                "skipped",
                "lost",
                "restored",
            }, f"offset {o} ended without a recorded outcome"


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


PartitionManagerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None
)
TestPartitionManagerAgainstModel = PartitionManagerMachine.TestCase

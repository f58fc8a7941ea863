"""CircuitBreaker: every transition in fake time, the single half-open probe, late results, the
growing and capped wait, one log line per state change, and a property test against a model."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kspout.driver.breaker import BreakerState, BreakerView, CircuitBreaker
from kspout.policy import Backoff

BACKOFF = Backoff(initial=1.0, multiplier=2.0, max=30.0)
NAME = "orders[3]"
LOGGER = "kspout.driver.breaker"


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(NAME, BACKOFF, clock=clock)


def open_breaker(breaker: CircuitBreaker, error: str = "fetch failed") -> None:
    assert breaker.state is BreakerState.CLOSED
    breaker.failure(error)
    assert breaker.view().state is BreakerState.OPEN


def fail_probe(breaker: CircuitBreaker, clock: FakeClock, error: str = "still down") -> float:
    """Wait out the current pause, take the probe, fail it; return the new wait."""
    clock.advance(breaker.view().retry_in)
    assert breaker.allow(), "the wait has passed: the probe is allowed"
    breaker.failure(error)
    assert breaker.state is BreakerState.OPEN
    return breaker.view().retry_in


def fail_in_a_row(breaker: CircuitBreaker, clock: FakeClock, n: int) -> float:
    """n consecutive failures (the opening one, then n - 1 failed probes); return the wait."""
    open_breaker(breaker)
    for _ in range(n - 1):
        fail_probe(breaker, clock)
    return breaker.view().retry_in


# -- CLOSED ------------------------------------------------------------------------------------


def test_a_new_breaker_is_closed_and_allows(breaker: CircuitBreaker) -> None:
    assert breaker.state is BreakerState.CLOSED
    assert all(breaker.allow() for _ in range(5)), "CLOSED allows every batch, not just one"
    assert breaker.view() == BreakerView(BreakerState.CLOSED, 0, 0, 0.0, None)


def test_successes_while_closed_keep_it_closed(
    breaker: CircuitBreaker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for _ in range(10):
        assert breaker.allow()
        breaker.success()
    assert breaker.view() == BreakerView(BreakerState.CLOSED, 0, 0, 0.0, None)
    assert caplog.records == [], "no log line on successes while closed"


def test_first_failure_opens_for_the_first_delay(breaker: CircuitBreaker, clock: FakeClock) -> None:
    breaker.failure("KafkaException: fetch failed")
    assert breaker.view() == BreakerView(
        BreakerState.OPEN, 1, 1, BACKOFF.delay(1), "KafkaException: fetch failed"
    )
    assert not breaker.allow()


# -- OPEN --------------------------------------------------------------------------------------


def test_open_refuses_until_the_wait_has_passed(breaker: CircuitBreaker, clock: FakeClock) -> None:
    open_breaker(breaker)
    clock.advance(0.25)
    assert breaker.view().retry_in == 0.75, "counts down with the clock"
    clock.advance(0.5)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow()
    assert not breaker.allow()
    clock.advance(0.25)  # exactly BACKOFF.delay(1) after the failure (binary-exact steps)
    assert breaker.view().state is BreakerState.HALF_OPEN
    assert breaker.view().retry_in == 0.0


def test_late_failure_while_open_counts_but_does_not_extend_the_wait(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    open_breaker(breaker, "first")
    clock.advance(0.5)
    before = breaker.view()
    for i in range(3):
        breaker.failure(f"late {i}")  # batches planned before the breaker opened
    after = breaker.view()
    assert after.state is BreakerState.OPEN
    assert after.retry_in == before.retry_in == 0.5, "the wait is not extended"
    assert after.failures == 1, "late failures do not count as consecutive"
    assert after.total_failures == 4
    assert after.last_error == "late 2"
    # ... and the next real failure uses delay(2), not delay(5).
    assert fail_probe(breaker, clock) == BACKOFF.delay(2)


def test_late_success_while_open_changes_nothing(breaker: CircuitBreaker, clock: FakeClock) -> None:
    open_breaker(breaker)
    clock.advance(0.5)
    before = breaker.view()
    breaker.success()  # an earlier batch that got through before the outage
    assert breaker.view() == before
    assert not breaker.allow()


# -- HALF_OPEN ---------------------------------------------------------------------------------


def test_half_open_allows_exactly_one_probe(breaker: CircuitBreaker, clock: FakeClock) -> None:
    open_breaker(breaker)
    clock.advance(BACKOFF.delay(1))
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.allow(), "the probe"
    assert not breaker.allow(), "no second batch while the probe runs"
    clock.advance(3600.0)
    assert not breaker.allow(), "not even much later: only the probe's result unblocks"
    assert breaker.state is BreakerState.HALF_OPEN


def test_probe_success_closes_and_resets(breaker: CircuitBreaker, clock: FakeClock) -> None:
    fail_in_a_row(breaker, clock, 4)
    clock.advance(breaker.view().retry_in)
    assert breaker.allow()
    breaker.success()
    assert breaker.view() == BreakerView(BreakerState.CLOSED, 0, 4, 0.0, "still down")
    assert breaker.allow() and breaker.allow(), "closed: every batch is allowed again"
    breaker.failure("down again")
    assert breaker.view().retry_in == BACKOFF.delay(1), "consecutive count restarted at 1"


def test_probe_failure_reopens_with_a_longer_wait(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    open_breaker(breaker)
    waits = [breaker.view().retry_in] + [fail_probe(breaker, clock) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert breaker.view().failures == 8
    assert breaker.view().total_failures == 8


def test_late_results_before_the_probe_do_not_decide(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    """Half-open but the probe not yet handed out: a result can only be a late one."""
    open_breaker(breaker)
    clock.advance(BACKOFF.delay(1))
    breaker.success()
    assert breaker.state is BreakerState.HALF_OPEN, "a late success does not close it"
    breaker.failure("late")
    view = breaker.view()
    assert (view.state, view.failures, view.total_failures) == (BreakerState.HALF_OPEN, 1, 2)
    assert breaker.allow(), "the probe is still allowed"
    breaker.success()
    assert breaker.view().state is BreakerState.CLOSED


# -- the wait: growing, capped, never overflowing ----------------------------------------------


def test_thousands_of_failures_do_not_overflow(breaker: CircuitBreaker, clock: FakeClock) -> None:
    assert fail_in_a_row(breaker, clock, 3000) == BACKOFF.max
    assert breaker.view().failures == 3000


@pytest.mark.parametrize(
    ("backoff", "n"),
    [
        pytest.param(Backoff(0.01, 1.1, 30.0), 200, id="slow-growth-still-reaches-max"),
        pytest.param(Backoff(0.5, 10.0, 60.0), 1500, id="fast-growth"),
        pytest.param(Backoff(0.5, 1e300, 60.0), 50, id="huge-multiplier"),
        pytest.param(Backoff(30.0, 1.0, 30.0), 50, id="constant"),
    ],
)
def test_the_wait_reaches_max_and_stays_there(clock: FakeClock, backoff: Backoff, n: int) -> None:
    breaker = CircuitBreaker(NAME, backoff, clock=clock)
    assert fail_in_a_row(breaker, clock, n) == backoff.max
    assert fail_probe(breaker, clock) == backoff.max


def test_zero_initial_wait_never_overflows(clock: FakeClock) -> None:
    """`0 * 2.0 ** 1024` still raises: the power is computed first."""
    breaker = CircuitBreaker(NAME, Backoff(0.0, 2.0, 30.0), clock=clock)
    breaker.failure("down")
    for _ in range(2000):
        assert breaker.state is BreakerState.HALF_OPEN, "a zero wait is over at once"
        assert breaker.allow()
        breaker.failure("down")
    assert breaker.view() == BreakerView(BreakerState.HALF_OPEN, 2001, 2001, 0.0, "down")


# -- logging -----------------------------------------------------------------------------------


def test_one_log_line_per_state_change(
    breaker: CircuitBreaker, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    for _ in range(5):
        assert breaker.allow()
        breaker.success()
    breaker.failure("RedisError: connection refused")  # opens
    for _ in range(20):
        breaker.failure("RedisError: late")  # batches planned before it opened
        breaker.success()
        assert not breaker.allow()
    for _ in range(6):  # six failed probes, each followed by late results
        fail_probe(breaker, clock, "RedisError: still refused")
        breaker.failure("RedisError: late")
        breaker.success()
    clock.advance(breaker.view().retry_in)
    assert breaker.allow()
    clock.advance(0.5)
    breaker.success()  # closes
    for _ in range(10):
        assert breaker.allow()
        breaker.success()

    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in records] == [logging.WARNING] + [logging.INFO] * 7
    opened, *probes, closed = (message for _, message in records)
    assert NAME in opened and "RedisError: connection refused" in opened
    assert "retry in 1.0 s" in opened
    for n, (message, wait) in enumerate(zip(probes, [2, 4, 8, 16, 30, 30], strict=True), 2):
        assert NAME in message and "probe failed" in message
        assert "RedisError: still refused" in message
        assert f"next retry in {wait:.1f} s" in message
        assert f"{n} failures in a row" in message
    assert NAME in closed and "back" in closed
    # Paused from the first failure to the probe's success: 1+2+4+8+16+30+30 s, plus 0.5 s.
    assert "91.5 s" in closed
    assert "33 failures" in closed, "every failure while paused: 1 + 20 late + 6 x (1 + 1)"


# -- property test against a reference model ---------------------------------------------------


@dataclass
class Model:
    """The breaker as the brief states it, written as plainly as possible."""

    backoff: Backoff
    state: BreakerState = BreakerState.CLOSED
    until: float = 0.0
    probe_out: bool = False
    failures: int = 0
    total: int = 0
    last_error: str | None = None

    def tick(self, now: float) -> None:
        if self.state is BreakerState.OPEN and now >= self.until:
            self.state = BreakerState.HALF_OPEN

    def reopen(self, now: float) -> None:
        b = self.backoff
        self.state = BreakerState.OPEN
        self.until = now + min(b.max, b.initial * b.multiplier ** (self.failures - 1))
        self.probe_out = False

    def allow(self, now: float) -> bool:
        self.tick(now)
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.HALF_OPEN and not self.probe_out:
            self.probe_out = True
            return True
        return False

    def success(self, now: float) -> None:
        self.tick(now)
        if self.state is BreakerState.CLOSED or self.probe_out:
            self.state = BreakerState.CLOSED
            self.failures = 0
            self.probe_out = False

    def failure(self, now: float, error: str) -> None:
        self.tick(now)
        self.total += 1
        self.last_error = error
        if self.state is BreakerState.CLOSED or self.probe_out:
            self.failures += 1
            self.reopen(now)

    def view(self, now: float) -> BreakerView:
        self.tick(now)
        retry_in = self.until - now if self.state is BreakerState.OPEN else 0.0
        return BreakerView(self.state, self.failures, self.total, retry_in, self.last_error)


class BreakerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.allowed_since_result = 0  # Trues from allow() while half-open, since a result

    @initialize(
        backoff=st.builds(
            Backoff,
            st.sampled_from([0.0, 0.5, 1.0]),
            st.sampled_from([1.0, 1.5, 2.0]),
            st.sampled_from([0.0, 1.0, 5.0]),
        )
    )
    def setup(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.breaker = CircuitBreaker("p[0]", backoff, clock=self.clock)
        self.model = Model(backoff)

    @rule(dt=st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @rule()
    def allow(self) -> None:
        half_open = self.breaker.state is BreakerState.HALF_OPEN
        allowed = self.breaker.allow()
        assert allowed == self.model.allow(self.clock.now)
        if half_open and allowed:
            self.allowed_since_result += 1
        assert self.allowed_since_result <= 1, "one probe per half-open period"

    @rule()
    def success(self) -> None:
        self.breaker.success()
        self.model.success(self.clock.now)
        self.allowed_since_result = 0

    @rule(error=st.sampled_from(["fetch failed", "redis down"]))
    def failure(self, error: str) -> None:
        self.breaker.failure(error)
        self.model.failure(self.clock.now, error)
        self.allowed_since_result = 0

    @invariant()
    def matches_the_model(self) -> None:
        assert self.breaker.view() == self.model.view(self.clock.now)

    @invariant()
    def refuses_while_open(self) -> None:
        if self.breaker.state is BreakerState.OPEN:
            assert not self.breaker.allow()  # no side effect while open

    @invariant()
    def wait_is_bounded(self) -> None:
        assert 0.0 <= self.breaker.view().retry_in <= self.backoff.max


TestBreakerProperties = BreakerMachine.TestCase
TestBreakerProperties.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)

"""A per-partition circuit breaker for infrastructure failures.

When a partition's task fails because of the infrastructure (a fetch failed; Kafka, Redis or
ZooKeeper is unreachable; a bolt's `prepare`/`cleanup` raised; the executor was lost), its
messages are not charged a retry attempt (design: "Failures: whose fault"). The partition is
instead paused behind a `CircuitBreaker`: the driver asks `allow()` before planning it, reports
each of its task results with `success()` or `failure(error)`, and shows `view()` in the progress
table. Pure logic: time comes from an injected clock, the only output is `logging`.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kspout.config import RetryBackoff
from kspout.policy import Backoff

log = logging.getLogger(__name__)


class BreakerState(enum.Enum):
    """Where a partition's circuit breaker is; see `CircuitBreaker`."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class BreakerView:
    """A breaker as the progress table shows it."""

    state: BreakerState
    failures: int  # consecutive infrastructure failures: the n of the current wait
    total_failures: int  # every infrastructure failure since the breaker was made
    retry_in: float  # seconds until a probe is allowed; 0 when not open
    last_error: str | None  # the most recent failure's error, also after the breaker closed


class CircuitBreaker:
    """Pauses one partition while the infrastructure it needs is failing, and probes it back.

    States, and the transitions with their reasons:

        CLOSED      the partition is planned as usual: `allow()` is True
        OPEN        paused until `backoff.delay(n)` seconds after the n-th consecutive failure:
                    `allow()` is False, so a down dependency is not hammered
        HALF_OPEN   the wait has passed: `allow()` is True once, for one probe batch, then
                    False until that probe's result arrives

        CLOSED    --failure-->           OPEN for delay(1)     the dependency looks down (WARNING)
        OPEN      --wait has passed-->   HALF_OPEN             time to try once more (no log line:
                                                               the probe's result is logged)
        HALF_OPEN --allow, first-->      HALF_OPEN, probing    the probe batch is planned
        HALF_OPEN --probe failure-->     OPEN for delay(n+1)   still down: wait longer (INFO)
        HALF_OPEN --probe success-->     CLOSED, n = 0         the dependency is back (INFO)
        CLOSED    --success-->           CLOSED, n = 0         consecutive failures reset

    Results that are not the probe's are late: they belong to batches planned before the breaker
    opened (several batches run at once). So a failure while OPEN, or while HALF_OPEN before the
    probe was handed out, counts in `total_failures` and `last_error` but neither extends the
    wait nor raises n; a success there changes nothing, as one old batch getting through says
    little about the dependency now. Without a batch identity, a late result that arrives while
    the probe runs is taken as the probe's.

    n may grow without limit: `Backoff.delay` never overflows, the wait stays `backoff.max`.
    """

    def __init__(
        self, name: str, backoff: Backoff, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name  # for log lines, e.g. "orders[3]"
        self._backoff = backoff
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0  # consecutive: the n of the current wait
        self._total_failures = 0
        self._last_error: str | None = None
        self._retry_at = 0.0  # when OPEN: the time a probe is allowed
        self._probing = False  # when HALF_OPEN: the probe was handed out, its result not in yet
        self._opened_at = 0.0  # when the breaker last left CLOSED
        self._outage_failures = 0  # failures since then, late ones included

    @classmethod
    def waiting_as(
        cls, name: str, waits: RetryBackoff, clock: Callable[[], float] = time.monotonic
    ) -> CircuitBreaker:
        """A breaker that waits as a config's backoff section says (`[infra_backoff]`)."""
        return cls(name, Backoff(waits.initial, waits.multiplier, waits.max), clock)

    # -- queries -------------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The current state (an OPEN breaker whose wait has passed reads HALF_OPEN)."""
        if self._state is BreakerState.OPEN:
            return self._advance(self._clock())
        return self._state  # no clock read: the driver asks every partition's, every step

    def view(self) -> BreakerView:
        """A snapshot for the progress table."""
        now = self._clock()
        state = self._advance(now)
        retry_in = max(0.0, self._retry_at - now) if state is BreakerState.OPEN else 0.0
        return BreakerView(state, self._failures, self._total_failures, retry_in, self._last_error)

    def allow(self) -> bool:
        """May the partition be planned now? True when CLOSED, and once (the probe) when
        HALF_OPEN; call it only when the partition is about to be planned."""
        if self._state is BreakerState.CLOSED:
            return True
        state = self._advance(self._clock())
        if state is BreakerState.HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    # -- results -------------------------------------------------------------------------------

    def success(self) -> None:
        """A batch of this partition got through the infrastructure (its messages' own outcomes
        do not matter here)."""
        now = self._clock()
        state = self._advance(now)
        if state is BreakerState.CLOSED:
            self._failures = 0
        elif state is BreakerState.HALF_OPEN and self._probing:
            log.info(
                "%s: infrastructure is back; resuming after %.1f s paused (%d failures, last: %s)",
                self.name,
                now - self._opened_at,
                self._outage_failures,
                self._last_error,
            )
            self._state = BreakerState.CLOSED
            self._failures = 0
            self._probing = False
        # else: a late success while paused; see the class docstring.

    def failure(self, error: str) -> None:
        """A batch of this partition failed because of the infrastructure; `error` is one line
        saying what failed (e.g. `kspout.outcomes.describe_error(exc)`)."""
        now = self._clock()
        state = self._advance(now)
        self._total_failures += 1
        self._last_error = error
        if state is BreakerState.CLOSED:
            self._failures = 1
            self._opened_at = now
            self._outage_failures = 1
            delay = self._open(now)
            log.warning(
                "%s: infrastructure failure, pausing the partition: %s; retry in %.1f s",
                self.name,
                error,
                delay,
            )
        elif state is BreakerState.HALF_OPEN and self._probing:
            self._failures += 1
            self._outage_failures += 1
            delay = self._open(now)
            log.info(
                "%s: probe failed (%d failures in a row): %s; next retry in %.1f s",
                self.name,
                self._failures,
                error,
                delay,
            )
        else:  # a late failure while paused; see the class docstring.
            self._outage_failures += 1

    # -- internals -----------------------------------------------------------------------------

    def _open(self, now: float) -> float:
        """Go OPEN for the wait that belongs to the current consecutive-failure count."""
        delay = self._backoff.delay(self._failures)
        self._state = BreakerState.OPEN
        self._retry_at = now + delay
        self._probing = False
        return delay

    def _advance(self, now: float) -> BreakerState:
        """Apply the one time-driven transition, OPEN -> HALF_OPEN, and return the state."""
        if self._state is BreakerState.OPEN and now >= self._retry_at:
            self._state = BreakerState.HALF_OPEN
        return self._state

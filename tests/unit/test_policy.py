"""Retry delays and budgets: the backoff cap holds for any retry count, and an unlimited budget
retries one offset for ever without a crash or a dead letter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kspout.outcomes import FailReason
from kspout.partition_manager import PartitionManager
from kspout.policy import Backoff, PartitionPolicy
from tests.unit import pm_helpers

seconds = st.floats(0.0, 1e6, allow_nan=False)
multipliers = st.floats(1.0, 1e308, allow_nan=False) | st.sampled_from([1.0, 2.0, 10.0])
retries = st.integers(0, 10**9)


@given(st.builds(Backoff, seconds, multipliers, seconds), retries, retries)
def test_backoff_is_monotone_capped_and_never_overflows(
    backoff: Backoff, first: int, second: int
) -> None:
    """`initial * multiplier**(n-1)` as a float raised OverflowError from n = 1025 (multiplier
    2): here any n up to 10**9 and any multiplier >= 1 gives a delay within the cap."""
    low, high = sorted((first, second))
    early, late = backoff.delay(low), backoff.delay(high)
    assert 0.0 <= early <= late <= backoff.max


@pytest.mark.parametrize("retry", [1, 2, 3, 7])
def test_backoff_below_the_cap_is_exact(retry: int) -> None:
    """Below the cap the delay is the plain power, bit for bit (tests compare it exactly)."""
    assert Backoff(0.5, 2.0, 1e9).delay(retry) == 0.5 * 2.0 ** (retry - 1)


def test_backoff_reaches_its_cap_past_the_float_range() -> None:
    backoff = Backoff(0.5, 2.0, 60.0)
    assert backoff.delay(1025) == backoff.delay(10**9) == 60.0
    assert Backoff(0.5, 1e308, 60.0).delay(3) == 60.0


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("max_retries", [None, 10**9], ids=["unlimited", "huge"])
def test_one_offset_fails_thousands_of_times_without_a_crash_or_a_dead_letter(
    max_retries: int | None,
) -> None:
    """A budget past retry 1,025 crashed the driver with OverflowError (in `fail`, and on every
    later plan through `expire`). Here one poison offset fails 3,000 times, by exception and by
    timeout alternately; it is never dead-lettered and the commit point waits for it."""
    clock = Clock()
    policy = PartitionPolicy(max_retries=max_retries, backoff=Backoff(0.5, 2.0, 60.0))
    pm = PartitionManager(policy, 0, clock=clock)
    pm.plan(10, 10)
    pm_helpers.ack_many(pm, range(1, 10))
    for attempt in range(1, 3001):
        if attempt > 1:
            clock.now += policy.backoff.max
            assert pm.plan(10, 10).attempt_of(0) == attempt
        if attempt % 2:
            pm.fail(0, FailReason.EXCEPTION, "poison", attempt=attempt)
        else:
            clock.now += policy.message_timeout
            assert pm.expire() == 1
    stats = pm.stats()
    assert (stats.waiting, stats.dead_letter_pending, stats.skipped) == (1, 0, 0)
    assert (stats.timed_out, stats.commit_point) == (1500, 0)
    assert pm.take_dead_letters() == []

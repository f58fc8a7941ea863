"""`RunLimits`: when `Driver.run` ends besides its stop event, and how."""

from __future__ import annotations

from kspout.driver.run_limits import Ending, RunLimits
from kspout.errors import KafkaAccessDenied

REFUSED = KafkaAccessDenied("User:u", "Read", "t", "127.0.0.1:9092", "t.toml", "revoked")


def test_no_limit_goes_on_whatever_ran_or_failed() -> None:
    assert RunLimits().ending("t", 10**6, 10**6, None) is None


def test_the_batch_budget_ends_the_run_and_lets_running_batches_finish() -> None:
    limits = RunLimits(max_batches=3)
    assert limits.ending("t", 2, 0, None) is None
    assert limits.ending("t", 3, 0, None) is Ending.DONE


def test_more_failures_than_allowed_stop_the_run_soon() -> None:
    limits = RunLimits(max_failures=2)
    assert limits.ending("t", 0, 2, None) is None
    assert limits.ending("t", 0, 3, None) is Ending.SOON


def test_a_refusal_stops_the_run_soon_before_any_budget() -> None:
    assert RunLimits(max_batches=0).ending("t", 0, 0, REFUSED) is Ending.SOON

"""The replay window in pure logic: which bolt declares it, stall episodes in fake time, and
what the warning names as holding the commit point."""

from __future__ import annotations

import logging

import pytest

from dedup import IdempotencyBolt
from kspout.bolts import BasicBolt, BasicCollector, Tuple
from kspout.config import parse_config
from kspout.driver.window import StallWatch, holder
from kspout.executor.topology import Topology
from kspout.outcomes import FailReason
from kspout.partition_manager import PartitionManager
from kspout.policy import Backoff, PartitionPolicy
from kspout.zk.offsets import now_ms
from tests.unit import pm_helpers


class Split(BasicBolt):
    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        """Nothing: only the chain's shape matters here."""


class Forgetful(Split):
    """A bolt that forgets what it finished after 30 s (as the dedup bolt after its ttl)."""

    def replay_window(self) -> float:
        return 30.0


def test_the_chain_takes_the_shortest_window_of_its_bolts() -> None:
    assert Topology.of(lambda r: None).replay_window() is None
    assert Topology.of([Split(), Forgetful()]).replay_window() == 30.0
    config = parse_config({"topic": "t", "spout_id": "s", "dedup": {"ttl": 7.5}})
    dedup = IdempotencyBolt(lambda record, effects: None, config)
    assert dedup.replay_window() == 7.5, "the dedup bolt's window is its [dedup] ttl"
    assert Topology.of(dedup).replay_window() == 7.5


@pytest.fixture
def stuck() -> tuple[PartitionManager, list[float]]:
    """A partition whose offset 2 failed and waits for a retry, with 3-9 acked above it."""
    now = [0.0]
    pm = PartitionManager(PartitionPolicy(backoff=Backoff(60.0, 1.0, 60.0)), 0, lambda: now[0])
    pm.plan(10, 10)
    pm_helpers.ack_many(pm, [0, 1, *range(3, 10)])
    pm.fail(2, FailReason.EXCEPTION, "bad order")
    return pm, now


def test_a_stall_past_half_the_window_warns_once_per_episode(
    stuck: tuple[PartitionManager, list[float]], caplog: pytest.LogCaptureFixture
) -> None:
    pm, now = stuck
    watch = StallWatch("orders", 100.0, lambda: now[0])
    with caplog.at_level(logging.WARNING, "kspout.driver.window"):
        for t in range(0, 200, 5):
            now[0] = float(t)
            watch.observe({0: pm})
        assert watch.stalls == {0: 1}
        assert watch.stuck_for(0, pm) == 195.0
        pm_helpers.ack(pm, 2)  # the commit point moves: the episode ends
        watch.observe({0: pm})
        assert watch.stuck_for(0, pm) is None
        pm.plan(20, 5)
        pm.fail(10, FailReason.EXCEPTION, "again")
        for t in range(200, 300, 5):  # a second episode
            now[0] = float(t)
            watch.observe({0: pm})
    assert watch.stalls == {0: 2}
    assert len(caplog.records) == 2
    assert "orders[0]" in caplog.records[0].getMessage()
    assert "stuck at 2 for 55s" in caplog.records[0].getMessage()


def test_no_window_counts_no_stall(stuck: tuple[PartitionManager, list[float]]) -> None:
    pm, now = stuck
    watch = StallWatch("orders", None, lambda: now[0])
    for t in range(0, 1000, 50):
        now[0] = float(t)
        watch.observe({0: pm})
    assert watch.stalls == {0: 0}


def test_a_caught_up_partition_is_not_stalled() -> None:
    now = [0.0]
    pm = PartitionManager(PartitionPolicy(), 5, lambda: now[0])
    watch = StallWatch("orders", 10.0, lambda: now[0])
    for t in range(100):
        now[0] = float(t)
        watch.observe({0: pm})
    assert watch.stalls == {0: 0} and watch.stuck_for(0, pm) is None


def test_the_warning_says_what_holds_the_commit_point(
    stuck: tuple[PartitionManager, list[float]],
) -> None:
    pm, _ = stuck
    assert holder(pm) == "offset 2, waiting for attempt 2 (exception: bad order)"
    restored = PartitionManager(PartitionPolicy(), 0, finished=[(3, 10)])
    assert holder(restored) == "offset 0, not replayed yet"
    restored.plan(10, 1)
    assert holder(restored) == "offset 0, in flight (attempt 1)"


def test_a_stall_goes_on_across_a_restart(stuck: tuple[PartitionManager, list[float]]) -> None:
    """The record says the commit point has stood at 2 for a minute: with a 100 s window the
    restarted driver reports the stall at its first look, not 50 s later."""
    pm, now = stuck
    watch = StallWatch("orders", 100.0, lambda: now[0])
    watch.seed(0, 2, now_ms() - 60_000)
    watch.observe({0: pm})
    assert watch.stalls == {0: 1}
    stuck_for = watch.stuck_for(0, pm)
    assert stuck_for is not None and stuck_for >= 60.0

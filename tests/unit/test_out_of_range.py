"""OutOfRangeHandler: stale hints are dropped, fresh watermarks decide, `fail` stops one partition.

Kafka is a scripted fake answering `watermarks` (and `offset_for_timestamp`) with the values a
test queues; the PartitionManagers are real, in fake time.
"""

from __future__ import annotations

from typing import cast

import pytest

from kspout.config import TopicConfig
from kspout.driver.breaker import CircuitBreaker
from kspout.driver.out_of_range import OutOfRangeHandler
from kspout.driver.owned import IllegalTransition, OwnedPartition, PartitionState
from kspout.driver.watermarks import WatermarkCache
from kspout.kafka import KafkaMetadata
from kspout.partition_manager import PartitionManager, Span
from tests.unit import pm_helpers

TOPIC = "orders"
P = 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class ScriptedKafka:
    """Answers `watermarks` with queued values, one per call, and records every question."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, int]] = []
        self.asked: list[tuple[str, int]] = []
        self.timestamps: dict[int, int | None] = {}
        self.timestamp_asks: list[tuple[str, int, int]] = []

    def watermarks(self, topic: str, partition: int, *, quick: bool = False) -> tuple[int, int]:
        self.asked.append((topic, partition))
        assert self.answers, "the handler asked Kafka more often than the test expected"
        return self.answers.pop(0)

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        self.timestamp_asks.append((topic, partition, timestamp_ms))
        return self.timestamps.get(timestamp_ms)


class Setup:
    def __init__(self, out_of_range: str = "earliest") -> None:
        self.clock = FakeClock()
        self.kafka = ScriptedKafka()
        metadata = cast(KafkaMetadata, self.kafka)
        self.config = TopicConfig(topic=TOPIC, spout_id="s1", out_of_range=out_of_range)
        self.cache = WatermarkCache(metadata, TOPIC, self.clock)
        self.handler = OutOfRangeHandler(self.config, metadata, self.cache)
        self.part = self.owned(P)
        self.pm = self.part.manager

    def owned(self, partition: int) -> OwnedPartition:
        pm = PartitionManager(
            self.config.partition_policy(), 0, self.clock, topic=TOPIC, partition=partition
        )
        breaker = CircuitBreaker.waiting_as(f"{TOPIC}[{partition}]", self.config.infra_backoff)
        return OwnedPartition(partition, pm, breaker)


@pytest.fixture
def s() -> Setup:
    return Setup()


def test_a_hint_from_an_older_generation_is_dropped(s: Setup) -> None:
    pm = s.pm
    old = pm.plan(100, 100)
    assert old.generation == 0
    # Retention moved past everything planned: reset to earliest, a new generation.
    s.handler.check(s.part, 200, 300)
    assert pm.generation == 1
    assert [r.new_start for _, r in s.handler.resets] == [200]
    new = pm.plan(300, 50)
    assert new.spans == (Span(200, 250, 1),)
    pm_helpers.ack_range(pm, 200, 250)
    assert pm.commit_point == 250

    # A task of the old plan comes back with an out-of-range hint. Kafka would now say
    # (0, 120): acting on it would look "out of range" and reset to 0, replaying acked work.
    s.kafka.answers.append((0, 120))
    s.handler.hint(s.part, old.generation)
    assert s.kafka.asked == [], "a stale hint costs no broker round trip"
    assert pm.generation == 1
    assert len(s.handler.resets) == 1
    assert pm.commit_point == 250
    assert pm.plan(300, 10).spans == (Span(250, 260, 1),), "acked offsets are not replayed"
    assert s.part.stopped is None


def test_a_current_hint_resets_only_if_fresh_watermarks_are_still_out_of_range(
    s: Setup,
) -> None:
    pm = s.pm
    plan = pm.plan(100, 100)
    # The cache holds an answer that is out of range and young: the hint must not trust it.
    s.kafka.answers.append((150, 400))
    assert s.cache.fresh(P) == (150, 400)
    s.kafka.answers.append((0, 400))  # ... Kafka has moved back into range since
    s.handler.hint(s.part, plan.generation)
    assert s.kafka.asked == [(TOPIC, P), (TOPIC, P)], "the hint asked Kafka afresh"
    assert s.handler.resets == []
    assert pm.generation == 0
    assert pm.stats().in_flight == 100

    s.kafka.answers.append((40, 400))  # now retention did take [0, 40)
    s.handler.hint(s.part, plan.generation)
    assert len(s.kafka.asked) == 3
    [(partition, reset)] = s.handler.resets
    assert partition == P
    assert (reset.low, reset.high, reset.new_start) == (40, 400, 40)
    assert reset.lost == ((0, 40),)
    assert pm.commit_point == 40
    assert pm.stats().lost == 40
    assert s.cache.known(P) == (40, 400)


def test_check_in_range_changes_nothing(s: Setup) -> None:
    s.pm.plan(100, 100)
    s.handler.check(s.part, 0, 100)
    assert s.handler.resets == []
    assert s.part.state is PartitionState.RUNNING
    assert s.kafka.asked == []


def test_fail_policy_stops_only_that_partition_with_the_reason() -> None:
    s = Setup(out_of_range="fail")
    pm = s.pm
    plan = pm.plan(100, 100)
    other = s.owned(P + 1)
    other.manager.plan(100, 100)

    s.kafka.answers.append((150, 400))
    s.handler.hint(s.part, plan.generation)  # does not raise
    assert s.part.state is PartitionState.STOPPED
    assert s.part.stopped == "offset 0 is out of range; Kafka holds [150, 400)"
    assert s.handler.resets == []
    assert pm.generation == 0
    assert pm.commit_point == 0
    assert pm.stats().in_flight == 100, "a stopped partition keeps its state for the operator"

    # Further hints for the stopped partition are not even checked; others are unaffected.
    s.handler.hint(s.part, plan.generation)
    assert len(s.kafka.asked) == 1
    s.handler.check(other, 0, 400)
    assert (other.state, other.stopped) == (PartitionState.RUNNING, None)

    s.part.moved()
    assert (s.part.state, s.part.stopped) == (PartitionState.RUNNING, None)
    with pytest.raises(IllegalTransition):
        s.part.moved()  # only a stopped partition can be moved back to running


def test_fail_policy_above_high_names_the_offset_kafka_lacks() -> None:
    s = Setup(out_of_range="fail")
    s.pm.plan(100, 100)
    pm_helpers.ack_range(s.pm, 0, 100)
    s.handler.check(s.part, 0, 60)  # the partition was truncated under us
    assert s.part.stopped == "offset 100 is out of range; Kafka holds [0, 60)"


def test_timestamp_policy_resets_to_the_offset_kafka_names() -> None:
    s = Setup(out_of_range="timestamp:1700000000000")
    pm = s.pm
    pm.plan(100, 100)
    s.kafka.timestamps[1_700_000_000_000] = 170
    s.handler.check(s.part, 150, 400)
    assert s.kafka.timestamp_asks == [(TOPIC, P, 1_700_000_000_000)]
    [(_, reset)] = s.handler.resets
    assert reset.new_start == 170
    assert pm.plan(400, 5).spans == (Span(170, 175, 1),)


def test_timestamp_policy_without_an_answer_falls_back_to_earliest() -> None:
    s = Setup(out_of_range="timestamp:1700000000000")
    s.pm.plan(100, 100)
    s.handler.check(s.part, 150, 400)
    [(_, reset)] = s.handler.resets
    assert reset.new_start == 150, "never a silent jump to latest"

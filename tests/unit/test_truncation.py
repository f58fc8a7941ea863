"""Truncated logs: the partition manager's rollback, and the leader-epoch checks of the driver
and of the streaming source.

Pure logic: real PartitionManagers in fake time; Kafka's answer to OffsetForLeaderEpoch comes
from a scripted probe (the real one is tried against brokers in
tests/chaos/test_truncation.py). The property test runs the manager against the simplest
model of what a rollback must guarantee: after it, every offset from the leader's end of the
epoch up to the new high watermark is handed out again and acked in the new generation before
the commit point passes it, and no outcome of a plan made before counts.
"""

from __future__ import annotations

import logging
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kspout.config import TopicConfig
from kspout.driver.breaker import BreakerState, CircuitBreaker
from kspout.driver.owned import OwnedPartition
from kspout.driver.truncation import TruncationCheck
from kspout.kafka.epochs import EpochProbe, truncated_end
from kspout.outcomes import Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager, Plan
from kspout.policy import PartitionPolicy
from kspout.streaming.positions import StreamOffsets
from kspout.streaming.truncation import EpochCheck
from kspout.zk.record import decode, encode
from tests.unit import pm_helpers


class FakeClock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def manager(start: int = 0, **kwargs: object) -> PartitionManager:
    return PartitionManager(
        PartitionPolicy(), start, FakeClock(), topic="orders", partition=3, **kwargs
    )  # type: ignore[arg-type]


def ack_all(pm: PartitionManager, plan: Plan) -> list[int]:
    """Ack every offset of `plan` in its generation; returns them."""
    acked: list[int] = []
    for span in plan.spans:
        outcome = Outcome(span.start, OutcomeKind.ACK, span.attempt, count=span.end - span.start)
        pm.apply([outcome], generation=plan.generation)
        acked.extend(range(span.start, span.end))
    return acked


def ack_plan(pm: PartitionManager, high: int, max_new: int = 10) -> list[int]:
    """Plan up to `high` and ack everything planned; returns the offsets acked."""
    return ack_all(pm, pm.plan(high, max_new))


# -- the rollback --------------------------------------------------------------------------------


def test_rollback_below_the_commit_point_replans_the_new_messages(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = manager()
    ack_plan(pm, 50, 50)
    pm.saw_epoch(50, 0)
    assert pm.commit_point == 50
    with caplog.at_level(logging.WARNING, "kspout.partition_manager"):
        cut = pm.on_truncation(20, 0, 4)
    assert cut is not None
    assert (cut.end, cut.emitted, cut.start, cut.replaced) == (20, 50, 20, 30)
    assert (pm.commit_point, pm.emitted_to, pm.leader_epoch) == (20, 20, (20, 0))
    assert pm.stats().replaced == 30
    assert "orders[3]: offsets 20-49 were replaced by an unclean leader election" in caplog.text
    assert "(leader epoch 0 -> 4): 30 messages handed out before" in caplog.text
    assert ack_plan(pm, 80, 100) == list(range(20, 80))  # the new messages, none skipped
    assert pm.commit_point == 80


def test_rollback_above_the_commit_point_keeps_nothing_from_old_plans() -> None:
    pm = manager()
    old = pm.plan(40, 40)  # [0, 40) in flight
    pm_helpers.ack_range(pm, 0, 10)
    pm.saw_epoch(40, 1)
    cut = pm.on_truncation(25, 1, 2)
    assert cut is not None and (cut.start, cut.replaced) == (10, 15)
    # The old plan's acks come late: they answered the old log and are ignored.
    pm.apply([Outcome(10, OutcomeKind.ACK, 1, count=30)], generation=old.generation)
    assert pm.commit_point == 10
    assert ack_plan(pm, 30, 100) == list(range(10, 30))


def test_no_rollback_when_the_epoch_reaches_the_anchor() -> None:
    pm = manager()
    ack_plan(pm, 30, 30)
    pm.saw_epoch(30, 0)
    generation = pm.generation
    assert pm.on_truncation(30, 0, 1) is None
    assert pm.on_truncation(45, 0, 1) is None
    assert (pm.commit_point, pm.generation, pm.leader_epoch) == (30, generation, (30, 0))


def test_a_stored_anchor_rolls_back_restored_spans() -> None:
    """At a start: the record said [60, 70) was finished and the anchor is (70, 2); the leader
    ends epoch 2 at 55, so 55..69 hold new messages and are processed."""
    pm = manager(50, finished=[(60, 70)], leader_epoch=(70, 2))
    cut = pm.on_truncation(55, 2, None)
    assert cut is not None and (cut.start, cut.emitted, cut.replaced) == (50, 70, 15)
    assert ack_plan(pm, 75, 100) == list(range(50, 75))


def test_the_anchor_follows_the_highest_record() -> None:
    pm = manager()
    assert pm.leader_epoch is None
    pm.saw_epoch(10, 0)
    pm.saw_epoch(5, 0)  # an earlier task's result, late
    pm.saw_epoch(12, 1)
    assert pm.leader_epoch == (12, 1)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 15), st.booleans()), max_size=8),
    end=st.integers(0, 120),
    extra=st.integers(0, 40),
)
def test_after_a_rollback_every_reused_offset_is_processed(
    steps: list[tuple[int, bool]], end: int, extra: int
) -> None:
    """Any history of plans and acks, then a truncation at `end`: every offset of
    `[end, high)` is planned and acked in the new generation before the commit point passes
    it; the old in-flight plans' outcomes are ignored."""
    pm = manager()
    high = 0
    old_plans = []
    for n, ack in steps:
        high += n
        plan = pm.plan(high, n)
        if ack:
            ack_all(pm, plan)
        else:
            old_plans.append(plan)
    pm.saw_epoch(pm.emitted_to, 0)
    before = pm.commit_point, pm.emitted_to
    end = min(end, before[1])
    cut = pm.on_truncation(end, 0, 1)
    if end >= before[1]:
        assert cut is None
        return
    assert cut is not None and cut.start == min(end, before[0])
    new_high = end + extra
    for plan in old_plans:  # late outcomes of plans made against the old log
        ack_all(pm, plan)
    assert pm.commit_point == cut.start
    processed: list[int] = []
    while pm.commit_point < new_high:
        got = ack_plan(pm, new_high, 7)
        assert got, "the manager stopped planning below the high watermark"
        processed.extend(got)
    assert set(range(end, new_high)) <= set(processed)
    assert pm.stats().replaced == before[1] - end  # the anchor was at `emitted`


# -- the driver's checks -------------------------------------------------------------------------


SILENT = "silent"  # a leader that gives no verdict in time


class ScriptedProbe:
    """Answers `ends_of_epochs` with queued verdicts, one per partition asked, and records
    every question (partition -> anchor)."""

    def __init__(self, *answers: tuple[int, int] | str | None) -> None:
        self.answers = list(answers)
        self.asked: list[dict[int, tuple[int, int]]] = []

    def ends_of_epochs(
        self, anchors: dict[int, tuple[int, int]]
    ) -> dict[int, tuple[int, int] | None]:
        self.asked.append(dict(anchors))
        verdicts = {}
        for p in anchors:
            answer = self.answers.pop(0)
            if answer != SILENT:
                assert not isinstance(answer, str)
                verdicts[p] = answer
        return verdicts

    def close(self) -> None:
        pass


def owned(pm: PartitionManager) -> OwnedPartition:
    config = TopicConfig(topic="orders", spout_id="s1")
    return OwnedPartition(3, pm, CircuitBreaker.waiting_as("orders[3]", config.infra_backoff))


def check(probe: ScriptedProbe) -> TruncationCheck:
    return TruncationCheck(cast(EpochProbe, probe))


def test_a_newer_epoch_is_validated_and_rolls_back() -> None:
    pm = manager()
    ack_plan(pm, 50, 50)
    part, probe = owned(pm), ScriptedProbe((20, 0))
    checker = check(probe)
    checker.fetched(part, pm.generation, (50, 0))  # the first record: nothing to ask
    checker.fetched(part, pm.generation, (50, 0))  # the same epoch: nothing to ask
    assert probe.asked == []
    generation = pm.generation
    checker.fetched(part, generation, (60, 3))  # a new leader wrote
    assert probe.asked == [{3: (50, 0)}]
    assert pm.commit_point == 20 and pm.generation > generation
    assert pm.stats().replaced == 30
    assert pm.leader_epoch == (20, 0)  # what the task fetched lies above the new start
    checker.fetched(part, generation, (70, 3))  # a task planned before the rollback
    assert probe.asked == [{3: (50, 0)}] and pm.leader_epoch == (20, 0)


def test_a_clean_election_moves_the_anchor_up() -> None:
    pm = manager()
    ack_plan(pm, 50, 50)
    part, probe = owned(pm), ScriptedProbe(None)
    checker = check(probe)
    checker.fetched(part, pm.generation, (50, 0))
    checker.fetched(part, pm.generation, (60, 1))
    assert pm.leader_epoch == (60, 1) and pm.stats().replaced == 0


def test_a_stored_anchor_is_checked_once_at_the_first_plan() -> None:
    pm = manager(50, leader_epoch=(50, 2))
    part, probe = owned(pm), ScriptedProbe(None)
    checker = check(probe)
    assert checker.check([(part, 80)]) == set()
    assert checker.check([(part, 80)]) == set()
    assert probe.asked == [{3: (50, 2)}]


def test_offsets_above_high_are_checked_before_the_out_of_range_policy() -> None:
    pm = manager()
    ack_plan(pm, 50, 50)
    part, probe = owned(pm), ScriptedProbe((30, 0))
    checker = check(probe)
    checker.fetched(part, pm.generation, (50, 0))
    assert checker.check([(part, 40)]) == set()  # a new leader with a shorter log
    assert probe.asked == [{3: (50, 0)}] and pm.commit_point == 30


def test_an_unanswered_check_opens_the_breaker_and_asks_again() -> None:
    pm = manager(50, leader_epoch=(50, 2))
    part, probe = owned(pm), ScriptedProbe(SILENT, None)
    checker = check(probe)
    assert checker.check([(part, 80)]) == {3}
    assert part.breaker.state is BreakerState.OPEN
    assert "no answer to a leader epoch check (offset 50, epoch 2)" in str(part.breaker.view())
    assert checker.check([(part, 80)]) == set()
    assert len(probe.asked) == 2


def test_the_partitions_a_plan_starts_are_asked_in_one_question() -> None:
    stored = [manager(50, leader_epoch=(50, 2)) for _ in range(3)]
    parts = [owned(pm) for pm in stored]
    for number, part in enumerate(parts):
        part.number = number
    probe = ScriptedProbe(None, (40, 2), None)
    checker = check(probe)
    assert checker.check([(part, 80) for part in parts]) == set()
    assert probe.asked == [{0: (50, 2), 1: (50, 2), 2: (50, 2)}]
    assert [pm.commit_point for pm in stored] == [50, 40, 50]


# -- librdkafka's verdict and the stored record ----------------------------------------------------


# -- the streaming source: anchors in the checkpoint ---------------------------------------------


def stream_check(probe: ScriptedProbe) -> tuple[EpochCheck, list[tuple[int, int]]]:
    """An `EpochCheck` on `probe`; the list collects what it counts as replaced."""
    replaced: list[tuple[int, int]] = []
    config = TopicConfig(topic="orders", spout_id="s1")
    check = EpochCheck(config, lambda p, n: replaced.append((p, n)), cast(EpochProbe, probe))
    return check, replaced


def test_a_streams_own_anchors_are_asked_only_once_a_newer_leader_took_over() -> None:
    probe = ScriptedProbe(None)
    check, replaced = stream_check(probe)
    made = StreamOffsets({0: 50, 1: 70}, {0: 2, 1: 2})
    check.made(made)
    assert check.truncations(made, {0: 2, 1: 2}) == ({}, set())
    assert probe.asked == []
    assert check.truncations(made, {0: 2, 1: 3}) == ({}, set())  # partition 1 has a new leader
    assert probe.asked == [{1: (70, 2)}]
    assert check.truncations(made, {0: 2, 1: 3}) == ({}, set())  # it stood in epoch 3
    assert len(probe.asked) == 1 and replaced == []


def test_a_checkpoints_truncated_anchor_begins_the_batch_where_the_logs_part(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query started from its checkpoint: offset 50 of partition 0 was read in epoch 2, and
    the new leader's log ends epoch 2 at 20. Offsets 20..49 hold other messages now."""
    probe = ScriptedProbe((20, 2), None)
    check, replaced = stream_check(probe)
    start = StreamOffsets({0: 50, 1: 70}, {0: 2, 1: 2})
    with caplog.at_level(logging.WARNING, "kspout"):
        cuts, unanswered = check.truncations(start, {0: 4, 1: 2})
    assert probe.asked == [{0: (50, 2), 1: (70, 2)}] and unanswered == set()
    assert list(cuts) == [0] and (cuts[0].start, cuts[0].replaced) == (20, 30)
    assert replaced == [(0, 30)]
    assert (
        "orders[0]: offsets 20-49 were replaced by an unclean leader election (leader epoch 2 -> 4)"
        in caplog.text
    )
    # Spark may ask for the same batch again: the same cut, neither asked nor counted again.
    assert check.truncations(start, {0: 4, 1: 2}) == (cuts, set())
    assert len(probe.asked) == 1 and replaced == [(0, 30)]
    assert caplog.text.count("unclean leader election") == 1


def test_a_leader_that_gives_no_verdict_holds_its_partition_and_is_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    probe = ScriptedProbe(SILENT, None)
    check, _ = stream_check(probe)
    start = StreamOffsets({0: 50}, {0: 2})
    with caplog.at_level(logging.WARNING, "kspout"):
        assert check.truncations(start, {0: 3}) == ({}, {0})
    assert "orders[0]: no answer to a leader epoch check (offset 50, epoch 2)" in caplog.text
    assert check.truncations(start, {0: 3}) == ({}, set())
    assert len(probe.asked) == 2


def test_truncated_end_reads_librdkafkas_text() -> None:
    text = (
        "Partition log truncation detected at offset 50 (leader epoch 0): broker end offset is "
        "20 (offset leader epoch 0). Reset to INVALID.: Local: Partition log truncation detected"
    )
    assert truncated_end(text) == (20, 0)
    none_older = (
        "No epoch found less or equal to offset 50 (leader epoch 3): broker end offset is -1 "
        "(offset leader epoch -1). Reset using configured policy.: Local: Partition log "
        "truncation detected"
    )
    assert truncated_end(none_older) == (0, -1)
    assert truncated_end("Fetch position 90 is out of range: Broker: Offset out of range") is None


def test_the_record_keeps_the_anchor_beside_storm_kafkas_fields() -> None:
    raw = encode(
        {
            "topology": {"id": "i", "name": "t"},
            "offset": 50,
            "partition": 3,
            "broker": {"host": "h", "port": 1},
            "topic": "orders",
            "kspout": {"version": 1, "leader_epoch": [50, 2]},
        }
    )
    stored = decode(3, "/p/partition_3", raw, 0, "orders")
    assert (stored.offset, stored.leader_epoch) == (50, (50, 2))
    bad = raw.replace(b"[50,2]", b'"x"')
    assert decode(3, "/p/partition_3", bad, 0, "orders").leader_epoch is None

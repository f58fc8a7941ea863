"""Pure logic of kspout.kafka: span bookkeeping, the fetch loop's reactions, retries, headers,
timestamp lookups.

The fetch-loop tests drive `PartitionFetcher` with a scripted stand-in for the consumer, to
reach orders of events a real broker produces only by chance (low moving mid-fetch).
Everything about real broker behaviour is in tests/integration/test_kafka_io.py.
"""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from kspout.config import parse_config
from kspout.errors import KafkaRequestFailed
from kspout.kafka._client import call_kafka, watermarks
from kspout.kafka.deadletter import letter_headers
from kspout.kafka.fetcher import PartitionFetcher, _Progress, _validated
from kspout.kafka.metadata import KafkaMetadata
from kspout.kafka.records import DeadLetter, FetchResult, Record, RecordBuilder, make_record
from kspout.policy import Position

TOPIC = "t"


def test_record_builder_has_the_layout_of_record() -> None:
    assert RecordBuilder.__slots__ == Record.__slots__
    assert Record.__slots__ == tuple(f.name for f in dataclasses.fields(Record))


def test_make_record_builds_an_ordinary_frozen_record() -> None:
    fast = make_record(TOPIC, 1, 2, b"k", b"v", 3, (("h", b"x"),))
    slow = Record(TOPIC, 1, 2, b"k", b"v", 3, (("h", b"x"),))
    assert fast == slow and hash(fast) == hash(slow) and type(fast) is Record
    assert pickle.loads(pickle.dumps(fast)) == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.offset = 9  # type: ignore[misc]


@pytest.mark.parametrize("spans", [[(5, 5)], [(5, 3)], [(0, 5), (4, 8)], [(6, 8), (0, 2)]])
def test_spans_must_be_sorted_disjoint_and_non_empty(spans: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError, match="sorted, disjoint"):
        _validated(spans)


def test_progress_takes_requested_offsets_once_and_infers_holes() -> None:
    progress = _Progress([(10, 13), (20, 21), (30, 32)])
    assert not progress.take(8)  # a batch member below the request
    assert progress.take(10)
    assert not progress.take(10)  # the same offset again
    assert progress.take(12)  # 11 was skipped by Kafka: missing
    assert not progress.take(15)  # between spans
    assert progress.take(20)
    progress.miss_below(31)  # e.g. the consumer's position moved past a marker at 30
    assert progress.take(31)
    assert progress.done
    assert progress.missing == [(11, 12), (30, 31)]


def test_progress_merges_adjacent_holes_and_plans_reads() -> None:
    progress = _Progress([(0, 2), (2, 4), (3000, 3001)])
    assert progress.read_end(max_gap=1000) == 4  # the far retry is worth a re-position
    progress.miss_below(4)
    assert progress.missing == [(0, 4)]
    assert (progress.cursor, progress.read_end(max_gap=1000)) == (3000, 3001)


class ScriptedConsumer:
    """Plays back consume() batches; records assign() calls; fixed watermarks and position."""

    def __init__(self, batches: list[list[Message]], bounds: tuple[int, int]) -> None:
        self.batches = batches
        self.bounds = bounds
        self.assigned: list[int] = []
        self.position_at = -1001

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append(partitions[0].offset)

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        return self.batches.pop(0) if self.batches else []

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0, self.position_at)]

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        return self.bounds


def record(offset: int) -> Message:
    return Message(topic=TOPIC, partition=0, offset=offset, value=b"%d" % offset, timestamp=(1, 7))


def error(code: int, offset: int) -> Message:
    return Message(topic=TOPIC, partition=0, offset=offset, error=KafkaError(code))


def run(consumer: ScriptedConsumer, spans: list[tuple[int, int]]) -> FetchResult:
    config = parse_config({"topic": TOPIC, "spout_id": "s", "fetch_timeout": 1.0})
    fetcher = PartitionFetcher(config, clock=lambda: 0.0)  # never times out
    fetcher._consumer = consumer  # type: ignore[assignment]
    return fetcher.fetch(TOPIC, 0, spans)


def test_batch_members_below_the_request_are_dropped() -> None:
    consumer = ScriptedConsumer([[record(o) for o in range(0, 8)]], (0, 100))
    result = run(consumer, [(5, 8)])
    assert [r.offset for r in result.records] == [5, 6, 7]
    assert result.missing == [] and result.out_of_range is None


def test_low_moving_mid_fetch_keeps_what_was_read_and_reports_the_range() -> None:
    batches = [[record(40), record(41)], [error(KafkaError._AUTO_OFFSET_RESET, 42)]]
    consumer = ScriptedConsumer(batches, (60, 90))
    result = run(consumer, [(40, 50)])
    assert [r.offset for r in result.records] == [40, 41]
    assert result.out_of_range == (60, 90) and result.missing == []


def test_a_quiet_consumer_past_the_cursor_means_hidden_offsets() -> None:
    consumer = ScriptedConsumer([[record(3)], []], (0, 100))
    consumer.position_at = 6  # librdkafka stepped over markers at 4 and 5
    result = run(consumer, [(3, 6)])
    assert [r.offset for r in result.records] == [3]
    assert result.missing == [(4, 6)]


def test_far_spans_re_position_the_consumer() -> None:
    batches = [[record(1)], [record(5000)]]
    consumer = ScriptedConsumer(batches, (0, 9000))
    result = run(consumer, [(1, 2), (5000, 5001)])
    assert [r.offset for r in result.records] == [1, 5000]
    assert consumer.assigned == [1, 5000]


def test_end_of_partition_below_the_request_is_out_of_range() -> None:
    consumer = ScriptedConsumer(
        [[record(8), record(9), error(KafkaError._PARTITION_EOF, 10)]], (2, 10)
    )
    result = run(consumer, [(8, 12)])
    assert [r.offset for r in result.records] == [8, 9]
    assert result.out_of_range == (2, 10)


def test_transient_errors_are_retried_and_fatal_ones_are_not() -> None:
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return 42

    assert call_kafka("probe", TOPIC, 0, flaky, sleep=lambda _: None) == 42
    assert len(calls) == 3

    def fatal() -> int:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError._FENCED, fatal=True))

    calls.clear()
    with pytest.raises(KafkaRequestFailed, match=r"t\[0\]: probe failed"):
        call_kafka("probe", TOPIC, 0, fatal, sleep=lambda _: None)
    assert len(calls) == 1


def test_retries_are_bounded() -> None:
    def down() -> int:
        raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN))

    with pytest.raises(KafkaRequestFailed, match="gave up after 5 tries") as caught:
        call_kafka("watermark query", TOPIC, 3, down, sleep=lambda _: None)
    assert (caught.value.topic, caught.value.partition) == (TOPIC, 3)


def test_dead_letter_headers_follow_the_original_ones() -> None:
    original = Record(TOPIC, 0, 5, None, b"v", 1, (("a", None),))
    letter = DeadLetter(TOPIC, 0, 5, 3, "timeout", None, original)
    assert letter_headers(letter) == [
        ("a", None),
        ("kspout.source.topic", b"t"),
        ("kspout.source.partition", b"0"),
        ("kspout.source.offset", b"5"),
        ("kspout.attempts", b"3"),
        ("kspout.reason", b"timeout"),
        ("kspout.error", b""),
    ]


class TimeIndex:
    """Answers `offsets_for_times` as a broker's time index would, counting the calls; no other
    method exists but `poll` (a timestamp lookup must not fetch)."""

    def __init__(self, answers: dict[int, int]) -> None:
        self.answers = answers  # timestamp -> offset (-1: no record at or after it)
        self.calls = 0

    def poll(self, timeout: float) -> None:
        """The client's queue, served before each question: empty."""

    def offsets_for_times(self, asked: list[TopicPartition], timeout: float) -> list[Any]:
        self.calls += 1
        (tp,) = asked
        return [TopicPartition(tp.topic, tp.partition, self.answers[tp.offset])]


def test_a_timestamp_lookup_trusts_the_brokers_time_index() -> None:
    """One request each; the broker's "none" (-1) is None, never checked by fetching."""
    metadata = KafkaMetadata(parse_config({"topic": TOPIC, "spout_id": "s"}))
    index = TimeIndex({1000: 7, 5000: -1})
    metadata._consumer = index  # type: ignore[assignment]
    assert metadata.offset_for_timestamp(TOPIC, 0, 1000) == 7
    assert metadata.offset_for_timestamp(TOPIC, 0, 5000) is None
    assert index.calls == 2
    assert (
        metadata.resolve(
            Position.parse("timestamp:5000", allow_fail=False), TOPIC, 0, bounds=(3, 9)
        )
        == 9
    )


class LeaderlessPartition:
    """A consumer whose watermark query says "unknown partition", as librdkafka does for a
    partition without a leader too; its metadata lists partitions 0-3, with `leaders`."""

    def __init__(self, leaders: dict[int, int]) -> None:
        self.leaders = leaders
        self.queries = 0

    def get_watermark_offsets(self, tp: TopicPartition, **_: Any) -> tuple[int, int]:
        self.queries += 1
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION))

    def list_topics(self, topic: str, timeout: float) -> Any:
        partitions = {p: SimpleNamespace(leader=leader) for p, leader in self.leaders.items()}
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions)})


def test_a_partition_without_a_leader_is_retried_and_a_missing_one_is_not() -> None:
    consumer = LeaderlessPartition({0: 1, 1: -1, 2: 1, 3: 1})
    with pytest.raises(KafkaRequestFailed, match=r"had no leader.*gave up after 3 tries"):
        watermarks(consumer, TOPIC, 1, attempts=3)  # type: ignore[arg-type]
    assert consumer.queries == 3
    consumer.queries = 0
    with pytest.raises(KafkaRequestFailed, match="check that the topic and partition exist"):
        watermarks(consumer, TOPIC, 9, attempts=3)  # type: ignore[arg-type]
    assert consumer.queries == 1

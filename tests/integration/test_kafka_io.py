"""kspout.kafka against a real broker: the session stack's Apache Kafka broker (KRaft), over
TCP on loopback."""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, create_topic
from kspout.errors import FetchTimeout
from kspout.kafka import (
    DeadLetter,
    DeadLetterWriter,
    FetchResult,
    KafkaMetadata,
    PartitionFetcher,
    Record,
)
from kspout.policy import Position
from tests.conftest import TopicFactory
from tests.integration.helpers import read_topic

Produce = Callable[..., None]


@pytest.fixture
def brokers(stack: DevStack) -> str:
    """Bootstrap address of the session stack's broker."""
    return stack.info.brokers


@pytest.fixture
def config(brokers: str, topic_name: str) -> TopicConfig:
    return parse_config({"topic": topic_name, "spout_id": f"s-{topic_name}", "brokers": brokers})


@pytest.fixture
def produce(brokers: str) -> Iterator[Produce]:
    """`produce(topic, values, partition=0, **per-message kwargs)`, flushed on return."""
    producer = Producer({"bootstrap.servers": brokers, "linger.ms": 20})

    def send(topic: str, values: list[bytes | None], partition: int = 0, **kwargs: object) -> None:
        for value in values:
            producer.produce(topic, value=value, partition=partition, **kwargs)  # type: ignore[arg-type]
            producer.poll(0)
        assert producer.flush(30) == 0

    yield send
    producer.close()


@pytest.fixture
def fetcher(config: TopicConfig) -> Iterator[PartitionFetcher]:
    with PartitionFetcher(config) as f:
        yield f


@pytest.fixture
def metadata(config: TopicConfig) -> Iterator[KafkaMetadata]:
    with KafkaMetadata(config) as m:
        yield m


def values(n: int, start: int = 0) -> list[bytes | None]:
    return [b"v%d" % i for i in range(start, start + n)]


def offsets(result: FetchResult) -> list[int]:
    return [r.offset for r in result.records]


# -- metadata ---------------------------------------------------------------------------------


def test_partitions_of_missing_and_existing_topics(
    metadata: KafkaMetadata, brokers: str, topic_factory: TopicFactory
) -> None:
    name = topic_factory("later", create=False)
    assert metadata.partitions(name) == []  # asking does not create it
    assert metadata.partitions(name) == []
    create_topic(brokers, name, 3)
    assert metadata.partitions(name) == [0, 1, 2]


def test_watermarks_are_fresh(metadata: KafkaMetadata, produce: Produce, topic_name: str) -> None:
    produce(topic_name, values(5), partition=1)
    assert metadata.watermarks(topic_name, 1) == (0, 5)
    produce(topic_name, values(3), partition=1)
    assert metadata.watermarks(topic_name, 1) == (0, 8)
    assert metadata.watermarks(topic_name, 2) == (0, 0)


def test_timestamps_are_looked_up_in_kafkas_time_index(
    metadata: KafkaMetadata, produce: Produce, topic_name: str
) -> None:
    """Records with explicit timestamps: each lookup is the broker's own answer from its time
    index (no fetch), the first offset at or after the time; none after the newest record."""
    base = int(time.time() * 1000) - 60_000
    for i in range(5):
        produce(topic_name, [b"t%d" % i], timestamp=base + i * 1000)
    # Out of order in partition 2: the first offset (not the earliest time) at or after it.
    for ts in (base, base + 3000, base + 1000, base + 4000):
        produce(topic_name, [b"o"], partition=2, timestamp=ts)

    lookup = functools.partial(metadata.offset_for_timestamp, topic_name)
    assert [lookup(0, t) for t in (0, base, base + 1, base + 1500, base + 4000)] == [0, 0, 1, 2, 4]
    assert lookup(0, base + 4001) is None  # after every record
    assert lookup(1, base) is None  # an empty partition
    assert [lookup(2, t) for t in (base + 500, base + 2000, base + 3001)] == [1, 1, 3]
    assert lookup(2, base + 4001) is None


def test_resolve_for_every_position(
    metadata: KafkaMetadata, produce: Produce, topic_name: str
) -> None:
    base = int(time.time() * 1000) - 60_000
    for i in range(5):
        produce(topic_name, [b"t%d" % i], timestamp=base + i * 1000)

    def resolve(rule: str, partition: int = 0) -> int:
        position = Position.parse(rule, allow_fail=False)
        return metadata.resolve(position, topic_name, partition)

    assert (resolve("earliest"), resolve("latest")) == (0, 5)
    assert resolve(f"timestamp:{base + 2000}") == 2
    assert resolve(f"timestamp:{base + 10_000}") == 5  # nothing that new yet: high
    assert resolve(f"timestamp:{base}", partition=1) == 0  # empty: high, which is low
    with pytest.raises(ValueError, match="fail"):
        metadata.resolve(Position.parse("fail", allow_fail=True), topic_name, 0)


# -- fetch ------------------------------------------------------------------------------------


def test_fetch_returns_exactly_the_requested_offsets_in_order(
    fetcher: PartitionFetcher, produce: Produce, topic_name: str
) -> None:
    produce(topic_name, values(4000))
    # Single retries close together (read through), a range, and far retries (re-position).
    spans = [(3, 4), (10, 11), (12, 13), (100, 600), (2500, 2501), (3998, 3999)]
    result = fetcher.fetch(topic_name, 0, spans)

    want = [o for start, end in spans for o in range(start, end)]
    assert offsets(result) == want
    assert [r.value for r in result.records] == [b"v%d" % o for o in want]
    assert result.missing == [] and result.out_of_range is None
    # The same consumer serves the next call, on another partition too.
    produce(topic_name, values(3), partition=2)
    assert offsets(fetcher.fetch(topic_name, 2, [(0, 3)])) == [0, 1, 2]
    assert fetcher.fetch(topic_name, 0, []) == FetchResult([], [])


def test_fetch_columns_returns_what_fetch_returns_as_columns(
    fetcher: PartitionFetcher, produce: Produce, topic_name: str
) -> None:
    produce(topic_name, values(2000), key=b"k")
    spans = [(3, 4), (10, 12), (100, 600), (1998, 2005)]  # read through, re-position, past high
    rows = fetcher.fetch(topic_name, 0, spans)
    columnar = fetcher.fetch_columns(topic_name, 0, spans)
    columns = columnar.columns
    assert columns is not None and columnar.records == []
    assert columns.partition == 0 and columns.offsets == offsets(rows)
    assert columns.values == [r.value for r in rows.records]
    assert columns.keys == [b"k"] * len(rows.records)
    assert columns.timestamps == [r.timestamp for r in rows.records]
    assert (columnar.missing, columnar.out_of_range) == (rows.missing, (0, 2000))
    assert columnar.reached(0) == rows.reached(0) == 2000


def test_compressed_batches_never_return_offsets_below_the_request(
    brokers: str, fetcher: PartitionFetcher, topic_name: str
) -> None:
    producer = Producer(
        {"bootstrap.servers": brokers, "compression.type": "gzip", "linger.ms": 200}
    )
    for i in range(1000):
        producer.produce(topic_name, value=b"c%d" % i, partition=0)
    assert producer.flush(30) == 0

    result = fetcher.fetch(topic_name, 0, [(517, 520), (700, 701)])
    assert offsets(result) == [517, 518, 519, 700]


def test_record_fields_round_trip(
    fetcher: PartitionFetcher, produce: Produce, topic_name: str
) -> None:
    ts = int(time.time() * 1000) - 5000
    produce(
        topic_name,
        [b"payload"],
        key=b"the-key",
        headers=[("h1", b"one"), ("empty", None), ("h1", b"again")],
        timestamp=ts,
    )
    produce(topic_name, [None])  # a tombstone without key or headers

    first, tombstone = fetcher.fetch(topic_name, 0, [(0, 2)]).records
    assert first == Record(
        topic_name,
        0,
        0,
        b"the-key",
        b"payload",
        ts,
        (("h1", b"one"), ("empty", None), ("h1", b"again")),
    )
    assert (tombstone.offset, tombstone.key, tombstone.value, tombstone.headers) == (
        1,
        None,
        None,
        (),
    )
    assert abs(tombstone.timestamp - time.time() * 1000) < 60_000  # stamped by the producer


def test_transaction_markers_are_reported_missing_without_waiting(
    brokers: str, fetcher: PartitionFetcher, topic_name: str
) -> None:
    producer = Producer({"bootstrap.servers": brokers, "transactional.id": topic_name})
    producer.init_transactions(30)
    for txn in range(3):  # three records, then a commit marker: offsets 3, 7, 11 are markers
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic_name, value=b"x%d%d" % (txn, i), partition=0)
        producer.commit_transaction(30)

    whole = fetcher.fetch(topic_name, 0, [(0, 12)])
    assert offsets(whole) == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert whole.missing == [(3, 4), (7, 8), (11, 12)]
    assert whole.out_of_range is None

    started = time.monotonic()
    only_markers = fetcher.fetch(topic_name, 0, [(3, 4), (11, 12)])
    assert (only_markers.records, only_markers.missing) == ([], [(3, 4), (11, 12)])
    assert only_markers.out_of_range is None
    # Records read past a marker on the way (4-6, 8-10) still tell the log's leader epoch:
    # one leader wrote them all, so it is epoch 0 at a position no higher than the log's end.
    epoch = only_markers.leader_epoch
    assert epoch is None or (epoch[0] <= 12 and epoch[1] == 0), epoch
    assert time.monotonic() - started < 2.0


def test_offsets_at_or_above_high_are_out_of_range(
    fetcher: PartitionFetcher, produce: Produce, topic_name: str
) -> None:
    produce(topic_name, values(10))
    crossing = fetcher.fetch(topic_name, 0, [(7, 12)])
    assert offsets(crossing) == [7, 8, 9]
    assert crossing.out_of_range == (0, 10) and crossing.missing == []

    beyond = fetcher.fetch(topic_name, 0, [(8, 9), (15, 16)])
    assert offsets(beyond) == [8] and beyond.out_of_range == (0, 10)
    assert fetcher.fetch(topic_name, 0, [(10, 11)]) == FetchResult([], [], (0, 10))


def test_offsets_below_low_are_out_of_range(
    fetcher: PartitionFetcher,
    metadata: KafkaMetadata,
    produce: Produce,
    brokers: str,
    topic_name: str,
) -> None:
    """Low moves up as retention would move it: the admin API deletes the records below 60."""
    produce(topic_name, values(100))
    admin = AdminClient({"bootstrap.servers": brokers})
    (deleted,) = admin.delete_records([TopicPartition(topic_name, 0, 60)]).values()
    deleted.result(30)
    low, high = metadata.watermarks(topic_name, 0)
    assert (low, high) == (60, 100)

    assert fetcher.fetch(topic_name, 0, [(0, 5), (low, low + 1)]) == FetchResult(
        [], [], (low, high)
    )
    assert fetcher.fetch(topic_name, 0, [(low - 1, low + 2)]).out_of_range == (low, high)
    inside = fetcher.fetch(topic_name, 0, [(low, low + 3)])
    assert offsets(inside) == [low, low + 1, low + 2] and inside.out_of_range is None


def test_fetch_gives_up_at_the_deadline_naming_the_offset(
    config: TopicConfig, produce: Produce, topic_name: str
) -> None:
    """A clock that jumps 100 s per reading expires the deadline after the first chunk."""
    produce(topic_name, values(12_000))
    clock = itertools.count(0, 100).__next__
    with PartitionFetcher(config, clock=clock) as slow, pytest.raises(FetchTimeout) as caught:
        slow.fetch(topic_name, 0, [(0, 12_000)])
    error = caught.value
    assert (error.topic, error.partition) == (topic_name, 0)
    assert 0 <= error.offset < 12_000  # the first offset not yet fetched
    assert f"offset {error.offset}" in str(error) and "fetch_timeout" in str(error)


# -- dead letters -----------------------------------------------------------------------------


def test_dead_letters_carry_the_original_and_kspout_headers(
    config: TopicConfig, brokers: str
) -> None:
    original = Record(config.topic, 2, 41, b"k", b"body", 1234, (("trace", b"abc"),))
    letters = [
        DeadLetter(config.topic, 2, 41, 6, "retries_exhausted", "ValueError: bad", original),
        DeadLetter(config.topic, 3, 7, 1, "behind", None, None),
    ]
    with DeadLetterWriter(config) as writer:
        writer.write(letters)

    read = read_topic(brokers, config.dlq_topic, expected=2)
    assert len(read) == 2
    by_offset = {dict(m.headers() or [])["kspout.source.offset"]: m for m in read}
    first, second = by_offset[b"41"], by_offset[b"7"]
    assert (first.key(), first.value()) == (b"k", b"body")
    assert first.headers() == [
        ("trace", b"abc"),
        ("kspout.source.topic", config.topic.encode()),
        ("kspout.source.partition", b"2"),
        ("kspout.source.offset", b"41"),
        ("kspout.attempts", b"6"),
        ("kspout.reason", b"retries_exhausted"),
        ("kspout.error", b"ValueError: bad"),
    ]
    assert (second.key(), second.value()) == (None, None)
    assert dict(second.headers() or []) == {
        "kspout.source.topic": config.topic.encode(),
        "kspout.source.partition": b"3",
        "kspout.source.offset": b"7",
        "kspout.attempts": b"1",
        "kspout.reason": b"behind",
        "kspout.error": b"",
    }
    assert config.dlq_topic == f"{config.topic}.dlq"

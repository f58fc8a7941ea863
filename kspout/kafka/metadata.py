"""Partitions, watermarks and timestamps of a topic, and where a rule-chosen position lies.

The driver asks these questions when it plans (high watermark), starts a partition (`start`)
and handles out-of-range (`out_of_range`). Each answer comes fresh from the broker, with
transient errors retried a bounded number of times. Watermarks of many partitions are asked in
one batched query (`watermarks_of`, `watermarks_now`): a request per leader, not per partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kspout.config import TopicConfig
from kspout.errors import KafkaRequestFailed, TopicNotFound
from kspout.kafka._client import (
    REQUEST_TIMEOUT,
    BrokerReports,
    all_watermarks,
    call_kafka,
    connect,
    watermarks,
)
from kspout.kafka.access import access_denied
from kspout.lifecycle import Lifecycle
from kspout.policy import Position, PositionKind

# Seconds a `quick` watermark query may take (the driver loop's; its breaker retries).
QUICK_TIMEOUT = 1.0

Bounds = dict[int, tuple[int, int]]  # partition -> (low, high)


class KafkaMetadata(Lifecycle):
    """Metadata questions about a topic's partitions, answered through one consumer."""

    def __init__(self, config: TopicConfig) -> None:
        self._config = config
        self._consumer: Consumer | None = None
        self._reports = BrokerReports()

    def start(self) -> None:
        """Connect: `KafkaUnreachable` when no broker answers (`connect`)."""
        if self._consumer is None:
            self._consumer = connect(self._config, self._reports)

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _client(self) -> Consumer:
        """The consumer, once its queue is served: `KafkaLoginRefused` when a broker refused
        its login since (the password changed while it ran), which no retry cures."""
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("KafkaMetadata.start() was not called")
        consumer.poll(0)  # librdkafka's log lines and errors, the error callback among them
        self._reports.raise_refused(self._config)
        return consumer

    def require_topic(self, topic: str) -> list[int]:
        """`partitions`, or `TopicNotFound` when the topic does not exist: every command
        about a topic refuses a missing (misspelled) one this way."""
        found = self.partitions(topic)
        if not found:
            config = self._config
            raise TopicNotFound(topic, config.brokers, config.path, config.origin("brokers"))
        return found

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition ids, sorted; [] while the topic does not exist.
        `KafkaAccessDenied` when the principal may not Describe it."""
        consumer = self._client()

        def query() -> list[int]:
            metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT)
            found = metadata.topics.get(topic)
            if found is None:
                return []
            if found.error is not None:
                if found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    return []
                if found.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise access_denied(self._config, "Describe", topic, found.error.str())
                raise KafkaException(found.error)
            return sorted(found.partitions)

        return call_kafka("metadata request", topic, None, query)

    def leaders(self, topic: str) -> dict[int, tuple[str, int]]:
        """Each partition's leader as `(host, port)`: storm-kafka records it beside the offset."""
        consumer = self._client()

        def query() -> dict[int, tuple[str, int]]:
            metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT)
            found = metadata.topics.get(topic)
            if found is None or found.error is not None:
                return {}
            brokers = {b.id: (b.host, b.port) for b in metadata.brokers.values()}
            return {p: brokers.get(info.leader, ("", -1)) for p, info in found.partitions.items()}

        return call_kafka("metadata request", topic, None, query)

    def watermarks(self, topic: str, partition: int, *, quick: bool = False) -> tuple[int, int]:
        """`(low, high)`: the first offset Kafka still has, and the next one to be written.

        `quick` asks once, for at most `QUICK_TIMEOUT` seconds: for a loop that has a breaker
        of its own and must not wait a minute on one partition's missing leader.
        """
        if quick:
            return watermarks(self._client(), topic, partition, timeout=QUICK_TIMEOUT, attempts=1)
        return watermarks(self._client(), topic, partition)

    def watermarks_of(
        self, topic: str, partitions: Iterable[int], *, epochs: dict[int, int] | None = None
    ) -> Bounds:
        """`(low, high)` of each of `partitions`, in one batched query (two requests per
        partition leader, however many partitions it leads); `KafkaRequestFailed` when any
        partition has no answer after the retries. `epochs`, when given, is filled with the
        leader epoch each leader sent with its high (`all_watermarks`)."""
        return all_watermarks(self._client(), topic, partitions, epochs=epochs)

    def watermarks_now(
        self, topic: str, partitions: Iterable[int], lows: Mapping[int, int] | None = None
    ) -> tuple[Bounds, dict[int, KafkaRequestFailed]]:
        """`watermarks_of` asked once, for at most `QUICK_TIMEOUT`, for a loop whose
        per-partition breakers decide when to ask again: the answers, and for each partition
        without one, why. Partitions in `lows` are asked their high only (`all_watermarks`).

        A batched query fails whole when one leader does not answer, so then each leader's
        partitions are asked apart: a broker that is down holds back only what it leads.
        """
        consumer, asked = self._client(), sorted(set(partitions))

        def ask(group: list[int]) -> Bounds:
            return all_watermarks(
                consumer, topic, group, timeout=QUICK_TIMEOUT, attempts=1, lows=lows
            )

        try:
            return ask(asked), {}
        except KafkaRequestFailed as exc:
            groups = self._by_leader(topic, asked)
            if len(groups) < 2:
                return {}, dict.fromkeys(asked, exc)
        found: Bounds = {}
        failed: dict[int, KafkaRequestFailed] = {}
        for group in groups:
            try:
                found.update(ask(group))
            except KafkaRequestFailed as exc:
                failed.update(dict.fromkeys(group, exc))
        return found, failed

    def _by_leader(self, topic: str, partitions: list[int]) -> list[list[int]]:
        """`partitions` grouped by their leader's broker id (those without one together);
        [] when the metadata request fails too (nothing to tell the leaders apart by)."""
        try:
            found = self._client().list_topics(topic, timeout=QUICK_TIMEOUT).topics.get(topic)
        except KafkaException:
            return []
        leaders = {} if found is None else {p: info.leader for p, info in found.partitions.items()}
        groups: dict[int | None, list[int]] = {}
        for p in partitions:
            groups.setdefault(leaders.get(p), []).append(p)
        return list(groups.values())

    def offset_for_timestamp(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The first offset whose record has a timestamp >= `timestamp_ms`; None if none has.

        Kafka answers from the partition's time index (every broker since 0.10.1 keeps one;
        kspout needs newer ones anyway), one ListOffsets request to the leader. Its answer is
        trusted: "none" (offset -1) means every record the partition holds is older, or it holds
        none. With `LogAppendTime` the index holds the broker's append times, so the lookup is by
        those, as every Kafka client's is.
        """
        consumer = self._client()

        def query() -> int:
            asked = TopicPartition(topic, partition, timestamp_ms)
            (answer,) = consumer.offsets_for_times([asked], timeout=REQUEST_TIMEOUT)
            if answer.error is not None:
                raise KafkaException(answer.error)
            return answer.offset

        offset = call_kafka("timestamp lookup", topic, partition, query)
        return offset if offset >= 0 else None

    def resolve(
        self,
        position: Position,
        topic: str,
        partition: int,
        *,
        bounds: tuple[int, int] | None = None,
    ) -> int:
        """The offset a rule-chosen position stands for, right now.

        `earliest` is low, `latest` is high. `timestamp:<ms>` is the first offset at or after
        that time; when every record Kafka holds is older, it is high: the next record written
        is the first one at or after that time, so nothing at or after it is skipped (this is
        not a jump past data). `fail` has no offset: ValueError. `bounds`: the partition's
        `(low, high)` just asked (with others, by `watermarks_of`), so they are not asked again.
        """
        if position.kind is PositionKind.FAIL:
            raise ValueError("the `fail` position names no offset; the caller must stop")
        low, high = bounds if bounds is not None else self.watermarks(topic, partition)
        if position.kind is PositionKind.EARLIEST:
            return low
        if position.kind is PositionKind.LATEST:
            return high
        assert position.timestamp_ms is not None  # parse() sets it for TIMESTAMP
        found = self.offset_for_timestamp(topic, partition, position.timestamp_ms)
        return high if found is None else found

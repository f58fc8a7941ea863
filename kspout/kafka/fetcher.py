"""Fetch exactly the planned offsets of one partition: a big new range plus single retries.

The driver plans offsets; executors fetch them here. A fetch returns each requested offset at
most once and never one outside the request, even though Kafka hands back whole (compressed)
batches that start below the offset asked for: storm-kafka emitted those twice, kspout skips
them. Offsets Kafka does not have although they are inside `[low, high)` (compacted away,
transaction markers) are reported as `missing`; offsets outside it as `out_of_range`, left to
the partition's policy.

Every result names the leader epoch of the highest record it fetched (`FetchResult.leader_epoch`,
read once per consume call, not per message): the driver checks it against Kafka to find a log
an unclean leader election truncated (`kspout.kafka.epochs`).

Out of range is learnt from the fetch itself, with no watermark query up front: below low (or
above high) the broker answers the first fetch with OFFSET_OUT_OF_RANGE, which librdkafka
hands over as `_AUTO_OFFSET_RESET` (kspout sets `auto.offset.reset=error`); at high it reports
end-of-partition. Only then are fresh watermarks read, for the `(low, high)` of the result. A
query before every fetch would cost the same round trip on every call instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kspout.config import TopicConfig
from kspout.errors import FetchTimeout, KafkaRequestFailed
from kspout.gc_pause import cyclic_gc_paused
from kspout.kafka._client import BrokerReports, consumer_settings, watermarks
from kspout.kafka.access import access_denied
from kspout.kafka.records import FetchResult, Record, RecordBuilder, RecordColumns, make_record
from kspout.lifecycle import Lifecycle
from kspout.ranges import append

log = logging.getLogger(__name__)

# Re-positioning the consumer (assign at a new offset) costs one fetch round trip, about
# 2.5 ms against a broker on loopback and more across a network, while reading a record we
# then drop costs about 3 us. Below ~1000 offsets reading through the gap is cheaper.
SEEK_GAP = 1000
# Messages per consume() call: large enough that the per-call cost vanishes, small enough
# that one call does not hold tens of MB of messages at once.
PER_CONSUME = 5000
# How long one consume() call may wait when fewer messages than asked for arrive (holes,
# transaction markers at the end of a span): the price of detecting a hole, paid at most
# once per consume call that comes up short.
IDLE_SLICE = 0.05


def _validated(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans as a list, after checking they are sorted, disjoint and non-empty."""
    result: list[tuple[int, int]] = []
    previous_end = 0
    for start, end in spans:
        if start < previous_end or end <= start:
            raise ValueError(
                f"spans must be sorted, disjoint, non-empty [start, end) ranges of offsets "
                f">= 0; got {list(spans)!r}"
            )
        result.append((start, end))
        previous_end = end
    return result


class _Progress:
    """Where a fetch stands in its requested spans; pure bookkeeping, no I/O.

    `cursor` is the next requested offset not yet accounted for, in span `index` that ends at
    `end`. Every requested offset below `cursor` was either returned or put in `missing`.
    Records arrive in offset order, so a record (or end-of-partition, or a consumer position)
    at offset `o` proves Kafka holds nothing in `[cursor, o)`.
    """

    __slots__ = ("cursor", "end", "index", "missing", "spans")

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = spans
        self.index = 0
        self.cursor, self.end = spans[0]
        self.missing: list[tuple[int, int]] = []

    @property
    def done(self) -> bool:
        return self.index == len(self.spans)

    def read_end(self, max_gap: int) -> int:
        """Where a contiguous read from `cursor` should stop: the end of the span after
        which the next gap is larger than `max_gap` (worth a re-position instead)."""
        end = self.end
        for start, span_end in self.spans[self.index + 1 :]:
            if start - end > max_gap:
                break
            end = span_end
        return end

    def miss_below(self, offset: int) -> None:
        """Kafka holds nothing at `[cursor, offset)`: mark those requested offsets missing."""
        while self.index < len(self.spans) and self.cursor < offset:
            stop = min(offset, self.end)
            append(self.missing, self.cursor, stop)
            self.cursor = stop
            if stop == self.end:
                self._next_span()

    def take(self, offset: int) -> bool:
        """A record at `offset` arrived: True when it was requested and not yet returned."""
        if offset < self.cursor:
            return False  # below what we asked for: an earlier batch member, or a repeat
        self.miss_below(offset)
        if self.index == len(self.spans) or offset != self.cursor:
            return False  # between two spans, or past the last one
        self.cursor = offset + 1
        if self.cursor == self.end:
            self._next_span()
        return True

    def _next_span(self) -> None:
        self.index += 1
        if self.index < len(self.spans):
            self.cursor, self.end = self.spans[self.index]


def _record(topic: str, partition: int, offset: int, msg: Message) -> Record:
    headers = msg.headers()
    kind, timestamp = msg.timestamp()
    return make_record(
        topic,
        partition,
        offset,
        msg.key(),
        msg.value(),
        timestamp,
        tuple(headers) if headers else (),  # type: ignore[arg-type]
        kind - 1,  # confluent-kafka's TIMESTAMP_* constants are Kafka's ids plus one
    )


def _last_epoch(msgs: list[Message], epoch: tuple[int, int] | None) -> tuple[int, int] | None:
    """`(offset + 1, leader epoch)` of the last record among `msgs` whose epoch the broker
    sent, else `epoch` (records arrive in offset order)."""
    for msg in reversed(msgs):
        if msg.error() is None:
            leader_epoch, offset = msg.leader_epoch(), msg.offset()
            if leader_epoch is not None and leader_epoch >= 0 and offset is not None:
                return (offset + 1, leader_epoch)
    return epoch


class PartitionFetcher(Lifecycle):
    """Fetches planned offsets of one topic through one assigned consumer, reused per call.

    Not thread-safe: one fetcher per Python worker, one fetch at a time.
    """

    def __init__(self, config: TopicConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._consumer: Consumer | None = None
        self._reports = BrokerReports()

    def start(self) -> None:
        if self._consumer is None:
            settings = consumer_settings(self._config) | {"error_cb": self._reports}
            self._consumer = Consumer(settings)

    def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def fetch(self, topic: str, partition: int, spans: Sequence[tuple[int, int]]) -> FetchResult:
        """Fetch the offsets in `spans` (sorted, disjoint, half-open `[start, end)` ranges).

        Raises FetchTimeout when the spans are not settled within `fetch_timeout` seconds,
        KafkaRequestFailed when the broker fails for good, `KafkaAccessDenied` when the
        principal may not Read the topic, `KafkaLoginRefused` when a broker refused the login
        (a password changed while the consumer ran: its next login is refused).
        """
        return self._fetch(topic, partition, spans, None)

    def fetch_columns(
        self, topic: str, partition: int, spans: Sequence[tuple[int, int]]
    ) -> FetchResult:
        """`fetch`, with the records as columns (`FetchResult.columns`) and no `Record` built
        per message: a columnar first stage's input, at about half the cost."""
        columns = RecordColumns(partition, [], [], [], [])
        return replace(self._fetch(topic, partition, spans, columns), columns=columns)

    def _fetch(
        self,
        topic: str,
        partition: int,
        spans: Sequence[tuple[int, int]],
        columns: RecordColumns | None,
    ) -> FetchResult:
        if self._consumer is None:
            raise RuntimeError("PartitionFetcher.start() was not called")
        wanted = _validated(spans)
        if not wanted:
            return FetchResult([], [])
        try:
            with cyclic_gc_paused():
                return self._read(self._consumer, topic, partition, wanted, columns)
        finally:
            # Stop prefetching: an idle assigned partition would fill librdkafka's queue
            # (up to 64 MB) and long-poll the broker at high for nothing.
            self._consumer.unassign()

    def _read(
        self,
        consumer: Consumer,
        topic: str,
        partition: int,
        spans: list[tuple[int, int]],
        columns: RecordColumns | None,
    ) -> FetchResult:
        """Consume `PER_CONSUME` messages at a time until every offset in `spans` is returned or
        known missing. With `columns` the records go there, as columns, instead of the result's
        `records`."""
        timeout = self._config.fetch_timeout
        deadline = self._clock() + timeout
        progress = _Progress(spans)
        records: list[Any] = []
        append = records.append
        if columns is not None:
            add_offset, add_key = columns.offsets.append, columns.keys.append
            add_value, add_timestamp = columns.values.append, columns.timestamps.append
        build = RecordBuilder
        stream = -1  # the offset the consumer delivers next; -1 forces the first assign
        read_end = 0
        epoch: tuple[int, int] | None = None  # FetchResult.leader_epoch
        while not progress.done:
            if progress.cursor - stream > SEEK_GAP or stream < 0:
                consumer.assign([TopicPartition(topic, partition, progress.cursor)])
                stream = progress.cursor
            if stream >= read_end:
                read_end = progress.read_end(SEEK_GAP)
            wanted = max(1, min(PER_CONSUME, read_end - stream))
            msgs = consumer.consume(wanted, IDLE_SLICE)
            self._reports.raise_refused(self._config)  # `consume` served the error callback
            epoch = _last_epoch(msgs, epoch)
            cursor, last = progress.cursor, progress.end - 1
            for msg in msgs:
                offset = msg.offset()
                if offset == cursor and offset < last and msg.error() is None:
                    # Hot path: the next requested offset, not the last of its span.
                    if columns is not None:
                        add_offset(offset)
                        add_key(msg.key())
                        add_value(msg.value())
                        add_timestamp(msg.timestamp()[1])
                        cursor = stream = offset + 1
                        continue
                    headers = msg.headers()
                    kind, timestamp = msg.timestamp()
                    record = build(
                        topic,
                        partition,
                        offset,
                        msg.key(),
                        msg.value(),
                        timestamp,
                        tuple(headers) if headers else (),  # type: ignore[arg-type]
                        kind - 1,  # as in `_record`
                    )
                    record.__class__ = Record  # type: ignore[assignment]
                    append(record)
                    cursor = stream = offset + 1
                    continue
                progress.cursor = cursor
                error = msg.error()
                if error is None:
                    if offset is not None:  # always set on a record
                        if progress.take(offset):
                            found = _record(topic, partition, offset, msg)
                            if columns is None:
                                append(found)
                            else:
                                columns.add(found)
                        stream = offset + 1
                elif error.code() == KafkaError._AUTO_OFFSET_RESET:
                    bounds = watermarks(consumer, topic, partition)
                    return FetchResult(records, progress.missing, bounds, epoch)
                elif error.code() == KafkaError._PARTITION_EOF:
                    if offset is not None:  # high: everything below it was delivered
                        progress.miss_below(offset)
                        stream = offset
                        if not progress.done:  # the rest is at or above high
                            bounds = watermarks(consumer, topic, partition)
                            if progress.cursor >= bounds[1]:
                                return FetchResult(records, progress.missing, bounds, epoch)
                            # else records arrived since; the consumer is fetching them
                elif error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    raise access_denied(self._config, "Read", topic, error.str())
                elif error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    # librdkafka looks up the coordinator of the group every consumer must
                    # name, which kspout never joins nor commits to: no ACL is needed for it.
                    log.debug("%s[%d]: %s (the group is not used)", topic, partition, error)
                elif error.fatal():
                    raise KafkaRequestFailed(
                        "fetch", topic, partition, str(error), "the client cannot continue"
                    )
                else:  # librdkafka retries these itself; the deadline bounds the wait
                    log.warning("%s[%d]: fetch error (retrying): %s", topic, partition, error)
                cursor, last = progress.cursor, progress.end - 1
                if progress.done:
                    break
            progress.cursor = cursor
            if progress.done:
                break
            if len(msgs) < wanted:
                stream = max(stream, self._skip_past_hidden(consumer, topic, partition, progress))
            if self._clock() >= deadline and not progress.done:
                raise FetchTimeout(topic, partition, progress.cursor, timeout)
        return FetchResult(records, progress.missing, None, epoch)

    @staticmethod
    def _skip_past_hidden(
        consumer: Consumer, topic: str, partition: int, progress: _Progress
    ) -> int:
        """The consumer went quiet: offsets it moved past without a message do not exist.

        librdkafka advances its position over transaction markers without delivering them.
        Returns the position (or -1 when it is not known yet).
        """
        position = consumer.position([TopicPartition(topic, partition)])[0].offset
        if position > progress.cursor:
            progress.miss_below(position)
        return position

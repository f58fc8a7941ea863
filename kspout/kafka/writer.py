"""Write messages to a topic and wait until Kafka acknowledged each: what `kspout produce` does.

The producer is kspout's idempotent one (acks=all, `fetch_timeout` as the delivery timeout), so
a send librdkafka retries is never written twice. Delivery reports are summed per partition as
they arrive: a million messages cost a few counters, not a list.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message

from kspout.config import TopicConfig
from kspout.errors import ProduceFailed
from kspout.kafka.deadletter import FLUSH_MARGIN, IdempotentProducer


@dataclass(slots=True)
class Written:
    """What one partition received: how many messages, at which offsets (None: none)."""

    partition: int
    messages: int = 0
    first_offset: int | None = None
    last_offset: int | None = None

    def add(self, offset: int) -> None:
        self.messages += 1
        if self.first_offset is None or offset < self.first_offset:
            self.first_offset = offset
        if self.last_offset is None or offset > self.last_offset:
            self.last_offset = offset


class TopicWriter(IdempotentProducer):
    """Writes `(key, value)` messages to the config's topic; the partitioner picks each one's
    partition from its key (librdkafka's default: a hash of the key, random without one)."""

    def __init__(self, config: TopicConfig) -> None:
        super().__init__(config, "produce")
        self._written: dict[int, Written] = {}
        self._failed = 0
        self._error: str | None = None

    def write(self, messages: Iterable[tuple[bytes | None, bytes]]) -> dict[int, Written]:
        """Produce every message, wait for Kafka's acknowledgements, and return what each
        partition received. Raises ProduceFailed when Kafka refused any (queuing stops at the
        first refusal it reports at once, such as a message too large)."""
        if self._producer is None:
            raise RuntimeError("TopicWriter.start() was not called")
        producer = self._producer
        for key, value in messages:
            try:
                self._queue(key, value)
            except KafkaException as exc:
                self._refused(exc.args[0])
                break
            producer.poll(0)
        producer.flush(self._config.fetch_timeout + FLUSH_MARGIN)
        if self._error is not None or len(producer):
            written = sum(w.messages for w in self._written.values())
            failed = self._failed + len(producer)
            error = self._error or "no delivery report before the timeout"
            raise ProduceFailed(self._config.topic, written, failed, error)
        return dict(sorted(self._written.items()))

    def _queue(self, key: bytes | None, value: bytes) -> None:
        """Queue one message; while librdkafka's queue is full, serve reports and retry."""
        assert self._producer is not None
        while True:
            try:
                self._producer.produce(
                    self._config.topic, key=key, value=value, on_delivery=self._report
                )
                return
            except BufferError:
                self._producer.poll(0.1)

    def _report(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._refused(error)
            return
        partition, offset = message.partition(), message.offset()
        assert partition is not None and offset is not None  # set on every acknowledged one
        self._written.setdefault(partition, Written(partition)).add(offset)

    def _refused(self, error: KafkaError) -> None:
        self._failed += 1
        if self._error is None:
            self._error = error.str()

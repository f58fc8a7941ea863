"""Write given-up offsets to the dead-letter topic (`dead_letter_topic`, default `<topic>.dlq`).

A dead letter copies the original key and value (when Kafka still has the message) and adds
headers naming where it came from and why it was given up, so an operator can inspect or
replay it. `write` returns only once Kafka acknowledged every letter: the caller may then count
those offsets finished; on any failure none of them may be. A write the cluster refused this
principal (no Write ACL on the dead-letter topic, or no right to create it) raises
`KafkaAccessDenied`: no retry cures that, so the run stops instead of trying for ever.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kspout.config import TopicConfig
from kspout.errors import DeadLetterWriteFailed
from kspout.kafka._client import client_settings
from kspout.kafka.access import refusal
from kspout.kafka.records import DeadLetter
from kspout.lifecycle import Lifecycle

HEADER_PREFIX = "kspout."
# The headers every dead letter carries after the original ones (utf-8 text).
SOURCE_TOPIC = HEADER_PREFIX + "source.topic"
SOURCE_PARTITION = HEADER_PREFIX + "source.partition"
SOURCE_OFFSET = HEADER_PREFIX + "source.offset"
ATTEMPTS = HEADER_PREFIX + "attempts"
REASON = HEADER_PREFIX + "reason"
ERROR = HEADER_PREFIX + "error"  # the last error; empty when there was none
LETTER_HEADERS = (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET, ATTEMPTS, REASON, ERROR)
# The traceback of the last failure, when user code raised (at most TRACEBACK_LIMIT
# characters, kspout.outcomes); absent otherwise.
TRACEBACK = HEADER_PREFIX + "traceback"
# flush() waits this much longer than librdkafka's own delivery timeout, so every letter has
# a delivery report (success or failure) by the time it returns.
FLUSH_MARGIN = 5.0


def letter_headers(letter: DeadLetter) -> list[tuple[str, str | bytes | None]]:
    """The original headers, then kspout's: source topic, partition, offset, attempts, reason,
    error (utf-8 strings; an absent error is an empty string), and the traceback when user
    code raised."""
    original: list[tuple[str, str | bytes | None]] = []
    if letter.record is not None:
        original.extend(letter.record.headers)
    ours = {
        SOURCE_TOPIC: letter.topic,
        SOURCE_PARTITION: str(letter.partition),
        SOURCE_OFFSET: str(letter.offset),
        ATTEMPTS: str(letter.attempts),
        REASON: letter.reason,
        ERROR: letter.error or "",
    }
    if letter.traceback:
        ours[TRACEBACK] = letter.traceback
    return original + [(name, value.encode()) for name, value in ours.items()]


class IdempotentProducer(Lifecycle):
    """An idempotent producer with acks=all (a retried send is never doubled), opened by
    `start()`; `close()` waits for what is still queued. `role` names it in `client.id`."""

    def __init__(self, config: TopicConfig, role: str) -> None:
        self._config = config
        self._role = role
        self._producer: Producer | None = None

    def start(self) -> None:
        if self._producer is None:
            settings = client_settings(
                self._config,
                **{
                    "client.id": f"kspout-{self._config.spout_id}-{self._role}",
                    "enable.idempotence": True,
                    "acks": "all",
                    "message.timeout.ms": int(self._config.fetch_timeout * 1000),
                },
            )
            self._producer = Producer(settings)

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._config.fetch_timeout + FLUSH_MARGIN)

    def produce(self, topic: str, **message: Any) -> None:
        """Queue one message; while librdkafka's queue is full, serve deliveries and retry.
        `KafkaRefused` when the producer already knows this principal may not write `topic`
        (librdkafka then refuses the send at once, before any delivery report)."""
        if self._producer is None:
            raise RuntimeError(f"{type(self).__name__}.start() was not called")
        while True:
            try:
                self._producer.produce(topic, **message)
                return
            except BufferError:  # local queue full: serve delivery reports, then retry
                self._producer.poll(0.1)
            except KafkaException as exc:
                found = refusal(self._config, exc.args[0], "Write", topic)
                if found is None:
                    raise
                raise found from None


class DeadLetterWriter(IdempotentProducer):
    """Writes dead letters to the dead-letter topic."""

    def __init__(self, config: TopicConfig) -> None:
        super().__init__(config, "dlq")
        self._topic = config.dlq_topic

    def write(self, letters: Sequence[DeadLetter]) -> None:
        """Produce every letter and wait for Kafka's acknowledgements.

        Raises DeadLetterWriteFailed naming each letter Kafka did not acknowledge, or
        `KafkaRefused` when Kafka refused this principal the write.
        """
        if self._producer is None:
            raise RuntimeError("DeadLetterWriter.start() was not called")
        producer = self._producer
        errors: dict[int, str | None] = {}  # letter index -> None when acknowledged
        refused: list[Exception] = []  # the refusal that no retry cures, once found

        def report(index: int, error: KafkaError | None, _msg: Message) -> None:
            errors[index] = None if error is None else str(error)
            if error is not None and not refused:
                found = refusal(self._config, error, "Write", self._topic)
                if found is not None:
                    refused.append(found)

        for index, letter in enumerate(letters):
            original = letter.record
            self.produce(
                self._topic,
                key=original.key if original is not None else None,
                value=original.value if original is not None else None,
                headers=letter_headers(letter),
                on_delivery=functools.partial(report, index),
            )
        producer.flush(self._config.fetch_timeout + FLUSH_MARGIN)
        if refused:
            raise refused[0]
        failures: list[tuple[str, int, int, str]] = []
        for index, letter in enumerate(letters):
            error = errors.get(index, "no delivery report before the timeout")
            if error is not None:
                failures.append((letter.topic, letter.partition, letter.offset, error))
        if failures:
            raise DeadLetterWriteFailed(self._topic, failures)

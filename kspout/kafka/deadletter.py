"""Write given-up offsets to the dead-letter topic (`dead_letter_topic`, default `<topic>.dlq`).

A dead letter copies the original key and value (when Kafka still has the message) and adds
headers naming where it came from and why it was given up, so an operator can inspect or
replay it. `write` returns only once Kafka acknowledged every letter: the caller may then count
those offsets finished; on any failure none of them may be. A write the cluster refused this
principal (no Write ACL on the dead-letter topic, or no right to create it) raises
`KafkaAccessDenied`, and one to a topic that does not exist (deleted mid-run, on a cluster that
does not create it again) `DeadLetterTopicMissing`: no retry cures either, so the run stops
instead of trying for ever. A run creates the topic at its start when it does not exist, or
stops there when Kafka will not have it (`require_dead_letter_topic`).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from kspout.config import TopicConfig
from kspout.errors import (
    DeadLetterTopicMissing,
    DeadLetterWriteFailed,
    KafkaAccessDenied,
    KafkaRequestFailed,
)
from kspout.kafka._client import REQUEST_TIMEOUT, client_settings, is_transient
from kspout.kafka.access import principal, refusal
from kspout.kafka.records import DeadLetter
from kspout.kafka.topics import try_create_topic
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
# Seconds a dead-letter topic created at a run's start may take to get its leaders (its
# metadata says it is unknown, then LEADER_NOT_AVAILABLE, meanwhile); asked every CREATE_STEP.
CREATE_WAIT = 10.0
CREATE_STEP = 0.2
# Seconds a failed write waits to learn whether the topic is gone (an outage answers nothing).
GONE_CHECK = 2.0


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


def require_dead_letter_topic(
    config: TopicConfig, *, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Create the dead-letter topic when it does not exist, with the brokers' default
    partitions and replication (as their auto-creation on a first write would), so that a run
    learns at its start, not at its first dead letter retried for ever, that Kafka will not
    have it: `DeadLetterTopicMissing` (no Create right, a topic policy)."""
    producer = Producer(client_settings(config))
    try:
        try:
            if dead_letter_topic_exists(producer, config):
                return
        except DeadLetterTopicMissing:
            _create(config)
        for _ in range(int(CREATE_WAIT / CREATE_STEP)):
            with contextlib.suppress(DeadLetterTopicMissing):  # not in every broker's view yet
                if dead_letter_topic_exists(producer, config):
                    return
            sleep(CREATE_STEP)
        raise KafkaRequestFailed(
            "metadata request",
            config.dlq_topic,
            None,
            f"no leader after {CREATE_WAIT:g}s",
            "check that the brokers are up",
            transient=True,
        )
    finally:
        producer.flush(0)


def _create(config: TopicConfig) -> None:
    """Create the dead-letter topic (one that exists meanwhile is kept as it is)."""
    topic = config.dlq_topic
    error = try_create_topic(config, topic)
    if error is None:
        return
    if is_transient(error):
        hint = "check that the brokers are up"
        raise KafkaRequestFailed("topic creation", topic, None, error.str(), hint, transient=True)
    raise DeadLetterTopicMissing(topic, principal(config), config.brokers, config.path, error.str())


def dead_letter_topic_exists(
    producer: Producer, config: TopicConfig, *, timeout: float = REQUEST_TIMEOUT
) -> bool:
    """True when the dead-letter topic has leaders for its partitions; False while it is
    being created; `DeadLetterTopicMissing` when the brokers say it does not exist (asked
    through `producer`)."""
    topic = config.dlq_topic
    try:
        found = producer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        cause: KafkaError = exc.args[0]
        raise KafkaRequestFailed(
            "metadata request",
            topic,
            None,
            str(cause),
            "check the brokers",
            transient=is_transient(cause),
        ) from exc
    error = None if found is None else found.error
    if found is None or (error is not None and error.code() in _NO_SUCH_TOPIC):
        why = "no such topic" if error is None else error.str()
        raise DeadLetterTopicMissing(topic, principal(config), config.brokers, config.path, why)
    if error is not None and error.code() != KafkaError.LEADER_NOT_AVAILABLE:
        found_refusal = refusal(config, error, "Describe", topic)
        if found_refusal is not None:
            raise found_refusal
        raise KafkaRequestFailed(
            "metadata request",
            topic,
            None,
            error.str(),
            "check the brokers",
            transient=is_transient(error),
        )
    return error is None and bool(found.partitions)


# What a metadata answer says of a topic that does not exist (a principal that may Describe it
# is told UNKNOWN_TOPIC_OR_PART; where the brokers would create it, but not for this principal,
# TOPIC_AUTHORIZATION_FAILED).
_NO_SUCH_TOPIC = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.TOPIC_AUTHORIZATION_FAILED}
)


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

        Raises DeadLetterWriteFailed naming each letter Kafka did not acknowledge,
        `KafkaRefused` when Kafka refused this principal the write, `DeadLetterTopicMissing`
        when the topic is gone (which fails a write either way).
        """
        if self._producer is None:
            raise RuntimeError("DeadLetterWriter.start() was not called")
        try:
            self._write(self._producer, letters)
        except (KafkaAccessDenied, DeadLetterWriteFailed):
            # A topic deleted (and not created again) fails a write either way: say that
            # instead. Without an answer, the write's own error says enough.
            with contextlib.suppress(KafkaRequestFailed):
                dead_letter_topic_exists(self._producer, self._config, timeout=GONE_CHECK)
            raise

    def _write(self, producer: Producer, letters: Sequence[DeadLetter]) -> None:
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
        failures: list[tuple[str, int, int, str]] = []
        for index, letter in enumerate(letters):
            error = errors.get(index, "no delivery report before the timeout")
            if error is not None:
                failures.append((letter.topic, letter.partition, letter.offset, error))
        if refused:
            raise refused[0]
        if failures:
            raise DeadLetterWriteFailed(self._topic, failures)

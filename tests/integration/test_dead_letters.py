"""DeadLetterWorker against the real Kafka broker: payloads re-read from the topic, letters on
the real dead-letter topic, outcomes reported back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

from confluent_kafka import Message, Producer

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver.dead_letters import CLOSED, DeadLetterOutcome, DeadLetterWorker
from kspout.kafka import DeadLetterWriter
from kspout.outcomes import FailReason
from kspout.partition_manager import DeadLetterTicket
from tests.integration.helpers import read_topic

PARTITION = 1
WAIT = 30.0  # seconds for the worker to drain (fetch_timeout is 5 s)


def produce_numbered(producer: Producer, topic: str, count: int) -> None:
    for i in range(count):
        producer.produce(
            topic,
            key=b"key-%d" % i,
            value=b"value-%d" % i,
            partition=PARTITION,
            headers=[("trace", b"t%d" % i)],
        )
    assert producer.flush(30) == 0


def headers_of(message: Message) -> dict[str, bytes]:
    return dict(cast(list[tuple[str, bytes]], message.headers() or []))


def test_tickets_become_letters_with_the_original_message_and_kspout_headers(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config()
    produce_numbered(producer, config.topic, 12)
    tickets = [
        DeadLetterTicket(o, 4, FailReason.EXCEPTION, f"ValueError: bad {o}", "retries exhausted")
        for o in (3, 4, 5, 9)
    ]

    with DeadLetterWorker(config) as worker:
        worker.submit(PARTITION, tickets)
        assert worker.wait(WAIT)
        assert worker.completed() == [DeadLetterOutcome(PARTITION, (3, 4, 5, 9), None)]
        assert worker.pending == 0

    letters = read_topic(stack.info.brokers, config.dlq_topic, expected=4)
    by_offset = {int(headers_of(m)["kspout.source.offset"]): m for m in letters}
    assert sorted(by_offset) == [3, 4, 5, 9]
    for offset, message in by_offset.items():
        assert (message.key(), message.value()) == (b"key-%d" % offset, b"value-%d" % offset)
        assert message.headers() == [
            ("trace", b"t%d" % offset),
            ("kspout.source.topic", config.topic.encode()),
            ("kspout.source.partition", str(PARTITION).encode()),
            ("kspout.source.offset", str(offset).encode()),
            ("kspout.attempts", b"4"),
            ("kspout.reason", b"exception (retries exhausted)"),
            ("kspout.error", b"ValueError: bad %d" % offset),
        ]


def test_an_offset_kafka_never_had_becomes_a_letter_without_a_record(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    """Offset 7 exists; 1,000,000 lies far above high (the fetch learns so from the broker's
    out-of-range answer): both are written, the second without key or value."""
    config = make_config()
    produce_numbered(producer, config.topic, 10)
    tickets = [
        DeadLetterTicket(7, 2, FailReason.TIMEOUT, None, "behind"),
        DeadLetterTicket(1_000_000, 1, None, None, "behind"),
    ]

    with DeadLetterWorker(config) as worker:
        worker.submit(PARTITION, tickets)
        assert worker.wait(WAIT)
        assert worker.completed() == [DeadLetterOutcome(PARTITION, (7, 1_000_000), None)]

    letters = read_topic(stack.info.brokers, config.dlq_topic, expected=2)
    by_offset = {int(headers_of(m)["kspout.source.offset"]): m for m in letters}
    assert sorted(by_offset) == [7, 1_000_000]
    present, absent = by_offset[7], by_offset[1_000_000]
    assert (present.key(), present.value()) == (b"key-7", b"value-7")
    assert headers_of(present)["kspout.reason"] == b"timeout (behind)"
    assert (absent.key(), absent.value()) == (None, None)
    assert headers_of(absent) == {
        "kspout.source.topic": config.topic.encode(),
        "kspout.source.partition": str(PARTITION).encode(),
        "kspout.source.offset": b"1000000",
        "kspout.attempts": b"1",
        "kspout.reason": b"deferred (behind)",
        "kspout.error": b"",
    }


def test_an_unreachable_dlq_fails_the_job_without_blocking_submit_or_close(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    """Payloads come from the real topic; the letters go to a broker nobody listens on."""
    config = make_config()
    produce_numbered(producer, config.topic, 5)
    unreachable = DeadLetterWriter(make_config(brokers="127.0.0.1:1", fetch_timeout=1.0))
    tickets = [DeadLetterTicket(o, 1, FailReason.EXCEPTION, None, "exhausted") for o in (1, 2)]

    worker = DeadLetterWorker(config, writer=unreachable, close_timeout=0.3)
    try:
        worker.start()
        began = time.monotonic()
        worker.submit(PARTITION, tickets)
        assert time.monotonic() - began < 0.1
        assert worker.wait(WAIT)
        [failed] = worker.completed()
        assert (failed.partition, failed.offsets) == (PARTITION, (1, 2))
        assert failed.error is not None and failed.error.startswith("DeadLetterWriteFailed: ")

        worker.submit(PARTITION, tickets)  # handed out again; the DLQ is still down
        time.sleep(0.2)  # the thread is fetching or writing (delivery reports take 1 s)
        began = time.monotonic()
        worker.close()
        assert time.monotonic() - began < 2.0
        assert worker.completed() == [DeadLetterOutcome(PARTITION, (1, 2), CLOSED)]
    finally:
        worker.close()

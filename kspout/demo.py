"""The demo job: a stream with injected failures, consumed by the driver on the embedded stack.

Each demo message is JSON `{"id": n, "fail_times": k}`: the handler raises on its first `k`
attempts, so `k=1..2` messages succeed on a retry and poison messages (`k` beyond the retry
budget) end on the dead-letter topic. The report checks what the stream promised against what
Kafka and ZooKeeper hold afterwards.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from kspout.config import TopicConfig
from kspout.kafka import Record
from kspout.offsets import ZkOffsetStore

POISON = 1_000  # fail_times beyond any retry budget


@dataclass(frozen=True, slots=True)
class DemoStream:
    """What was produced: counts the report compares against."""

    messages: int
    flaky: int  # messages that fail a few times and then succeed
    poison: int  # messages that always fail


def produce_demo_stream(config: TopicConfig, messages: int, seed: int = 7) -> DemoStream:
    """Write `messages` JSON messages with injected failures to the demo topic."""
    rng = random.Random(seed)
    producer = Producer(config.kafka_config(**{"linger.ms": 20}))
    flaky = poison = 0
    for n in range(messages):
        roll = rng.random()
        if roll < 0.002:
            fail_times, poison = POISON, poison + 1
        elif roll < 0.05:
            fail_times, flaky = rng.randint(1, 2), flaky + 1
        else:
            fail_times = 0
        value = json.dumps({"id": n, "fail_times": fail_times}).encode()
        while True:
            try:
                producer.produce(config.topic, key=str(n).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(30)
    return DemoStream(messages, flaky, poison)


def flaky_handler() -> tuple[Callable[[Record], None], Counter[int]]:
    """A handler that fails each message `fail_times` times, and the Counter of its effects."""
    attempts: Counter[tuple[int, int]] = Counter()
    effects: Counter[int] = Counter()

    def handle(record: Record) -> None:
        body = json.loads(record.value or b"{}")
        where = (record.partition, record.offset)
        attempts[where] += 1
        if attempts[where] <= body["fail_times"]:
            raise RuntimeError(f"injected failure {attempts[where]} of {body['fail_times']}")
        effects[body["id"]] += 1

    return handle, effects


def count_dead_letters(config: TopicConfig, timeout: float = 10.0) -> int:
    """How many records the dead-letter topic holds (all partitions)."""
    consumer = Consumer(config.kafka_config(**{"group.id": f"{config.spout_id}-demo-report"}))
    try:
        metadata = consumer.list_topics(config.dlq_topic, timeout=timeout)
        topic = metadata.topics.get(config.dlq_topic)
        if topic is None or topic.error is not None:
            return 0
        total = 0
        for p in topic.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(config.dlq_topic, p), timeout=timeout
            )
            total += high - low
        return total
    finally:
        consumer.close()


def stored_offsets(config: TopicConfig) -> dict[int, int]:
    """The commit points ZooKeeper holds for the demo spout."""
    with ZkOffsetStore(config) as store:
        return {p: s.offset for p, s in store.read_all().items()}

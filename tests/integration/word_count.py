"""The word-count job the Spark tests run locally and on the standalone cluster.

Sentences carry injected failures: every 97th is `flaky` (the split bolt fails its first
attempt), every 251st carries the word `poison` (the count bolt, after the grouping, always
fails it). `check_word_count` verifies a finished run against what was produced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import redis
from confluent_kafka import Producer

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Progress
from tests.integration.helpers import PARTITIONS, dead_letter_headers, highs, produce, stored

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def sentence(partition: int, offset: int) -> bytes:
    """A few words; every 97th sentence is flaky (fails once), every 251st carries poison."""
    n = partition * 10_000 + offset
    words = [WORDS[(n + i) % len(WORDS)] for i in range(1 + n % 4)]
    if n % 97 == 5:
        words.append("flaky")
    if n % 251 == 7:
        words.append("poison")
    return " ".join(words).encode()


def word_count_topic(
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    stack: DevStack,
    per_partition: int,
    batch_size: int,
) -> tuple[TopicConfig, str, str]:
    """A topic of `per_partition` sentences in each partition for a word-count run: its config
    (two retries, a timeout no sentence reaches), the Redis URL and the counts' key."""
    config = make_config(batch_size=batch_size, max_retries=2, message_timeout=120.0)
    produce(producer, config.topic, {p: range(per_partition) for p in PARTITIONS}, value=sentence)
    return config, stack.info.redis_url, f"{config.topic}:counts"


def expected_counts(per_partition: int, attempts: int) -> tuple[Counter[str], int]:
    """The word counts a run with `attempts` per message ends with, and the poison count.

    At least once, exactly modelled: a clean sentence counts once (a flaky one fails before
    emitting, then counts once); the other words of a poison sentence count on every attempt
    that got past the split bolt, because only the `poison` tuple fails.
    """
    counts: Counter[str] = Counter()
    poison = 0
    for p in PARTITIONS:
        for o in range(per_partition):
            words = sentence(p, o).decode().split()
            if "poison" in words:
                poison += 1
                emitted = attempts - 1 if "flaky" in words else attempts
                words = [w for w in words if w != "poison"] * emitted
            counts.update(words)
    return counts, poison


def check_word_count(
    progress: Progress,
    config: TopicConfig,
    stack: DevStack,
    redis_client: redis.Redis,
    per_partition: int,
) -> None:
    """Every sentence acked or dead-lettered per policy, counts complete, commit at high."""
    key = f"{config.topic}:counts"
    expected, poison = expected_counts(per_partition, attempts=config.max_retries + 1)
    total = per_partition * len(PARTITIONS)
    assert progress.total("dead_lettered") == poison > 0
    assert progress.total("acked") == total - poison
    assert progress.total("timed_out") == 0  # else replays would count more than modelled
    counted = Counter({_text(k): int(v) for k, v in redis_client.hgetall(key).items()})
    assert counted == expected
    poison_sentences = {
        (p, o) for p in PARTITIONS for o in range(per_partition) if b"poison" in sentence(p, o)
    }
    letters = dead_letter_headers(config, stack.info.brokers)
    sources = [(int(h["kspout.source.partition"]), int(h["kspout.source.offset"])) for h in letters]
    assert sorted(sources) == sorted(poison_sentences)  # each exactly once
    assert stored(config) == highs(config)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

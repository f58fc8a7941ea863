"""The chained example's two stages, the trade stream they run over, and what they left.

Each trade is JSON `{"trade": "T-<n>", "buyer": ..., "seller": ..., "qty": ..., "inject": kind}`
keyed by its id. The kinds are the demo's faults, struck by stage one:

* `flaky`: fails on its first attempt after both notifications were sent;
* `late`: fails on its first attempt after its first notification was sent (partial output);
* `slow`: sleeps past `message_timeout` on its first attempt after sending: the driver times it
  out and replays it while the original still runs, so both publish;
* `poison`: always fails, before sending anything: it ends on the trades' dead-letter topic.

Every strike is counted in Redis (`<stage one's spout id>:struck`), so a run can show that the
faults happened. Stage two's effects (`<stage two's spout id>:pushed` per notification id,
`:inbox` per `<user>:<trade>`) are applied with the dedup bolt's DONE, in one Lua call.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import redis
from confluent_kafka import Producer

from dedup import Effects, IdempotencyBolt
from kspout.config import TopicConfig
from kspout.kafka import KafkaMetadata, PartitionFetcher, Record, client_settings
from kspout.output import ID_HEADER, KafkaOutput, Publish

FAULTS = {"flaky": 8, "late": 6, "slow": 1, "poison": 2}  # trades of each kind, at random
USERS = 50


@dataclass(slots=True)
class TradeStream:
    """What was produced, for checking what came out."""

    kinds: dict[str, str] = field(default_factory=dict)  # trade id -> fault ("none": none)
    inbox: set[str] = field(default_factory=set)  # `<user>:<trade>` of every non-poison trade

    @property
    def injected(self) -> Counter[str]:
        """How many trades of each kind."""
        return Counter(self.kinds.values())


def produce_trades(
    config: TopicConfig, trades: int, faults: Mapping[str, int] = FAULTS, seed: int = 3
) -> TradeStream:
    """Write `trades` trades to the config's topic, `faults[kind]` of each kind at random."""
    rng = random.Random(seed)
    planned = iter(rng.sample(range(trades), sum(faults.values())))
    kinds = dict.fromkeys(range(trades), "none")
    for kind, count in faults.items():
        for _ in range(count):
            kinds[next(planned)] = kind
    stream = TradeStream()
    producer = Producer(client_settings(config, **{"linger.ms": 20}))
    for n in range(trades):
        buyer, seller = rng.sample(range(USERS), 2)
        trade: dict[str, Any] = {
            "trade": f"T-{n}",
            "buyer": f"user-{buyer}",
            "seller": f"user-{seller}",
            "qty": rng.randint(1, 100),
            "inject": kinds[n],
        }
        stream.kinds[trade["trade"]] = kinds[n]
        if kinds[n] != "poison":
            stream.inbox.update(f"{user}:{trade['trade']}" for user, _ in notifications(trade))
        while True:
            try:
                producer.produce(config.topic, json.dumps(trade), trade["trade"])
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(30):
        raise RuntimeError(f"trades not acknowledged by Kafka within 30 s ({config.brokers})")
    return stream


def notifications(trade: Mapping[str, Any]) -> list[tuple[str, str]]:
    """`(user, value)` of a trade's notifications: the buyer's first, then the seller's."""
    return [
        (trade[side], json.dumps({"trade": trade["trade"], "user": trade[side], "text": text}))
        for side, text in (
            ("buyer", f"you bought {trade['qty']}"),
            ("seller", f"you sold {trade['qty']}"),
        )
    ]


@cache
def _redis(url: str) -> redis.Redis:
    """One client per Python worker and URL (clients do not travel from the driver)."""
    return redis.Redis.from_url(url, decode_responses=True)


@dataclass(frozen=True, slots=True)
class Notify:
    """Stage one: a trade's notifications, sent through `output`, with its injected fault."""

    job: str  # stage one's spout id: names its Redis keys
    redis_url: str
    slow_seconds: float

    def __call__(self, record: Record, output: KafkaOutput) -> None:
        trade = json.loads(record.value or b"{}")
        inject = trade["inject"]
        client = _redis(self.redis_url)
        first = inject != "none" and client.incr(f"{self.job}:attempt:{trade['trade']}") == 1
        if inject == "poison" or first:
            client.hincrby(f"{self.job}:struck", inject, 1)
        if inject == "poison":
            raise ValueError(f"poison trade {trade['trade']}")
        for index, (user, value) in enumerate(notifications(trade)):
            output.send(record, value, key=user, index=index)
            if inject == "late" and first:
                raise RuntimeError(f"{trade['trade']} fails after its first notification")
        if inject == "flaky" and first:
            raise RuntimeError(f"{trade['trade']} fails after publishing, first attempt")
        if inject == "slow" and first:
            time.sleep(self.slow_seconds)


def stage_one(config: TopicConfig, topic: str, slow_seconds: float) -> Publish:
    """Trades -> notifications on `topic`, each acked once Kafka has its notifications."""
    notify = Notify(config.spout_id, config.redis.url, slow_seconds)
    return Publish(notify, KafkaOutput(config, topic))


@dataclass(frozen=True, slots=True)
class Push:
    """Stage two's handler: "pushes" a notification to its user, that is, counts it per
    notification id and per `<user>:<trade>`, atomically with the dedup bolt's DONE."""

    job: str  # stage two's spout id

    def __call__(self, record: Record, effects: Effects) -> None:
        note = json.loads(record.value or b"{}")
        effects.hincrby(f"{self.job}:pushed", effects.id)
        effects.hincrby(f"{self.job}:inbox", f"{note['user']}:{note['trade']}")


def stage_two(config: TopicConfig) -> IdempotencyBolt:
    """Notifications -> users, once per notification id."""
    if config.dedup.id_source != f"header:{ID_HEADER}":
        raise ValueError(
            f'{config.topic}: set [dedup] id_source = "header:{ID_HEADER}", the id stage one '
            f"stamps, not {config.dedup.id_source!r}"
        )
    return IdempotencyBolt(Push(config.spout_id), config)


def struck(config: TopicConfig) -> Counter[str]:
    """How often each fault struck in stage one (`config`: stage one's)."""
    return Counter(_counts(config, f"{config.spout_id}:struck"))


def pushed(config: TopicConfig) -> dict[str, int]:
    """Pushes per notification id (`config`: stage two's)."""
    return _counts(config, f"{config.spout_id}:pushed")


def inbox(config: TopicConfig) -> dict[str, int]:
    """Pushes per `<user>:<trade>` (`config`: stage two's)."""
    return _counts(config, f"{config.spout_id}:inbox")


def _counts(config: TopicConfig, key: str) -> dict[str, int]:
    raw = _redis(config.redis.url).hgetall(key)
    return {str(k): int(v) for k, v in raw.items()}


def published(config: TopicConfig) -> Counter[tuple[str, str]]:
    """Copies of each notification in the topic (`config`: stage two's), by
    `(kspout.id, "<user>:<trade>")`: every record up to the high watermarks."""
    copies: Counter[tuple[str, str]] = Counter()
    with KafkaMetadata(config) as metadata, PartitionFetcher(config) as fetcher:
        for p in metadata.partitions(config.topic):
            low, high = metadata.watermarks(config.topic, p)
            spans = [(low, high)] if high > low else []
            for record in fetcher.fetch(config.topic, p, spans).records:
                headers = dict(record.headers)
                note = json.loads(record.value or b"{}")
                id_ = (headers.get(ID_HEADER) or b"").decode()
                copies[id_, f"{note['user']}:{note['trade']}"] += 1
    return copies

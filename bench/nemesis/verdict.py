"""The nemesis's verdict, against its own ledger and what the sinks durably hold, never kspout's
own records: Redis's effects read back after the run, the dead-letter topic read from Kafka,
the commit points re-read from ZooKeeper once every instance has stopped, the high watermarks
from Kafka, and the handlers' attempt logs.

What each fault cost:

* recovery: seconds from the strike until every partition it touched that still had work
  (its commit point short of the final high watermark) had its commit point advance past
  where it stood when the injection was over (the monitor's samples, every 0.25 s);
* replays: handler runs of healthy messages beyond their first, each laid to the last fault
  that struck before the run began (those before any fault: "before any fault");
* redelivered: the same for deliveries to the dedup bolt (kspout's replays, most of which the
  bolt finds done or leased and does not run).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import redis
from confluent_kafka import Consumer, TopicPartition

from bench.nemesis.faults import Strike
from bench.nemesis.ledger import Ledger
from bench.nemesis.monitor import Sample
from bench.report import table
from kspout.config import TopicConfig
from kspout.kafka import KafkaMetadata
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.session import ZkSession


@dataclass
class Sinks:
    """What the run left: read after every instance stopped."""

    effects: int  # the job's effect counter: one per application
    applied: set[int]  # ids in the job's set of applied ids
    counts: Counter[str]  # the job's word counts
    dead: Counter[int]  # dead-lettered ids (-1: a letter without one), copies of each
    commits: dict[int, int]  # ZooKeeper's commit points
    highs: dict[int, int]  # Kafka's high watermarks


def read_sinks(config: TopicConfig) -> Sinks:
    client = redis.Redis.from_url(config.redis.url)
    job = config.spout_id
    try:
        effects = int(client.get(f"{job}:effects") or 0)
        applied = {int(i) for i in client.smembers(f"{job}:ids")}
        raw = client.hgetall(f"{job}:counts")
        counts = Counter({_text(k): int(v) for k, v in raw.items()})
    finally:
        client.close()
    with ZkSession(config) as session:
        commits = {p: s.offset for p, s in ZkOffsetStore(session).read_all().items()}
    highs = high_watermarks(config)
    return Sinks(effects, applied, counts, dead_letters(config), commits, highs)


def high_watermarks(config: TopicConfig) -> dict[int, int]:
    with KafkaMetadata(config) as metadata:
        topic = config.topic
        return {p: metadata.watermarks(topic, p)[1] for p in metadata.partitions(topic)}


def at_highs(commits: dict[int, int], highs: dict[int, int]) -> bool:
    """True when every partition's commit point is its high watermark (an empty partition has
    none in ZooKeeper)."""
    return bool(highs) and all(commits.get(p, 0) == high for p, high in highs.items())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def dead_letters(config: TopicConfig) -> Counter[int]:
    """The ids of the dead-letter topic's records (their values are the messages), read up to
    each partition's high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": config.brokers,
            "group.id": f"nemesis-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    topic = config.dlq_topic
    found: Counter[int] = Counter()
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        highs = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        read = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + 60
        while any(read[p] < highs[p] for p in parts) and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    found[int(json.loads(message.value() or b"{}").get("id", -1))] += 1
                    read[message.partition()] = (message.offset() or 0) + 1
    finally:
        consumer.close()
    return found


def handler_runs(logs: Iterable[Path]) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Each id's handler runs and its deliveries to the bolt (when each began), from every
    attempt log (`job.py`)."""
    runs: dict[int, list[float]] = {}
    delivered: dict[int, list[float]] = {}
    for log in logs:
        if not log.exists():
            continue
        *lines, _partial = log.read_text().split("\n")
        for line in lines:
            if line.startswith("A "):
                _, id_, _attempt, at = line.split()
                runs.setdefault(int(id_), []).append(float(at))
            elif line.startswith("D "):
                _, at, *ids = line.split()
                for id_ in ids[0].split(",") if ids else ():
                    delivered.setdefault(int(id_), []).append(float(at))
    return (
        {i: sorted(times) for i, times in runs.items()},
        {i: sorted(times) for i, times in delivered.items()},
    )


def replays(
    runs: dict[int, list[float]], healthy: set[int], strikes: Sequence[Strike]
) -> Counter[int]:
    """Handler runs of healthy messages beyond their first, by the index of the last fault
    that struck before each began (-1: before any)."""
    began = [s.began for s in strikes]
    out: Counter[int] = Counter()
    for id_, times in runs.items():
        if id_ in healthy:
            for at in times[1:]:
                out[sum(1 for b in began if b <= at) - 1] += 1
    return out


def recovery(strike: Strike, samples: Sequence[Sample], finals: dict[int, int]) -> float | None:
    """Seconds from the strike until the partitions it touched moved on (module docstring);
    None when none of them had work left or they never moved."""
    before = [s for s in samples if s.at <= strike.over]
    if not before:
        return None
    base = before[-1].commits
    waiting = [p for p in strike.partitions if base.get(p, 0) < finals.get(p, 0)]
    if not waiting:
        return None
    for sample in samples[len(before) :]:
        if all(sample.commits.get(p, 0) > base.get(p, 0) for p in waiting):
            return sample.at - strike.began
    return None


@dataclass
class Verdict:
    checks: dict[str, bool]
    rows: list[list[str]]
    figures: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(self.checks.values())

    def table(self) -> str:
        headers = ["fault", "at (s)", "target", "struck", "recovery (s)", "redelivered", "replays"]
        return table(headers, self.rows, "<><<>>>")


def judge(
    ledger: Ledger,
    sinks: Sinks,
    strikes: Sequence[Strike],
    samples: Sequence[Sample],
    logs: Iterable[Path],
    started: float,
) -> Verdict:
    """The checks and the table (the module docstring says what each figure is)."""
    healthy = ledger.ids("none")
    own_fault = ledger.ids("poison", "noid")
    runs, delivered = handler_runs(logs)
    extra = replays(runs, healthy, strikes)
    again = replays(delivered, healthy, strikes)
    rows = []
    for i, strike in enumerate(strikes):
        took = recovery(strike, samples, sinks.highs)
        rows.append(
            [
                strike.kind,
                f"{strike.began - started:.1f}",
                strike.target,
                "yes" if strike.struck else "NO",
                "-" if took is None else f"{took:.1f}",
                str(again[i]),
                str(extra[i]),
            ]
        )
    rows.append(["(before any fault)", "", "", "", "", str(again[-1]), str(extra[-1])])
    dead_ids = set(sinks.dead)
    checks = {
        f"every message produced and acknowledged ({len(ledger.kinds)})": (
            not ledger.refused and ledger.acknowledged == len(ledger.kinds)
        ),
        "every fault struck": all(s.struck for s in strikes),
        f"each healthy message's effect applied exactly once ({len(healthy)}): effects = "
        "distinct ids = healthy ids": sinks.effects == len(sinks.applied)
        and sinks.applied == healthy,
        "word counts equal the healthy messages' counts exactly": sinks.counts == ledger.counts,
        f"every poison and unkeyed message dead-lettered ({len(own_fault)}), no healthy one": (
            dead_ids == own_fault
        ),
        "commit points (ZooKeeper, after every instance stopped) at the high watermarks": (
            at_highs(sinks.commits, sinks.highs)
        ),
    }
    figures: dict[str, object] = {
        "messages": len(ledger.kinds),
        "healthy": len(healthy),
        "own_fault": len(own_fault),
        "handler_runs": sum(len(t) for i, t in runs.items() if i in healthy),
        "redelivered": sum(again.values()),
        "replays": sum(extra.values()),
        "effects": sinks.effects,
        "dead_letters": sum(sinks.dead.values()),
        "dead_lettered_twice": sum(1 for n in sinks.dead.values() if n > 1),
        "commits": sinks.commits,
        "highs": sinks.highs,
    }
    return Verdict(checks, rows, figures)

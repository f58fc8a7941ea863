"""ZooKeeper frozen (SIGSTOP) past the session timeout under a running spout, for real.

Two `kspout run` processes share a topic's four partitions; the test freezes the stack's
ZooKeeper for `OUTAGE` seconds, more than twice `zk_session_timeout`, then thaws it: ZooKeeper
expires both sessions, so every claim is gone. The runs must go on (no `ZooKeeperUnavailable`
ends them), start no new work while ZooKeeper is away, have the commits of their expired
sessions refused, claim their partitions again and finish. Judged by the test's own ledger
(tests/integration/ledger.py) and by ZooKeeper read again after both processes stopped.

The same outage under a Structured Streaming query (`readStream.format("kspout")`): the query
goes on (its checkpoint, not ZooKeeper, holds its position), applies every message exactly once
through the dedup bolt's `ExactlyOnce`, and its ZooKeeper copy reaches the high watermarks.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import redis
from confluent_kafka import Producer
from pyspark.sql import DataFrame, Row, SparkSession

from dedup import Effects
from dedup.batch import ExactlyOnce
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import PARTITIONS, highs, produce, stored, topic_file, value_of
from tests.integration.ledger import entries, produced
from tests.integration.test_ownership import claims, eventually
from tests.integration.test_ownership_processes import instances, owner_of
from tests.integration.test_streaming import run, unique_key

SESSION = 6.0  # zk_session_timeout
OUTAGE = 15.0  # seconds ZooKeeper stays frozen: past the session timeout, twice over
EXTRA = f"zk_session_timeout = {SESSION}\n"
# Seconds after the freeze by which no task may still finish: the session notices the silence
# after 2/3 of its timeout (kazoo's read timeout), and a task of 25 messages takes 0.25 s.
QUIET_AFTER = SESSION + 2.0


class Outage:
    """The stack's ZooKeeper frozen (SIGSTOP) for `OUTAGE` seconds from `start()`, thawed by a
    timer, or by `end()` at the latest (a test must leave it running)."""

    def __init__(self, stack: DevStack) -> None:
        self._zookeeper = stack.zookeeper
        self._timer = threading.Timer(OUTAGE, self.end)
        self._lock = threading.Lock()
        self.frozen_at: float | None = None  # `time.monotonic()`
        self.thawed_at: float | None = None

    def start(self) -> None:
        self._zookeeper.freeze()
        self.frozen_at = time.monotonic()
        self._timer.start()

    def end(self) -> None:
        self._timer.cancel()
        with self._lock:
            if self.frozen_at is not None and self.thawed_at is None:
                self._zookeeper.thaw()
                self.thawed_at = time.monotonic()

    @property
    def span(self) -> tuple[float, float]:
        """When ZooKeeper was frozen and thawed."""
        assert self.frozen_at is not None and self.thawed_at is not None
        return self.frozen_at, self.thawed_at


def test_two_instances_wait_out_zookeeper_frozen_past_their_sessions(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    sent = {p: range(1500) for p in PARTITIONS}
    produce(producer, config.topic, sent)
    with instances(stack, config, tmp_path, 2, EXTRA) as runs:
        ids = [eventually(owner_of(config, proc.pid), what="registered") for proc, _ in runs]
        eventually(lambda: set(claims(config).values()) == set(ids), what="both own some")

        def done() -> int:
            return sum(len(entries(ledger)) for _, ledger in runs)

        eventually(lambda: done() >= 300, what="300 messages handled")
        outage = Outage(stack)
        try:
            outage.start()
            time.sleep(OUTAGE)
        finally:
            outage.end()
        frozen_at, thawed_at = outage.span
        handled_before = done()
        eventually(lambda: stored(config) == highs(config), timeout=120, what="caught up")
        assert all(proc.poll() is None for proc, _ in runs), "an instance ended in the outage"
        for proc, _ in runs:
            proc.terminate()
        outputs = [proc.communicate(timeout=60) for proc, _ in runs]

    finals = [json.loads(out) for out, _ in outputs]
    logs = [b"".join(err.split()) for _, err in outputs]  # rich wraps long log lines
    # The fault struck: each instance saw ZooKeeper go away and its session expire.
    assert all(b"isaway" in log for log in logs), outputs[0][1].decode()[-3000:]
    expired = sum(b"ZooKeepersessionexpired:theclaims" in log for log in logs)
    assert expired == 2, outputs[0][1].decode()[-3000:]
    # Nothing new ran while ZooKeeper was away: no task finished once the sessions noticed.
    finished = [(value, at) for _, ledger in runs for value, at in entries(ledger)]
    late = [v for v, at in finished if frozen_at + QUIET_AFTER <= at < thawed_at]
    assert not late, f"{len(late)} messages finished while ZooKeeper was away"
    # The expired sessions' commits were refused, their partitions dropped and claimed anew.
    refused = sum(final["commits_refused"] for final in finals)
    dropped = sum(final["partitions_dropped"] for final in finals)
    assert refused >= 1 and dropped >= len(PARTITIONS), (refused, dropped)
    assert all(final["zookeeper_away_s"] is None for final in finals)
    # Nothing lost, nothing that was not produced; few handled twice (what ran since the last
    # commit before the outage).
    counts = Counter(value for value, _ in finished)
    assert set(counts) == produced(sent)
    twice = sum(n - 1 for n in counts.values())
    print(
        f"\n{handled_before} of {len(counts)} handled by the thaw; {refused} commits refused, "
        f"{dropped} partitions dropped; handled twice: {twice}"
    )
    assert twice < 0.2 * len(counts), twice
    assert stored(config) == highs(config), "ZooKeeper, read after both instances stopped"


def test_a_streaming_query_goes_on_through_zookeeper_frozen_past_its_session(
    spark: SparkSession,
    stack: DevStack,
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    config = dedup_config()
    topic = config.topic
    toml = topic_file(tmp_path / "topic.toml", stack, config, EXTRA)
    produce(producer, topic, {p: range(300) for p in PARTITIONS}, key=unique_key)

    def apply(row: Row, effects: Effects) -> None:
        assert row.value == value_of(row.partition, row.offset)
        effects.sadd(f"{topic}:seen", f"{row.partition}:{row.offset}")
        effects.incrby(f"{topic}:applied", 1)

    once = ExactlyOnce(apply, config)
    outage = Outage(stack)
    ended: list[float] = []  # when each batch ended

    def sink(df: DataFrame, batch_id: int) -> None:
        once(df, batch_id)
        ended.append(time.monotonic())
        if outage.frozen_at is None:  # the outage starts after the first batch
            outage.start()
        time.sleep(0.5)  # the query lasts past the outage

    try:
        run(spark, toml, tmp_path / "checkpoint", sink, maxOffsetsPerTrigger=50)
    finally:
        outage.end()
    frozen_at, thawed_at = outage.span
    during = [at for at in ended if frozen_at < at < thawed_at]
    assert during, "no batch ended while ZooKeeper was frozen"  # the fault struck a batch
    assert ended[-1] > thawed_at, "the query ended before ZooKeeper came back"
    assert (once.applied, once.duplicates) == (1200, 0)
    assert redis_client.scard(f"{topic}:seen") == 1200
    assert int(redis_client.get(f"{topic}:applied") or 0) == 1200
    eventually(lambda: stored(config) == highs(config), timeout=30, what="the copy caught up")

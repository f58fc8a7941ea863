"""Faults for the fault matrix (tests/chaos/test_fault_matrix.py), each one real and counted.

Handlers and bolts here run inside Spark's Python workers (the repo root is on their
PYTHONPATH, see tests/conftest.py), so they travel by reference and keep their Redis clients in
module-level caches. Every message is JSON `{"id": ..., "fault": kind}` keyed by its id; its
one effect is `HINCRBY <topic>:applied <id> 1`, so the test sees which ids took effect and how
often. Each fault that strikes is counted in `<topic>:struck` (HINCRBY, a plain write) *before*
it strikes, so a fault that kills or hangs its worker is still counted:

* `poison` (`FaultyHandler`): kills its own Python worker with SIGKILL, on every attempt.
* `hang` (`FaultyHandler`): blocks forever on an Event nobody sets.
* `slow` (`FaultyHandler`): its first run sleeps past `message_timeout`, then succeeds; later
  runs do not sleep (runs are counted per id in `<topic>:runs`).
* `pace` (`FaultyHandler`) is no fault: the message takes `PACE_SECONDS`, so that a backlog
  is still being worked through when the test takes a broker down.
* `cleanup` (`CleanupFailsOnce`): a bolt whose `cleanup()` raises exactly once in the whole
  run, across every Python worker (`INCR <topic>:cleanups`, raise on 1).
* a Redis outage (`ProbedIdempotencyBolt`): the dedup bolt, which checks Redis before each
  batch; a batch that finds it down cannot count that in Redis, so it appends a line to a
  spool file instead (`spool_strikes` reads it).
* one partition's fetch failing (a `KafkaCluster`, `KafkaCluster.create_topic`): not a worker fault
  but a broker one. The test runs its own Apache Kafka cluster of three KRaft nodes (a quorum
  that outlives one node), with the topic's partitions unreplicated: one partition on node 2,
  the rest on node 1. Killing node 2 takes that partition's only leader away, so every fetch
  and watermark query of it fails while the others flow, until the node is started again.
  Executors' fetches are kspout's own code, so the test counts strikes with probe fetches of
  that partition through kspout's `PartitionFetcher` (`<topic>:struck`, field `fetch`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import redis
from confluent_kafka.admin import AdminClient

from dedup import Effects, IdempotencyBolt
from dedup.bolt import EffectHandler
from kspout.bolts import BasicBolt, BasicCollector, Collector, Tuple
from kspout.config import TopicConfig
from kspout.kafka import Record

FAULTS = ("none", "pace", "poison", "hang", "slow")
PACE_SECONDS = 0.01  # a `pace` message is no fault: it takes this long, so a backlog lasts


@cache
def worker_redis(url: str) -> redis.Redis:
    """One client per worker process and URL, with timeouts: a handler's ledger writes must
    not hang on a Redis that a test stopped."""
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)


def encode(id_: str, fault: str = "none") -> bytes:
    """A message's value."""
    assert fault in FAULTS, fault
    return json.dumps({"id": id_, "fault": fault}).encode()


def decode(record: Record) -> tuple[str, str]:
    """`(id, fault)` of a message."""
    message = json.loads(record.value or b"{}")
    return str(message["id"]), str(message["fault"])


def strike(redis_url: str, topic: str, fault: str) -> None:
    """Count one strike of `fault` in `<topic>:struck`."""
    worker_redis(redis_url).hincrby(f"{topic}:struck", fault, 1)


def apply(redis_url: str, topic: str, id_: str) -> None:
    """The message's effect (at least once: a plain write, no dedup)."""
    worker_redis(redis_url).hincrby(f"{topic}:applied", id_, 1)


@dataclass(frozen=True, slots=True)
class FaultyHandler:
    """A plain handler `f(record)`: applies each message after the fault it asks for."""

    topic: str
    redis_url: str
    slow_seconds: float

    def __call__(self, record: Record) -> None:
        id_, fault = decode(record)
        if fault == "poison":
            strike(self.redis_url, self.topic, fault)
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "hang":
            strike(self.redis_url, self.topic, fault)
            threading.Event().wait()  # forever: only killing the worker ends it
        elif fault == "slow" and self._first_run(id_):
            strike(self.redis_url, self.topic, fault)
            time.sleep(self.slow_seconds)
        elif fault == "pace":
            time.sleep(PACE_SECONDS)
        apply(self.redis_url, self.topic, id_)

    def _first_run(self, id_: str) -> bool:
        return worker_redis(self.redis_url).hincrby(f"{self.topic}:runs", id_, 1) == 1


class CleanupFailsOnce(BasicBolt):
    """Applies each message; its `cleanup()` raises exactly once in the whole run.

    The failure is outside per-message code: every message of the task was processed and
    acked by `process` before `cleanup` ran.
    """

    def __init__(self, topic: str, redis_url: str) -> None:
        self.topic = topic
        self.redis_url = redis_url

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        id_, _ = decode(tuple_.record)
        apply(self.redis_url, self.topic, id_)

    def cleanup(self) -> None:
        if worker_redis(self.redis_url).incr(f"{self.topic}:cleanups") == 1:
            strike(self.redis_url, self.topic, "cleanup")
            raise RuntimeError("injected: cleanup() fails once")


@dataclass(frozen=True, slots=True)
class DedupApply:
    """The dedup bolt's handler: the effect is applied atomically with marking the id DONE."""

    topic: str

    def __call__(self, record: Record, effects: Effects) -> None:
        effects.hincrby(f"{self.topic}:applied", effects.id)


class ProbedIdempotencyBolt(IdempotencyBolt):
    """The dedup bolt, unchanged, except that each batch first checks whether its Redis
    answers; when it does not (the outage the test injects strikes this batch), one line is
    appended to `spool` (Redis cannot count its own outage)."""

    def __init__(self, handler: EffectHandler, config: TopicConfig, spool: Path) -> None:
        super().__init__(handler, config)
        self.spool = str(spool)

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        client = redis.Redis.from_url(
            self.config.redis.url, socket_connect_timeout=1.0, socket_timeout=1.0
        )
        try:
            client.ping()
        except redis.RedisError:
            with open(self.spool, "a") as spool:
                spool.write(f"{os.getpid()} {time.time():.3f}\n")
        finally:
            client.close()
        super().execute_batch(tuples, collector)

    def __getstate__(self) -> dict[str, object]:
        return {**super().__getstate__(), "spool": self.spool}


def spool_strikes(spool: Path) -> int:
    """How many batches found Redis down."""
    try:
        return len(spool.read_text().splitlines())
    except FileNotFoundError:
        return 0


# -- a real Kafka cluster whose nodes can go down -------------------------------------------


def wait_led(brokers: str, topic: str, timeout: float = 60.0) -> None:
    """Return once every partition of `topic` has a leader (after a node came back)."""
    admin = AdminClient({"bootstrap.servers": brokers})
    deadline = time.monotonic() + timeout
    while True:
        found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
        if found is not None and found.error is None:
            unled = [p for p, info in found.partitions.items() if info.leader < 0]
            if found.partitions and not unled:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic}: partitions without a leader after {timeout} s")
        time.sleep(0.1)

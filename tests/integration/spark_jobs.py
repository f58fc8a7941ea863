"""Handlers and bolts that Spark tests run inside executors' Python workers.

They live in an importable module (not in a test file) because Spark ships them by reference.
Each records what it did in Redis, under keys named after the test's topic, so the test can
check effects across worker processes and driver restarts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cache

import pyarrow as pa
import pyarrow.compute as pc
import redis

from kspout import (
    BasicBolt,
    BasicCollector,
    Bolt,
    Collector,
    ColumnarBolt,
    ColumnarOutput,
    TaskContext,
    Tuple,
)
from kspout.kafka import Record
from kspout_demo.word_count import SplitWords, count_words


@cache
def client(url: str) -> redis.Redis:
    """One Redis client per worker process and URL."""
    return redis.Redis.from_url(url)


def attempt(url: str, record: Record) -> int:
    """How many times this record has been handled so far, this call included."""
    return int(client(url).incr(f"{record.topic}:attempt:{record.partition}:{record.offset}"))


class Split(BasicBolt):
    """Sentence -> words; raises on the word `poison` and on a `flaky` sentence's first try."""

    outputs = ("word",)

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        record = tuple_.record
        words = (record.value or b"").decode().split()
        if "flaky" in words and attempt(self.redis_url, record) == 1:
            raise RuntimeError("injected: first attempt of a flaky sentence")
        for word in words:
            collector.emit((word,))


class Count(BasicBolt):
    """Adds one to the word's count in Redis; raises on `poison` (after the grouping)."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        word = tuple_["word"]
        if word == "poison":
            raise ValueError("poison word")
        redis = client(self.redis_url)
        redis.hincrby(self.key, word, 1)
        redis.sadd(f"{self.key}:pids", os.getpid())


class ColumnarSplit(SplitWords):
    """`Split` in columns: a `flaky` sentence fails on its first attempt, emitting nothing."""

    def __init__(self, redis_url: str) -> None:
        super().__init__()
        self.redis_url = redis_url

    def prepare(self, context: TaskContext) -> None:
        self.topic = context.topic

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        words, rows = self.words(batch)
        flaky = pc.indices_nonzero(pc.match_substring(batch.column("value"), b"flaky"))
        places = batch.take(flaky).select(["partition", "offset"]).to_pylist()
        first = [
            row
            for row, place in zip(flaky.to_pylist(), places, strict=True)
            if client(self.redis_url).incr(
                f"{self.topic}:attempt:{place['partition']}:{place['offset']}"
            )
            == 1
        ]
        out.fail(first, "injected: first attempt of a flaky sentence")
        kept = pc.invert(pc.is_in(rows, pa.array(first, pa.int64())))
        out.emit(rows.filter(kept), {"word": words.filter(kept)})


class ColumnarCount(ColumnarBolt):
    """`Count` in columns: one HINCRBY per distinct word of the batch; fails `poison` rows."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        words = batch.column("word")
        poison = pc.equal(words, "poison")
        out.fail(poison, "poison word")
        with client(self.redis_url).pipeline(transaction=False) as pipe:
            for word, n in count_words(words.filter(pc.invert(poison))).items():
                pipe.hincrby(self.key, word, n)
            pipe.execute()


class ValueOf(BasicBolt):
    """Emits the record's value."""

    outputs = ("value",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        collector.emit((tuple_.record.value,))


class StoreValue(BasicBolt):
    """Appends each value it gets to the Redis list `key` (a value handled twice shows twice)."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        client(self.redis_url).rpush(self.key, tuple_["value"])


class SlowOnce(Bolt):
    """Sleeps `seconds` on the first attempt of each record of partition 0 (`slowest[1]`
    seconds at offset `slowest[0]`), then acks."""

    def __init__(
        self, redis_url: str, seconds: float, slowest: tuple[int, float] | None = None
    ) -> None:
        self.redis_url = redis_url
        self.seconds = seconds
        self.slowest = slowest

    def prepare(self, context: TaskContext) -> None:
        self.redis = client(self.redis_url)

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        record = tuple_.record
        if record.partition == 0 and attempt(self.redis_url, record) == 1:
            slow = self.slowest is not None and record.offset == self.slowest[0]
            time.sleep(self.slowest[1] if slow else self.seconds)  # type: ignore[index]
        self.redis.sadd(f"{record.topic}:done", f"{record.partition}:{record.offset}")
        collector.ack(tuple_)


@dataclass(frozen=True, slots=True)
class RecordEffect:
    """Remembers each (partition, offset) handled, in a Redis set named after the topic."""

    redis_url: str

    def __call__(self, record: Record) -> None:
        client(self.redis_url).sadd(f"{record.topic}:done", f"{record.partition}:{record.offset}")
        time.sleep(0.001)  # slow enough that a kill lands mid-run


def record_effect(record: Record) -> None:
    """The CLI test's handler: `RecordEffect` on the Redis that `kspout run` was pointed at."""
    RecordEffect(os.environ["KSPOUT_REDIS_URL"])(record)


@dataclass(frozen=True)
class InKeyOrder:
    """A handler for `ordering = key` tests: each record's value is its rank among the
    records of its key. A call whose rank is not the number of its key's records finished
    so far broke the rule (logged under `violations`). Ranks divisible by `flaky_every` fail
    their first call; every call records which Spark task ran it."""

    url: str
    flaky_every: int = 4

    def __call__(self, record: Record) -> None:
        from pyspark import TaskContext as SparkTaskContext

        r, topic = client(self.url), record.topic
        key, rank = (record.key or b"").decode(), int(record.value or b"0")
        context = SparkTaskContext.get()
        if context is not None:
            r.sadd(f"{topic}:tasks", f"{context.stageId()}:{context.partitionId()}")
        done = int(r.get(f"{topic}:done:{key}") or 0)
        if done != rank:
            r.rpush(f"{topic}:violations", f"{key}: rank {rank} ran after {done} finished")
        if rank % self.flaky_every == 0 and attempt(self.url, record) == 1:
            raise RuntimeError(f"injected: first call of {key}#{rank}")
        r.set(f"{topic}:done:{key}", rank + 1)

"""The demo job: a Storm-style word count on Spark over a stream with injected failures.

Each message is JSON `{"id": n, "text": "...", "inject": kind}` keyed by its id. The kinds:

* `flaky`: the split bolt raises on the message's first attempt; the retry succeeds.
* `late`: the count bolt raises on the last word of the first attempt, after the other words
  were counted: at-least-once processing counts those words again on the retry.
* `slow`: the split bolt sleeps past `message_timeout` on the first attempt: the message times
  out while the original still runs, and is replayed.
* `poison`: the split bolt always raises: the message ends on the dead-letter topic.
* `noid`: the message has no key, so the exactly-once job cannot deduplicate it: it goes to
  the dead-letter topic there (the at-least-once job counts it like any other).

Three jobs consume the stream. `demo-storm` is Storm's word count, `SplitSentence ->
Fields("word") -> CountWord`, at least once. `demo-columnar` is the same job written with
columnar bolts (`ColumnarSplitSentence -> Fields("word") -> ColumnarCountWord`, on
`kspout_demo.word_count`'s): each takes its task's whole batch as Arrow columns, and the same
failures strike it. `demo-exactly-once` runs `count_once` behind the dedup bolt: a message's
word counts are applied in Redis atomically with marking its id DONE. The report compares each
job's counts with the true counts of the stream.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import redis
from confluent_kafka import Consumer, TopicPartition

from dedup import Effects, IdempotencyBolt
from kspout.bolts import BasicBolt, BasicCollector, TaskContext, Tuple
from kspout.columnar import ColumnarBolt, ColumnarOutput
from kspout.config import TopicConfig
from kspout.executor.topology import ChainItem
from kspout.groupings import Fields
from kspout.kafka import Record, client_settings
from kspout.kafka.topics import ensure_topic
from kspout.kafka.writer import TopicWriter
from kspout.worker_clients import WorkerClients
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.session import ZkSession
from kspout_demo.word_count import SplitWords, count_words

WORDS = (
    "storm", "spark", "kafka", "stream", "bolt", "spout", "tuple", "offset", "partition",
    "replay", "acker", "ledger", "commit", "retry", "lease", "token", "epoch", "redis",
    "zookeeper", "driver", "executor", "batch", "window",
)  # fmt: skip
INJECTED = {"flaky": 0.03, "late": 0.02, "poison": 0.002, "noid": 0.001}
SLOW_MESSAGES = 1  # each one is handled for longer than message_timeout: it alone times out
PARTITIONS = 4  # of the demo topic: batches of several partitions run side by side


@dataclass(slots=True)
class DemoStream:
    """What was produced, for the report to compare against."""

    messages: int
    injected: Counter[str] = field(default_factory=Counter)
    true_counts: Counter[str] = field(default_factory=Counter)  # poison messages excluded
    keyed_counts: Counter[str] = field(default_factory=Counter)  # ... and messages without id

    @property
    def keyed_messages(self) -> int:
        """Messages the exactly-once job should apply: all but the poison and unkeyed ones."""
        return self.messages - self.injected["poison"] - self.injected["noid"]


def produce_sentences(config: TopicConfig, messages: int, seed: int = 7) -> DemoStream:
    """Write `messages` sentences with injected failures to the demo topic (created first,
    with `PARTITIONS` partitions, unless it exists), through the writer `kspout produce` uses:
    it waits for Kafka's acknowledgement of each and raises ProduceFailed if one is refused."""
    ensure_topic(config, PARTITIONS)
    stream = DemoStream(messages)
    with TopicWriter(config) as writer:
        writer.write(_sentences(stream, random.Random(seed)))
    return stream


def _sentences(stream: DemoStream, rng: random.Random) -> Iterator[tuple[bytes | None, bytes]]:
    """`stream.messages` keyed sentences, each counted into `stream` as it is made."""
    slow_at = set(rng.sample(range(stream.messages), min(SLOW_MESSAGES, stream.messages)))
    for n in range(stream.messages):
        inject = "slow" if n in slow_at else "none"
        roll = rng.random()
        for kind, share in INJECTED.items():
            if inject == "none" and roll < share:
                inject = kind
            roll -= share
        words = rng.choices(WORDS, k=rng.randint(3, 8))
        stream.injected[inject] += 1
        if inject != "poison":
            stream.true_counts.update(words)
            if inject != "noid":
                stream.keyed_counts.update(words)
        message = {"id": n, "text": " ".join(words), "inject": inject}
        value = json.dumps(message, separators=(",", ":")).encode()  # SplitWords reads "text"
        yield (None if inject == "noid" else str(n).encode()), value


# One client per Python worker and URL (clients do not travel from the driver).
_redis = WorkerClients(redis.Redis.from_url)


class SplitSentence(BasicBolt):
    """Sentence -> one `(word, fail)` tuple per word, with the injected failures applied."""

    outputs = ("word", "fail")

    def __init__(self, redis_url: str, job: str, slow_seconds: float) -> None:
        self.redis_url = redis_url
        self.job = job
        self.slow_seconds = slow_seconds

    def prepare(self, context: TaskContext) -> None:
        self.redis = _redis.get(self.redis_url)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        message = json.loads(tuple_.record.value or b"{}")
        inject = message["inject"]
        first = inject != "none" and self.redis.incr(f"{self.job}:attempt:{message['id']}") == 1
        if inject == "poison":
            raise ValueError(f"poison message {message['id']}")
        if inject == "flaky" and first:
            raise RuntimeError(f"injected failure of message {message['id']}, first attempt")
        if inject == "slow" and first:
            time.sleep(self.slow_seconds)
        words = message["text"].split()
        for i, word in enumerate(words):
            collector.emit((word, inject == "late" and first and i == len(words) - 1))


class WordCountsInRedis:
    """A count bolt's running counts per word, summed in the task and written to a Redis hash
    in one round trip when it ends: a task's acks reach the driver only after `cleanup`
    returned, so a failed write acks nothing (at least once: replays count again)."""

    def __init__(self, redis_url: str, key: str) -> None:
        self.redis_url = redis_url
        self.key = key

    def prepare(self, context: TaskContext) -> None:
        self.counts: Counter[str] = Counter()

    def cleanup(self) -> None:
        with _redis.get(self.redis_url).pipeline(transaction=True) as pipe:
            for word, n in self.counts.items():
                pipe.hincrby(self.key, word, n)
            pipe.execute()


class CountWord(WordCountsInRedis, BasicBolt):
    """Adds one to the word's count, failing a word flagged `fail` (`WordCountsInRedis`)."""

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        if tuple_["fail"]:
            raise RuntimeError(f"injected failure counting {tuple_['word']!r}, first attempt")
        self.counts[tuple_["word"]] += 1


def word_count_chain(config: TopicConfig, job: str, slow_seconds: float) -> list[ChainItem]:
    """The Storm-style topology: split, group by word, count."""
    url = config.redis.url
    return [SplitSentence(url, job, slow_seconds), Fields("word"), CountWord(url, f"{job}:counts")]


class ColumnarSplitSentence(SplitWords):
    """`SplitSentence` in columns: the batch's words at once, `(word, fail)` rows; the few
    messages with an injected failure are read one by one to apply it."""

    outputs = ("word", "fail")

    def __init__(self, redis_url: str, job: str, slow_seconds: float) -> None:
        super().__init__("text")
        self.redis_url = redis_url
        self.job = job
        self.slow_seconds = slow_seconds

    def prepare(self, context: TaskContext) -> None:
        self.redis = _redis.get(self.redis_url)

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        words, rows = self.words(batch)
        values = batch.column("value")
        injected = pc.indices_nonzero(pc.invert(pc.match_substring(values, b'"inject":"none"')))
        failed, late = [], []
        for row in injected.to_pylist():
            message = json.loads(values[row].as_py())
            inject = message["inject"]
            first = self.redis.incr(f"{self.job}:attempt:{message['id']}") == 1
            if inject == "poison":
                failed.append(row)
                out.fail([row], f"poison message {message['id']}")
            elif inject == "flaky" and first:
                failed.append(row)
                out.fail([row], f"injected failure of message {message['id']}, first attempt")
            elif inject == "slow" and first:
                out.working_on(row)  # this message alone times out, not the whole batch
                time.sleep(self.slow_seconds)
                out.working_on(None)
            elif inject == "late" and first:
                late.append(row)
        # A failed message emits nothing (`SplitSentence` raises before its emits); a late
        # one's last word carries the count bolt's failure.
        kept = pc.invert(pc.is_in(rows, pa.array(failed, pa.int64())))
        words, rows = words.filter(kept), rows.filter(kept)
        row_of = rows.to_numpy()
        last = np.append(row_of[1:] != row_of[:-1], True)[: len(row_of)]  # a message's last word
        fail = np.isin(row_of, late) & last
        out.emit(rows, {"word": words, "fail": pa.array(fail)})


class ColumnarCountWord(WordCountsInRedis, ColumnarBolt):
    """`CountWord` in columns: fails the rows flagged `fail`, counts the others' words."""

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        fail = batch.column("fail")
        out.fail(fail, "injected failure counting a word, first attempt")
        self.counts.update(count_words(batch.column("word").filter(pc.invert(fail))))


def columnar_word_count_chain(
    config: TopicConfig, job: str, slow_seconds: float
) -> list[ChainItem]:
    """The Storm-style topology with columnar bolts: split, group by word, count."""
    url = config.redis.url
    return [
        ColumnarSplitSentence(url, job, slow_seconds),
        Fields("word"),
        ColumnarCountWord(url, f"{job}:counts"),
    ]


@dataclass(frozen=True, slots=True)
class CountOnce:
    """The exactly-once job's handler: a message's word counts, plus one effect counter and
    its id in a set, all applied with the dedup bolt's DONE in one atomic step."""

    job: str
    slow_seconds: float

    def __call__(self, record: Record, effects: Effects) -> None:
        message = json.loads(record.value or b"{}")
        inject, first = message["inject"], effects.attempt == 1
        if inject == "poison":
            raise ValueError(f"poison message {message['id']}")
        if inject in ("flaky", "late") and first:
            raise RuntimeError(f"injected failure of message {message['id']}, first attempt")
        if inject == "slow" and first:
            time.sleep(self.slow_seconds)
        for word in message["text"].split():
            effects.hincrby(f"{self.job}:counts", word)
        effects.incrby(f"{self.job}:effects")
        effects.sadd(f"{self.job}:ids", effects.id)


def exactly_once_chain(config: TopicConfig, job: str, slow_seconds: float) -> IdempotencyBolt:
    """The dedup bolt wrapping `CountOnce`."""
    return IdempotencyBolt(CountOnce(job, slow_seconds), config)


def read_effects(config: TopicConfig, job: str) -> tuple[int, int]:
    """(effects applied, distinct ids applied) of the exactly-once job."""
    client = _redis.get(config.redis.url)
    return int(client.get(f"{job}:effects") or 0), int(client.scard(f"{job}:ids"))


def read_counts(config: TopicConfig, key: str) -> Counter[str]:
    """The counts a job left in Redis."""
    raw = _redis.get(config.redis.url).hgetall(key)
    return Counter({_text(k): int(v) for k, v in raw.items()})


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def count_dead_letters(config: TopicConfig, timeout: float = 10.0) -> int:
    """How many records the dead-letter topic holds (all partitions)."""
    consumer = Consumer(client_settings(config, **{"group.id": f"{config.spout_id}-demo-report"}))
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
    with ZkSession(config) as session:
        return {p: s.offset for p, s in ZkOffsetStore(session).read_all().items()}

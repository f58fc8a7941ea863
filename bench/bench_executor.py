"""Executor throughput: kspout on Spark `local[2]` beside a bare confluent-kafka loop, in one run.

    python -m bench.bench_executor            # 360,000 messages (~3-6 min)
    python -m bench.bench_executor --quick    # 100,000 messages (~1.5 min)

Starts the embedded dev stack (Apache Kafka's broker, one KRaft node started from its jars,
and ZooKeeper; Redis is not needed), creates a fresh topic of 4 partitions through the admin
API, produces N keyed messages with 100-byte JSON-like values to it and waits until all are in.
Each value's "note" is a short sentence of 1 to 4 words (2.5 on average), padded with spaces.
Then, over that same topic:

* baselines: a bare confluent-kafka loop (one consumer, all partitions assigned from the
  beginning, `consume(num_messages=...)` in a loop) that reads `.value()` of each message, and
  one that reads every field kspout hands to user code (topic, partition, offset, key, value,
  timestamp, headers); also the value-only loop with librdkafka's defaults, and one that reads
  one partition at a time (kspout's access pattern). Ratios are given to the fastest value-only
  loop of the run (the targets' baseline) and to the first two;
* kspout's pieces in this process: `PartitionFetcher` alone, the executor's task body
  (`run_task`: fetch + trivial handler + outcomes), and the whole driver loop on the in-process
  executor (`LocalExecutor`), i.e. everything but Spark;
* `KafkaSpout(config, spark).run(...)` on Spark `local[2]` until caught up, at several batch
  sizes, with a plain handler, a one-stage `BasicBolt` chain and Storm's word count in two
  stages, written with row bolts (`SplitSentence`, `Fields("word")`, `CountWords`) and with
  columnar bolts (`kspout_demo.word_count`: `SplitWords("note")`, `Fields("word")`,
  `CountWords`). Every run has a fresh spout id and must ack exactly N offsets (asserted);
* the word count's Spark task bodies, row and columnar, run in this process one after another,
  with Spark's serializer between them: CPU microseconds per message of each stage (the best
  of REPEAT runs), beside the target for columnar bolts (COLUMNAR_TARGET);
* Spark latency: an empty Spark job, a run whose batches carry one tiny message per partition
  (seconds per batch), and a run with nothing to do (the fixed cost of `run()`).

Every case also reports CPU microseconds per record, summed over this process and all its
children (the Kafka broker's JVM, ZooKeeper, Spark's JVM and Python workers), and split by who
spent it, the broker on its own: on a shared machine the wall-clock figures move with other
work, the CPU cost much less.

Before the Spark cases are timed, the SparkSession is created and every kind of run is made
twice over a separate topic, so session start-up, Python worker start-up and most of the JVM's
JIT compilation are not in the figures.

Messages are produced lz4-compressed by default (`--compression` picks zstd or none): the
broker keeps the producer's batches as they are, and both the bare loops and kspout decompress
them in librdkafka, so the codec adds the same cost to both sides (see COMPRESSION).

Targets from design.md ("Performance targets"), as ratios to the fastest bare loop: on Spark,
plain handler >= 1.0, one `BasicBolt` >= 0.7, two stages with a grouping >= 0.3. This is a
benchmark, not a test: it prints PASS/MISS and always exits 0 (a run that acks the wrong number
of offsets is an error).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from pyspark.serializers import CPickleSerializer
from pyspark.sql import SparkSession

from bench.report import table
from kspout import BasicBolt, Fields, KafkaSpout, TaskContext, Tuple
from kspout.bolts import BasicCollector
from kspout.config import TopicConfig, parse_config
from kspout.contract import PartitionTask
from kspout.devstack import DevStack, create_topic
from kspout.driver import Driver, Progress
from kspout.executor.fetchers import close_fetchers
from kspout.executor.local import LocalExecutor
from kspout.executor.task import run_task
from kspout.executor.topology import ChainItem, Topology
from kspout.kafka import PartitionFetcher, Record
from kspout.partition_manager import PartitionManager
from kspout.policy import PartitionPolicy
from kspout.spark import spark_session
from kspout.spark.worker import (
    BatchSpec,
    Item,
    combine,
    first_stage,
    later_stage,
)
from kspout_demo.word_count import columnar_word_count

# design.md's targets on Spark, as ratios to the fastest bare loop of the run
HANDLER_TARGET, BOLT_TARGET, STAGES_TARGET = 1.0, 0.7, 0.3
# design.md: the columnar word count's task bodies, CPU us per message over both stages
COLUMNAR_TARGET = 4.0
# lz4: a common codec on production topics, and cheap to decompress. The broker stores the
# producer's batches as they are (topic `compression.type=producer`), so both the bare loops
# and kspout decompress in librdkafka, at the same cost per record; on the loaded 2-core dev
# machine the bare loops over lz4 and uncompressed topics measured within noise of each other.
COMPRESSION = "lz4"
PARTITIONS = 4  # of every topic this bench creates (kspout on `local[2]`: two tasks at once)
VALUE_BYTES = 100
PER_CONSUME = 5000  # messages per consume() call in the bare loop (kspout's fetcher uses the same)
ZK_ROOT = "/bench-executor"
MASTER = "local[2]"
REPEAT = 3  # bare loops and in-process cases: best of REPEAT
SPARK_REPEAT = 2  # Spark runs of each case: best of SPARK_REPEAT
TINY_BATCHES = 5  # batches of one message per partition, for the per-batch latency
WARM_N = 40_000  # messages of the warm-up topic (each kind of run twice: the JVM's JIT too)
# Storm's RandomSentenceSpout words; message i's note is 1 + i % 4 of them
WORDS = ("the", "cow", "jumped", "over", "moon", "an", "apple", "a", "day", "keeps", "doctor")
NOTE = b'"note":"'


# -- data --------------------------------------------------------------------------------------


def value_of(i: int) -> bytes:
    """A JSON-like value of exactly VALUE_BYTES bytes, unique per message; its note is a
    sentence of 1 to 4 words, padded with spaces."""
    head = f'{{"id":{i},"user":"user-{i % 9973:05d}","amount":{(i * 37) % 100_000 / 100:.2f},'
    head += NOTE.decode()
    words = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(1 + i % 4))
    return (head + words.ljust(VALUE_BYTES - len(head) - 2) + '"}').encode()


def produce(
    brokers: str, topic: str, n: int, compression: str, partitions: int = PARTITIONS
) -> float:
    """Produce n keyed messages round-robin over the first `partitions` partitions of `topic`
    (which `create_topic` made); seconds until all are acked."""
    producer = Producer(
        {
            "bootstrap.servers": brokers,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "compression.type": compression,
            "log_level": 0,
        }
    )
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value_of(i), b"key-%d" % i, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(60)
    if left:
        raise SystemExit(f"{left} messages to {topic} were not delivered within 60 s")
    return time.perf_counter() - t0


def wait_all_in(
    brokers: str, topic: str, n: int, partitions: int = PARTITIONS, timeout: float = 60.0
) -> None:
    """Until the high watermarks of the topic's `partitions` partitions add up to n, all with
    low watermark 0 (the cases read from offset 0)."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "bench-watermarks"})
    try:
        deadline = time.monotonic() + timeout
        while True:
            marks = [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                for p in range(partitions)
            ]
            if any(low for low, _ in marks):
                raise SystemExit(f"{topic} does not start at offset 0 (watermarks {marks})")
            if sum(high for _, high in marks) == n:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"{topic} holds {marks}, expected {n} messages in all")
            time.sleep(0.1)
    finally:
        consumer.close()


# -- baselines: bare confluent-kafka loops -----------------------------------------------------

# The bare loops use the librdkafka setting kspout's fetch consumers use (`fetch.wait.max.ms`
# 10 instead of 500), so both ask the broker the same way. They start at offset 0, the low
# watermark, as kspout's plans do (OFFSET_BEGINNING first costs librdkafka an offset lookup).
# The librdkafka defaults with OFFSET_BEGINNING are measured too, as an extra row; against the
# real broker the two were within noise of each other over all four partitions.
BARE_SETTINGS: dict[str, Any] = {"fetch.wait.max.ms": 10}


def _bare_consumer(
    brokers: str, topic: str, start: int, settings: dict[str, Any], partitions: int = PARTITIONS
) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"bench-bare-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **settings,
        }
    )
    consumer.assign([TopicPartition(topic, p, start) for p in range(partitions)])
    return consumer


def bare_values(
    brokers: str,
    topic: str,
    n: int,
    start: int = 0,
    settings: dict[str, Any] = BARE_SETTINGS,
    partitions: int = PARTITIONS,
) -> float:
    """Seconds for a bare loop to read `.value()` of all n messages of the topic's
    `partitions` partitions."""
    t0 = time.perf_counter()
    consumer = _bare_consumer(brokers, topic, start, settings, partitions)
    seen = 0
    size = 0
    while seen < n:
        for msg in consumer.consume(num_messages=PER_CONSUME, timeout=1.0):
            if msg.error() is None:
                size += len(msg.value() or b"")
                seen += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    assert seen == n and size == n * VALUE_BYTES, (seen, size)
    return elapsed


def bare_values_serial(brokers: str, topic: str, n: int) -> float:
    """`bare_values`, but one partition at a time (kspout's access pattern: a task fetches one
    partition); against the broker this was the faster of the two loops, by about 2x."""
    per = n // PARTITIONS
    t0 = time.perf_counter()
    consumer = _bare_consumer(brokers, topic, 0, BARE_SETTINGS)
    size = 0
    for p in range(PARTITIONS):
        consumer.assign([TopicPartition(topic, p, 0)])
        seen = 0
        while seen < per:
            for msg in consumer.consume(num_messages=min(PER_CONSUME, per - seen), timeout=1.0):
                if msg.error() is None:
                    size += len(msg.value() or b"")
                    seen += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    assert size == n * VALUE_BYTES, size
    return elapsed


def bare_fields(brokers: str, topic: str, n: int) -> float:
    """Seconds for a bare loop to read every field kspout hands to user code."""
    t0 = time.perf_counter()
    consumer = _bare_consumer(brokers, topic, 0, BARE_SETTINGS)
    seen = 0
    checksum = 0
    while seen < n:
        for msg in consumer.consume(num_messages=PER_CONSUME, timeout=1.0):
            if msg.error() is None:
                fields = (
                    msg.topic(),
                    msg.partition(),
                    msg.offset(),
                    msg.key(),
                    msg.value(),
                    msg.timestamp()[1],
                    msg.headers() or (),
                )
                checksum += fields[2] or 0
                seen += 1
    elapsed = time.perf_counter() - t0
    consumer.close()
    per_partition = n // PARTITIONS
    assert seen == n and checksum == PARTITIONS * per_partition * (per_partition - 1) // 2
    return elapsed


# -- kspout's pieces, in this process ----------------------------------------------------------


def trivial(record: Record) -> None:
    """The trivial handler: touch the value, as the bare loop does."""
    len(record.value or b"")


class Pass(BasicBolt):
    """A bolt that does nothing (its input is acked when `process` returns)."""

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        len(tuple_.record.value or b"")


class SplitSentence(BasicBolt):
    """Storm's split bolt: one `(word,)` tuple per word of the message's note."""

    outputs = ("word",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        value = tuple_.record.value or b""
        for word in value[value.index(NOTE) + len(NOTE) : -2].split():
            collector.emit((word,))


class CountWords(BasicBolt):
    """Storm's count bolt: a running count per word, kept by the task."""

    def prepare(self, context: TaskContext) -> None:
        self.counts: Counter[bytes] = Counter()

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        self.counts[tuple_["word"]] += 1


def word_count() -> list[ChainItem]:
    """Storm's word count topology, in two stages."""
    return [SplitSentence(), Fields("word"), CountWords()]


def fetch_alone(config: TopicConfig, n: int) -> float:
    """Seconds for one `PartitionFetcher` to fetch every partition in full, one after another."""
    per = n // PARTITIONS
    with PartitionFetcher(config) as fetcher:
        t0 = time.perf_counter()
        got = 0
        for p in range(PARTITIONS):
            got += len(fetcher.fetch(config.topic, p, [(0, per)]).records)
        elapsed = time.perf_counter() - t0
    assert got == n, got
    return elapsed


def whole_partitions(topic: str, n: int) -> list[PartitionTask]:
    """One task per partition, planning all of its n / PARTITIONS offsets."""
    per = n // PARTITIONS
    policy = PartitionPolicy(message_timeout=3600.0)
    plans = [PartitionManager(policy, 0).plan(per, per) for _ in range(PARTITIONS)]
    return [PartitionTask(topic, p, plan) for p, plan in enumerate(plans)]


def task_body(config: TopicConfig, n: int) -> float:
    """Seconds for `run_task` (fetch + handler + outcomes) over every partition, in process."""
    tasks = whole_partitions(config.topic, n)
    with PartitionFetcher(config) as fetcher:
        t0 = time.perf_counter()
        results = [run_task(fetcher, task, trivial) for task in tasks]
        elapsed = time.perf_counter() - t0
    acked = sum(o.count for r in results for o in r.outcomes)
    assert acked == n, acked
    return elapsed


# Who spent the CPU: this process (the driver, or the in-process cases), Spark's Python
# workers, Spark's JVMs, the Kafka broker's JVM, and the rest (ZooKeeper).
GROUPS = ("this", "workers", "jvm", "broker", "other")
KAFKA_MAIN = b"kafka.Kafka"  # the broker's main class, an argument of its own on its command line


def _group(pid: int, cmdline: bytes, name: bytes) -> str:
    program, _, args = cmdline.partition(b"\0")
    if pid == os.getpid():
        return "this"
    if program.endswith(b"java"):  # Spark's, ZooKeeper's (the pyspark wheel's jars) or Kafka's
        if KAFKA_MAIN in args.split(b"\0"):
            return "broker"
        return "other" if b"ZooKeeperServerMain" in args else "jvm"
    if b"pyspark" in args:  # python -m pyspark.daemon, and the workers it forks
        return "workers"
    if not cmdline and name.startswith(b"python"):  # one of Spark's that exited, not reaped yet
        return "workers"
    return "other"


def _read_proc(pid: str) -> tuple[int, float, float, bytes, bytes] | None:
    """(parent pid, its own CPU seconds, CPU seconds of its reaped children, command line,
    name) of a live (or exited, not yet reaped) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            name, _, rest = f.read().partition(b" (")[2].rpartition(b")")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None  # exited meanwhile
    fields = rest.split()
    tick = os.sysconf("SC_CLK_TCK")
    own = (int(fields[11]) + int(fields[12])) / tick
    return int(fields[1]), own, (int(fields[13]) + int(fields[14])) / tick, cmdline, name


def tree_cpu() -> dict[str, float]:
    """CPU seconds used so far by this process and all its descendants (the Kafka broker,
    ZooKeeper, Spark's JVMs and Python workers) by GROUPS, from /proc. Reaped children count
    through their parent's cutime/cstime: as Python workers when the parent is Spark's JVM (it
    starts Python processes that exit, e.g. the Python data sources' planners and readers) or
    a Python worker, else as the parent. Empty where /proc is not available."""
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    procs = {int(name): info for name in names if (info := _read_proc(name)) is not None}
    mine = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, info in procs.items() if info[0] in mine} - mine
        mine |= found
        grew = bool(found)
    spent = dict.fromkeys(GROUPS, 0.0)
    for pid in mine & procs.keys():
        _, own, children, cmdline, name = procs[pid]
        group = _group(pid, cmdline, name)
        spent[group] += own
        spent["workers" if group in ("jvm", "workers") else group] += children
    return spent


@dataclass(frozen=True)
class Sample:
    seconds: float  # wall time, as the case measures it
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds by GROUPS meanwhile

    @property
    def total_cpu(self) -> float:
        """CPU seconds of the whole process tree (NaN where /proc is not available)."""
        return sum(self.cpu.values()) if self.cpu else float("nan")

    def per(self, count: int) -> Sample:
        """This sample divided by `count` (per batch, per record)."""
        return Sample(self.seconds / count, {k: v / count for k, v in self.cpu.items()})


def sample(run: Callable[[], float]) -> Sample:
    """One run of `run`, with the CPU the process tree spent on it."""
    before = tree_cpu()
    seconds = run()
    after = tree_cpu()
    return Sample(seconds, {group: cpu - before.get(group, 0.0) for group, cpu in after.items()})


def best(run: Callable[[], float], repeat: int = REPEAT) -> Sample:
    """The fastest of `repeat` runs, after one untimed warm-up."""
    run()
    samples = []
    for _ in range(repeat):
        gc.collect()
        samples.append(sample(run))
    return min(samples, key=lambda s: s.seconds)


# -- the word count's stages, in this process --------------------------------------------------


def _shuffled(outputs: list[list[Item]], width: int) -> list[Iterator[Item]]:
    """Items by target as Spark's `partitionBy` ships them: pickled per source task and
    target now, unpickled when the receiving task reads them."""
    serializer = CPickleSerializer()
    blobs: list[list[bytes]] = [[] for _ in range(width)]
    for items in outputs:
        buckets: defaultdict[int, list[Item]] = defaultdict(list)
        for item in items:
            buckets[item[0]].append(item)
        for target, bucket in buckets.items():
            blobs[target].append(serializer.dumps(bucket))  # type: ignore[no-untyped-call]
    return [_unpickled(serializer, blobs[target]) for target in range(width)]


def _unpickled(serializer: CPickleSerializer, blobs: list[bytes]) -> Iterator[Item]:
    for blob in blobs:
        yield from serializer.loads(blob)  # type: ignore[no-untyped-call]


STAGES = (
    "stage 1: fetch, split, route, pickle",
    "stage 2: unpickle, count, pickle ledgers",
    "merge: unpickle ledgers, settle the roots",
)


def stage_costs(config: TopicConfig, n: int, chain: Sequence[ChainItem]) -> dict[str, float]:
    """CPU seconds of each kind of Spark task of a word count `chain`, run in this process one
    after another with Spark's serializer between them (the JVM's share is not in these)."""
    tasks = whole_partitions(config.topic, n)
    spec = BatchSpec(config, Topology.of(chain), 0, tuple(range(PARTITIONS)))
    t0 = time.process_time()
    split = [list(first_stage(spec, i, [task])) for i, task in enumerate(tasks)]
    routed = _shuffled(split, PARTITIONS)
    t1 = time.process_time()
    counted = [list(later_stage(spec, 1, i, items)) for i, items in enumerate(routed)]
    merging = _shuffled(counted, PARTITIONS)
    t2 = time.process_time()
    results = [r for i, items in enumerate(merging) for r in combine(spec, tasks, i, items)]
    t3 = time.process_time()
    acked = sum(o.count for r in results for o in r.outcomes)
    assert acked == n, acked
    return dict(zip(STAGES, (t1 - t0, t2 - t1, t3 - t2), strict=True))


def best_stages(config: TopicConfig, n: int, chain: Sequence[ChainItem]) -> dict[str, float]:
    """`stage_costs` of the run with the least CPU in all, of REPEAT (a shared machine's
    other work only ever adds to a run's figures)."""
    runs = [stage_costs(config, n, chain) for _ in range(REPEAT)]
    return min(runs, key=lambda costs: sum(costs.values()))


# -- kspout runs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    brokers: str
    zookeeper: str

    def config(self, topic: str, batch_size: int, in_flight: int = 2, **extra: Any) -> TopicConfig:
        """A fresh spout id on `topic`, so every run starts at the earliest offset."""
        return parse_config(
            {
                "topic": topic,
                "spout_id": f"bench-{uuid.uuid4().hex[:10]}",
                "zk_root": ZK_ROOT,
                "brokers": self.brokers,
                "zookeeper": self.zookeeper,
                "batch_size": batch_size,
                "max_batches_in_flight": in_flight,
                "commit_interval": 1.0,
                **extra,
            }
        )


def spout_run(
    config: TopicConfig, spark: SparkSession | None, chain: ChainItem | Sequence[ChainItem], n: int
) -> tuple[float, Progress]:
    """Run until caught up, on Spark (or in process when `spark` is None); check n acked."""
    t0 = time.perf_counter()
    if spark is None:
        with Driver(config, LocalExecutor(config, chain)) as driver:
            progress = driver.run(until_caught_up=True)
    else:
        progress = KafkaSpout(config, spark).run(chain, until_caught_up=True)
    elapsed = time.perf_counter() - t0
    acked = progress.total("acked")
    if acked != n or progress.batch_errors:
        raise AssertionError(
            f"{config.topic} (batch_size {config.batch_size}): acked {acked} of {n} offsets, "
            f"{progress.batch_errors} batch errors: the figure would be wrong"
        )
    return elapsed, progress


def empty_job(spark: SparkSession) -> Sample:
    """A Spark job of PARTITIONS tasks that do nothing: the fastest of 5, after a warm-up."""
    sc = spark.sparkContext

    def job() -> float:
        t0 = time.perf_counter()
        sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitions(_count).collect()
        return time.perf_counter() - t0

    return best(job, repeat=5)


def _count(items: Iterable[int]) -> list[int]:
    return [sum(1 for _ in items)]


# -- report ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    case: str
    sample: Sample
    note: str = ""
    target: float | None = None  # design.md's ratio to the fastest loop, where one applies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="100,000 messages")
    parser.add_argument("-n", type=int, default=None, help="messages (overrides; multiple of 4)")
    parser.add_argument(
        "--batch-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="comma-separated batch_size values per partition (default 10000,50000,100000)",
    )
    parser.add_argument("--compression", default=COMPRESSION, choices=["lz4", "zstd", "none"])
    args = parser.parse_args(argv)
    n = args.n or (100_000 if args.quick else 360_000)
    n -= n % PARTITIONS
    batch_sizes: list[int] = args.batch_sizes or [10_000, 50_000, 100_000]
    started = time.perf_counter()

    print(
        f"Executor throughput: {n:,} messages ({VALUE_BYTES}-byte values, keyed, "
        f"{args.compression}) over {PARTITIONS} partitions of one Apache Kafka broker (KRaft)"
    )
    print(
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores; "
        f"kspout on Spark {MASTER}; confluent-kafka, librdkafka "
        f"{confluent_kafka.libversion()[0]}; {load_note()} at the start"
    )
    print()

    with (
        tempfile.TemporaryDirectory(prefix="bench-executor-") as tmp,
        DevStack(Path(tmp), components=("kafka", "zookeeper")) as stack,
    ):
        setup = Setup(stack.info.brokers, stack.info.zookeeper)
        run_id = uuid.uuid4().hex[:6]
        topics = Topics(*(f"bench-{k}-{run_id}" for k in ("data", "warm", "tiny")))
        for topic in (topics.data, topics.warm, topics.tiny):
            create_topic(setup.brokers, topic, PARTITIONS)
        produce_s = produce(setup.brokers, topics.data, n, args.compression)
        wait_all_in(setup.brokers, topics.data, n)
        produce(setup.brokers, topics.warm, WARM_N, args.compression)
        produce(setup.brokers, topics.tiny, TINY_BATCHES * PARTITIONS, "none")
        wait_all_in(setup.brokers, topics.warm, WARM_N)
        wait_all_in(setup.brokers, topics.tiny, TINY_BATCHES * PARTITIONS)
        print(f"produced {n:,} messages in {produce_s:.1f} s")

        results = measure(setup, topics, n, batch_sizes)
        close_fetchers()

    print_report(results, n)
    print()
    print(f"total run time {time.perf_counter() - started:.0f} s; {load_note()} at the end")
    return 0


@dataclass(frozen=True)
class Topics:
    data: str  # the N messages every case reads
    warm: str  # WARM_N messages for the Spark warm-up
    tiny: str  # one message per partition per batch, for the latency cases


@dataclass
class Results:
    throughput: list[Row]
    latency: list[tuple[str, Sample, str]]
    stages: dict[str, dict[str, float]]  # per word count: CPU seconds of each task kind


def spark_case(
    setup: Setup,
    spark: SparkSession,
    topic: str,
    batch: int,
    chain: ChainItem | Sequence[ChainItem],
    n: int,
    repeat: int,
) -> tuple[Sample, Progress]:
    """The fastest of `repeat` runs of the chain on Spark, each with a fresh spout id."""
    runs: list[tuple[Sample, Progress]] = []
    progress: list[Progress] = []

    def run() -> float:
        seconds, done = spout_run(setup.config(topic, batch), spark, chain, n)
        progress.append(done)
        return seconds

    for _ in range(repeat):
        runs.append((sample(run), progress[-1]))
    return min(runs, key=lambda r: r[0].seconds)


# The chains with bolts: label, the chain, design.md's target on Spark.
def bolt_chains() -> list[tuple[str, ChainItem | Sequence[ChainItem], float]]:
    return [
        ("1 BasicBolt", Pass(), BOLT_TARGET),
        *(
            (f'word count, {kind}, Fields("word")', chain, STAGES_TARGET)
            for kind, chain in WORD_COUNTS
        ),
    ]


# Storm's word count, written both ways: label, the chain.
WORD_COUNTS = (
    ("row bolts", word_count()),
    ("columnar bolts", columnar_word_count("note")),
)


def measure(setup: Setup, topics: Topics, n: int, batch_sizes: list[int]) -> Results:
    """Every case, in the order of the report."""
    rows = baselines(setup.brokers, topics.data, n)
    rows += in_process(setup, topics.data, n, batch_sizes)
    config = setup.config(topics.data, max(batch_sizes))
    stages = {kind: best_stages(config, n, chain) for kind, chain in WORD_COUNTS}
    spark = warmed_session(setup, topics.warm)
    rows += on_spark(setup, spark, topics.data, n, batch_sizes)
    latency = latencies(setup, spark, topics.tiny)
    spark.stop()
    return Results(rows, latency, stages)


def baselines(brokers: str, topic: str, n: int) -> list[Row]:
    """The bare confluent-kafka loops, each best of REPEAT after a warm-up."""
    defaults = best(lambda: bare_values(brokers, topic, n, OFFSET_BEGINNING, {}))
    serial = best(lambda: bare_values_serial(brokers, topic, n))
    return [
        Row("bare loop, .value() only", best(lambda: bare_values(brokers, topic, n))),
        Row("bare loop, all 7 fields", best(lambda: bare_fields(brokers, topic, n))),
        Row("bare loop, .value(), librdkafka defaults", defaults, "OFFSET_BEGINNING"),
        Row("bare loop, .value(), one partition at a time", serial, "kspout's pattern"),
    ]


def in_process(setup: Setup, topic: str, n: int, batch_sizes: list[int]) -> list[Row]:
    """kspout's pieces in this process, one Python thread."""
    big = max(batch_sizes)
    cfg = setup.config(topic, big)
    rows = [
        Row("PartitionFetcher.fetch alone, in process", best(lambda: fetch_alone(cfg, n))),
        Row("run_task (fetch + handler + outcomes), in process", best(lambda: task_body(cfg, n))),
    ]
    for batch in sorted({min(batch_sizes), big}):

        def local(batch: int = batch) -> float:
            return spout_run(setup.config(topic, batch), None, trivial, n)[0]

        rows.append(Row(f"driver + LocalExecutor, handler, batch {batch:,}", best(local)))
    for label, chain, _ in bolt_chains():

        def local_chain(chain: ChainItem | Sequence[ChainItem] = chain) -> float:
            return spout_run(setup.config(topic, big), None, chain, n)[0]

        rows.append(
            Row(f"driver + LocalExecutor, {label}, batch {big:,}", sample(local_chain), "1 run")
        )
    return rows


def warmed_session(setup: Setup, warm: str) -> SparkSession:
    """The SparkSession, with every kind of run made twice over the warm-up topic (session and
    Python worker start-up, and the bulk of the JVM's JIT compilation, stay out of the
    figures)."""
    t0 = time.perf_counter()
    spark = spark_session(MASTER)
    spark.sparkContext.setLogLevel("ERROR")
    session_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _, chain, _ in [("handler", trivial, HANDLER_TARGET), *bolt_chains()]:
        for _ in range(2):
            spout_run(setup.config(warm, WARM_N // PARTITIONS // 2), spark, chain, WARM_N)
    print(
        f"SparkSession {MASTER} started in {session_s:.1f} s and warmed up in "
        f"{time.perf_counter() - t0:.1f} s over a separate {WARM_N:,}-message topic (neither "
        "is in the figures below)"
    )
    print()
    return spark


def on_spark(
    setup: Setup, spark: SparkSession, topic: str, n: int, batch_sizes: list[int]
) -> list[Row]:
    """`KafkaSpout.run` on Spark: the handler at every batch size, the bolt chains at the
    smallest and the largest; each best of SPARK_REPEAT."""
    rows = []
    for batch in batch_sizes:
        result, progress = spark_case(setup, spark, topic, batch, trivial, n, SPARK_REPEAT)
        note = f"{progress.batches} batches, best of {SPARK_REPEAT}"
        label = f"kspout Spark, handler, batch {batch:,}"
        rows.append(Row(label, result, note, HANDLER_TARGET))
    for label, chain, target in bolt_chains():
        for batch in sorted({min(batch_sizes), max(batch_sizes)}):
            result, progress = spark_case(setup, spark, topic, batch, chain, n, SPARK_REPEAT)
            note = f"{progress.batches} batches, best of {SPARK_REPEAT}"
            rows.append(Row(f"kspout Spark, {label}, batch {batch:,}", result, note, target))
    return rows


def latencies(setup: Setup, spark: SparkSession, tiny: str) -> list[tuple[str, Sample, str]]:
    """An empty Spark job, kspout batches of one message per partition (one and two in
    flight), and a run with nothing to do."""
    latency: list[tuple[str, Sample, str]] = []
    latency.append(("empty Spark job, 4 tasks", empty_job(spark), "best of 5"))
    tiny_n = TINY_BATCHES * PARTITIONS
    for in_flight in (1, 2):
        config = setup.config(tiny, 1, in_flight=in_flight)
        batches: list[int] = []

        def tiny_run(config: TopicConfig = config, batches: list[int] = batches) -> float:
            seconds, progress = spout_run(config, spark, trivial, tiny_n)
            batches.append(progress.batches)
            return seconds

        whole = sample(tiny_run)
        latency.append(
            (
                f"kspout run, {batches[0]} batches of 4 x 1 message, in flight {in_flight}",
                whole.per(batches[0]),
                f"per batch; {whole.seconds:.2f} s in all, fixed cost included",
            )
        )
    config = setup.config(tiny, 1)
    spout_run(config, spark, trivial, tiny_n)
    done: list[Progress] = []

    def nothing_to_do() -> float:
        t0 = time.perf_counter()
        done.append(KafkaSpout(config, spark).run(trivial, until_caught_up=True))
        return time.perf_counter() - t0

    fixed = sample(nothing_to_do)
    assert done[0].batches == 0 and done[0].total("acked") == 0, done
    latency.append(
        ("kspout run() with nothing to do (fixed cost)", fixed, "connect, register, commit, close")
    )
    return latency


def print_report(results: Results, n: int) -> None:
    """The throughput table, the word count's stages, and the latency table."""
    print_throughput(results.throughput, n)
    print()
    print_stages(results.stages, n)
    print()
    print("Latency (seconds; CPU seconds of the whole process tree)")
    print(
        table(
            ["case", "seconds", "CPU s", "note"],
            [
                [case, f"{s.seconds:.3f}", f"{s.total_cpu:.3f}", note]
                for case, s, note in results.latency
            ],
            "<>><",
        )
    )


def print_throughput(rows: list[Row], n: int) -> None:
    value, fields = rows[0].sample, rows[1].sample
    fastest = min(r.sample.seconds for r in rows if r.case.startswith("bare loop, .value()"))
    cells = []
    for row in rows:
        sample = row.sample
        ratio = fastest / sample.seconds
        verdict = "" if row.target is None else f"{'PASS' if ratio >= row.target else 'MISS'}"
        per_record = sample.per(n)
        cells.append(
            [
                row.case,
                f"{n / sample.seconds:,.0f}",
                f"{sample.seconds:.2f}",
                f"{ratio:.2f}",
                f"{value.seconds / sample.seconds:.2f}",
                f"{fields.seconds / sample.seconds:.2f}",
                f"{per_record.total_cpu * 1e6:.1f}",
                *(f"{per_record.cpu.get(group, math.nan) * 1e6:.1f}" for group in GROUPS),
                "" if row.target is None else f">= {row.target:.1f} {verdict}",
                row.note,
            ]
        )
    print(
        "Throughput: records/s end to end. Ratios = baseline time / case time (1.00 = as fast "
        "as the baseline): 'vs fastest' to the fastest .value()-only loop of this run (design "
        "targets, in 'target', apply to it), 'vs value' to the .value()-only loop over all "
        "partitions, 'vs fields' to the loop reading all 7 fields. CPU = CPU us per record of "
        "the whole process tree, then split: this process (the driver, or the in-process "
        "case), Spark's Python workers, Spark's JVM, the Kafka broker's JVM, the rest "
        "(ZooKeeper)."
    )
    headers = ["case", "records/s", "seconds", "vs fastest", "vs value", "vs fields"]
    headers += ["CPU us/rec", *GROUPS, "target", "note"]
    print(table(headers, cells, "<" + ">" * (6 + len(GROUPS)) + "<<"))
    print()
    print(
        f"Spark {MASTER} runs two tasks (two Python workers) at once, each fetching its own "
        "partitions; the bare loops and the in-process cases are one Python thread (librdkafka "
        "adds its own threads). The Kafka broker is a JVM of its own on the same cores. "
        f"Bare loops and in-process cases: best of {REPEAT} after a warm-up. Spark runs are "
        "timed around `KafkaSpout.run()`, so driver start, ZooKeeper registration and the "
        "final commit are included (see the fixed cost below)."
    )


def print_stages(stages: dict[str, dict[str, float]], n: int) -> None:
    """CPU per message of each kind of word-count task, row and columnar bolts side by side,
    the columnar total against its target, and the ceiling the totals set."""
    words = sum(1 + i % 4 for i in range(n)) / n
    kinds = list(stages)
    print(
        f"Word count, the Spark task bodies in this process (CPU us per message, {words:.1f} "
        f"words per message, best of {REPEAT}; librdkafka's threads included, the JVM's "
        "shuffle not):"
    )
    cells = [[name, *(f"{stages[k][name] / n * 1e6:.1f}" for k in kinds)] for name in STAGES]
    totals = {k: sum(stages[k].values()) / n * 1e6 for k in kinds}
    cells.append(["all three", *(f"{totals[k]:.1f}" for k in kinds)])
    print(table(["task", *kinds], cells, "<" + ">" * len(kinds)))
    columnar = totals.get("columnar bolts")
    if columnar is not None:
        verdict = "PASS" if columnar <= COLUMNAR_TARGET else "MISS"
        ratio = totals["row bolts"] / columnar
        print(
            f"columnar bolts: {columnar:.1f} us per message, {ratio:.1f}x less than row bolts; "
            f"target <= {COLUMNAR_TARGET:.1f} {verdict}"
        )
    cores = os.cpu_count() or 1
    for kind in kinds:
        print(
            f"On {cores} cores the Python workers alone cannot pass "
            f"{cores * 1e6 / totals[kind]:,.0f} messages/s with {kind}; Spark's JVM (shuffle, "
            "scheduling) and the driver take their share of the same cores (see the split above)."
        )


def load_note() -> str:
    """The 1-minute load average, with a warning when other work competes for the cores."""
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    warning = ""
    if load > 0.5:
        warning = f" - other work is running on {cores} cores: wall-clock figures are noisy"
    return f"load average {load:.2f}{warning}"


if __name__ == "__main__":
    raise SystemExit(main())

"""kspout side by side with Spark's own Kafka source, on one real broker, topic and Spark session.

    python -m bench.bench_vs_spark                     # 200,000 messages (~3 min on 2 cores)
    python -m bench.bench_vs_spark --messages 40000    # a short run
    python -m bench.bench_vs_spark --json              # the figures as JSON on stdout

Starts the embedded dev stack (Apache Kafka's broker, one KRaft node, and ZooKeeper for
`KafkaSpout`'s offsets), creates a topic of 4 partitions and produces N keyed messages to it
(lz4, 100-byte JSON values, as `bench_executor`'s: `{"id", "user", "amount", "note"}`, the note
a sentence of 1 to 4 words). One SparkSession `local[2]` (`spark.sql.shuffle.partitions` 4) has
Spark's Kafka source (the `spark-sql-kafka-0-10` connector of the same Spark release, which
deploy/setup.sh fetches) and `format("kspout")`. Each case is written as a user of each would
write it, reads the whole topic from the earliest offset, and must see all N messages:

* (a) count the rows: `readStream.format("kafka")` and `format("kspout")`, trigger
  `availableNow`, `foreachBatch` counting the frame; no per-record Python;
* (b) a Python function that reads every value: Spark's source with `mapInArrow`;
  `format("kspout")` with the same code; `KafkaSpout.run(handler)`;
  `KafkaSpout.foreach_batch` with the same `mapInArrow`;
* (c) parse the JSON values and sum `amount` by `user`: `from_json` and `groupBy` on each
  source; `KafkaSpout.run` with two row bolts (`ParseOrder`, `Fields("user")`, `SumByUser`);
* (d) Storm's word count: `split`, `explode` and `groupBy` on each source; `KafkaSpout.run`
  with the row bolts `SplitSentence`, `Fields("word")`, `CountWords` (from `bench_executor`),
  and with the columnar bolts `SplitWords("note")`, `Fields("word")`, `CountWords` (from
  `kspout_demo.word_count`);
* (e) latency, produce to handler, at a steady 5,000 messages/s for LATENCY_SECONDS: Spark's
  source with its default trigger (the next micro-batch as soon as the last one ends) and a
  `mapInArrow` handler, against `KafkaSpout.run(handler)` with kspout's defaults. Both read
  the Kafka timestamp the producer set and the handler's clock (one machine, one clock).

Every throughput case runs once untimed over a separate small topic (query start, Python
workers, the JVM's JIT), then once timed. A `KafkaSpout` case reads everything in one batch
(`batch_size` = the messages per partition), as `availableNow` does. Printed per case:
records/s, CPU microseconds per record by who spent it (this process: the driver; Spark's JVM,
where Spark's Kafka source runs; Spark's Python workers; the Kafka broker; ZooKeeper with the
rest), read from /proc before and after, and the ratios to Spark's Kafka source in the same
run. A benchmark, not a test: it exits 0 unless a case sees the wrong number of messages.

Another case is a few lines: a function `(Bench, topic, n) -> int` (what it saw) and one
`Case` in `CASES`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa  # type: ignore[import-untyped]
import pyspark
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.bench_executor import (
    Setup,
    load_note,
    produce,
    sample,
    spout_run,
    trivial,
    value_of,
    wait_all_in,
    word_count,
)
from bench.report import table
from kspout import BasicBolt, Fields, KafkaSpout, TaskContext, Tuple
from kspout.bolts import BasicCollector
from kspout.devstack import DevStack, create_topic
from kspout.executor.fetchers import close_fetchers
from kspout.kafka import Record
from kspout.spark import spark_session
from kspout_demo.word_count import columnar_word_count

MASTER = "local[2]"
PARTITIONS = 4
WARM_N = 20_000  # messages of the warm-up topic
RATE = 5_000  # messages/s of the latency cases
LATENCY_SECONDS = 30.0  # of producing, per latency case
LATENCY_SKIP = 5.0  # seconds at the start of a latency case left out (queries starting)
SPARK_KAFKA = 'format("kafka")'  # the baseline of every group
CONNECTOR = "spark-sql-kafka-0-10_2.13"
# Who spent the CPU, as printed (bench_executor's groups: "this" is the driver here).
SHOWN = {"this": "driver", "jvm": "JVM", "workers": "Python", "broker": "broker", "other": "ZK"}


# -- the session -------------------------------------------------------------------------------


def connector_jars() -> list[str]:
    """The jars of Spark's Kafka source for this pyspark, from the cache deploy/setup.sh fills."""
    version = pyspark.__version__
    cache = os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))
    where = Path(os.environ.get("KSPOUT_SPARK_KAFKA_JARS", f"{cache}/kspout/spark-kafka-{version}"))
    jars = sorted(str(jar) for jar in where.glob("*.jar"))
    if not (where / ".complete").exists() or not any(CONNECTOR in jar for jar in jars):
        raise SystemExit(
            f"Spark's Kafka source for pyspark {version} is not in {where}: run deploy/setup.sh "
            f"(Maven Central must serve {CONNECTOR} {version}; pyproject.toml pins a pyspark "
            "whose connector it serves)"
        )
    return jars


def session() -> SparkSession:
    """One SparkSession for every case: both sources, the same settings."""
    spark = spark_session(
        MASTER,
        "bench-vs-spark",
        {
            "spark.jars": ",".join(connector_jars()),
            "spark.sql.shuffle.partitions": str(PARTITIONS),
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass(frozen=True)
class Bench:
    spark: SparkSession
    setup: Setup  # brokers and ZooKeeper, and fresh KafkaSpout configs
    tmp: Path  # checkpoints

    def stream(self, source: str, topic: str) -> DataFrame:
        """The topic from its earliest offset, through `format(source)`, with Spark's option
        names (kspout's source takes them too)."""
        return (
            self.spark.readStream.format(source)
            .option("subscribe", topic)
            .option("kafka.bootstrap.servers", self.setup.brokers)
            .option("startingOffsets", "earliest")
            .load()
        )

    def drain(self, df: DataFrame, each: Callable[[DataFrame, int], None]) -> None:
        """Run `each(frame, batch_id)` over everything in the topic now (`availableNow`)."""
        query = (
            df.writeStream.trigger(availableNow=True)
            .option("checkpointLocation", str(self.tmp / f"checkpoint-{uuid.uuid4().hex}"))
            .foreachBatch(each)
            .start()
        )
        query.awaitTermination()

    def spout(self, topic: str, n: int) -> KafkaSpout:
        """A `KafkaSpout` with a fresh spout id that reads the topic in one batch."""
        return KafkaSpout(self.setup.config(topic, max(1, n // PARTITIONS)), self.spark)


# -- the user code -----------------------------------------------------------------------------


def read_values(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`mapInArrow`: hand every value to a Python function (`len`, as `trivial` does)."""
    for batch in batches:
        values = batch.column(0).to_pylist()
        for value in values:
            len(value or b"")
        yield pa.RecordBatch.from_pydict({"n": [len(values)]})


def summed(df: DataFrame) -> int:
    """Rows seen by `read_values` over the frame's values."""
    total = df.select("value").mapInArrow(read_values, "n long").agg(F.sum("n")).collect()
    return int(total[0][0] or 0)


ORDER = "user string, amount double"


def by_user(df: DataFrame) -> int:
    """Parse each value's JSON and sum `amount` by `user`; the rows parsed."""
    orders = df.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o"))
    sums = orders.groupBy("o.user").agg(F.sum("o.amount"), F.count("*").alias("n")).collect()
    return sum(row["n"] for row in sums)


def words_of(df: DataFrame) -> int:
    """Storm's word count on a frame of messages; the words counted."""
    note = F.get_json_object(F.col("value").cast("string"), "$.note")
    words = df.select(F.explode(F.split(F.trim(note), " +")).alias("word"))
    counts = words.groupBy("word").count().collect()
    return sum(row["count"] for row in counts)


class ParseOrder(BasicBolt):
    """The JSON value's `(user, amount)`."""

    outputs = ("user", "amount")

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        order = json.loads(tuple_.record.value or b"{}")
        collector.emit((order["user"], order["amount"]))


class SumByUser(BasicBolt):
    """A running sum of `amount` per user, kept by the task."""

    def prepare(self, context: TaskContext) -> None:
        self.sums: dict[str, float] = {}

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        user = tuple_["user"]
        self.sums[user] = self.sums.get(user, 0.0) + tuple_["amount"]


# -- the cases: each returns what it saw (rows, or words for the word count) -------------------


def count_rows(source: str) -> Callable[[Bench, str, int], int]:
    def run(b: Bench, topic: str, n: int) -> int:
        seen: list[int] = []
        b.drain(b.stream(source, topic), lambda df, _: seen.append(df.count()))
        return sum(seen)

    return run


def on_frames(source: str, body: Callable[[DataFrame], int]) -> Callable[[Bench, str, int], int]:
    """`body` on each micro-batch of a `format(source)` stream."""

    def run(b: Bench, topic: str, n: int) -> int:
        seen: list[int] = []
        b.drain(b.stream(source, topic), lambda df, _: seen.append(body(df)))
        return sum(seen)

    return run


def spout_frames(body: Callable[[DataFrame], int]) -> Callable[[Bench, str, int], int]:
    """`body` on each `KafkaSpout.foreach_batch` frame."""

    def run(b: Bench, topic: str, n: int) -> int:
        seen: list[int] = []
        b.spout(topic, n).foreach_batch(lambda df, _: seen.append(body(df)), until_caught_up=True)
        return sum(seen)

    return run


def spout_chain(chain: Any) -> Callable[[Bench, str, int], int]:
    """`KafkaSpout.run(chain)` until caught up; the offsets acked (`spout_run` checks n)."""

    def run(b: Bench, topic: str, n: int) -> int:
        config = b.setup.config(topic, max(1, n // PARTITIONS))
        return spout_run(config, b.spark, chain, n)[1].total("acked")

    return run


@dataclass(frozen=True)
class Case:
    group: str  # the comparison it belongs to; its baseline is the group's SPARK_KAFKA case
    name: str  # how the user writes it
    run: Callable[[Bench, str, int], int]
    words: bool = False  # sees words, not messages


KAFKA = "kafka"
KSPOUT = "kspout"

CASES = [
    Case("a count", f"{SPARK_KAFKA}, df.count()", count_rows(KAFKA)),
    Case("a count", 'format("kspout"), df.count()', count_rows(KSPOUT)),
    Case("b values", f"{SPARK_KAFKA}, mapInArrow", on_frames(KAFKA, summed)),
    Case("b values", 'format("kspout"), mapInArrow', on_frames(KSPOUT, summed)),
    Case("b values", "KafkaSpout.run(handler)", spout_chain(trivial)),
    Case("b values", "KafkaSpout.foreach_batch, mapInArrow", spout_frames(summed)),
    Case("c JSON sum", f"{SPARK_KAFKA}, from_json + groupBy", on_frames(KAFKA, by_user)),
    Case("c JSON sum", 'format("kspout"), from_json + groupBy', on_frames(KSPOUT, by_user)),
    Case(
        "c JSON sum",
        'KafkaSpout.run, row bolts, Fields("user")',
        spout_chain([ParseOrder(), Fields("user"), SumByUser()]),
    ),
    Case(
        "d word count",
        f"{SPARK_KAFKA}, split + explode + groupBy",
        on_frames(KAFKA, words_of),
        words=True,
    ),
    Case(
        "d word count",
        'format("kspout"), split + explode + groupBy',
        on_frames(KSPOUT, words_of),
        words=True,
    ),
    Case("d word count", 'KafkaSpout.run, row bolts, Fields("word")', spout_chain(word_count())),
    Case(
        "d word count",
        'KafkaSpout.run, columnar bolts, Fields("word")',
        spout_chain(columnar_word_count("note")),
    ),
]


# -- latency -----------------------------------------------------------------------------------

# The directory handlers append their latencies to; set before the session starts, so Spark's
# Python workers inherit it.
LATENCIES = "KSPOUT_BENCH_LATENCIES"


_written: list[TextIO] = []  # this process's latency file, once opened


def note_latencies(timestamps_ms: list[int]) -> None:
    """Append `now - timestamp` (ms) of each record to this process's file (handlers run in
    Spark's Python workers: files are how their figures come back). Line-buffered, so nothing
    is lost when a worker exits."""
    now = time.time() * 1000
    if not _written:
        path = Path(os.environ[LATENCIES]) / f"{os.getpid()}.txt"
        _written.append(path.open("a", buffering=1))
    _written[0].write("".join(f"{ts} {now - ts:.1f}\n" for ts in timestamps_ms))


def latency_handler(record: Record) -> None:
    """kspout's handler: the record's latency."""
    note_latencies([record.timestamp])


def arrow_latencies(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Spark's handler (`mapInArrow` over the timestamp column): the records' latencies."""
    for batch in batches:
        stamps = batch.column(0).cast(pa.int64()).to_pylist()  # microseconds
        note_latencies([ts // 1000 for ts in stamps])
        yield pa.RecordBatch.from_pydict({"n": [len(stamps)]})


def steady_producer(brokers: str, topic: str, stop: threading.Event) -> threading.Thread:
    """A thread producing RATE messages per second to `topic` until `stop` is set."""

    def loop() -> None:
        producer = Producer({"bootstrap.servers": brokers, "linger.ms": 0, "log_level": 0})
        start = time.monotonic()
        i = 0
        while not stop.is_set():
            due = start + i / RATE
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            producer.produce(topic, value_of(i), b"key-%d" % i, partition=i % PARTITIONS)
            producer.poll(0)
            i += 1
        producer.flush(10)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def spark_latency(b: Bench, topic: str, stop: threading.Event) -> None:
    """Spark's Kafka source with its default trigger until `stop`."""
    df = b.stream(KAFKA, topic).select("timestamp").mapInArrow(arrow_latencies, "n long")
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(b.tmp / f"checkpoint-{uuid.uuid4().hex}"))
        .start()
    )
    stop.wait()
    query.stop()


def spout_latency(b: Bench, topic: str, stop: threading.Event) -> None:
    """`KafkaSpout.run(handler)` with kspout's default settings until `stop`."""
    config = b.setup.config(topic, 10_000, start="latest")
    KafkaSpout(config, b.spark).run(latency_handler, stop=stop)


LATENCY_CASES: list[tuple[str, Callable[[Bench, str, threading.Event], None]]] = [
    (f"{SPARK_KAFKA}, default trigger, mapInArrow", spark_latency),
    ("KafkaSpout.run(handler)", spout_latency),
]


@dataclass(frozen=True)
class Latency:
    name: str
    records: int
    p50_ms: float
    p99_ms: float
    max_ms: float


def latency(b: Bench, name: str, reader: Callable[[Bench, str, threading.Event], None]) -> Latency:
    """The reader on a fresh topic fed RATE messages/s; percentiles after LATENCY_SKIP."""
    topic = f"bench-latency-{uuid.uuid4().hex[:6]}"
    create_topic(b.setup.brokers, topic, PARTITIONS)
    out = Path(os.environ[LATENCIES])  # shared by the cases: told apart by produce time
    stop_reading, stop_producing = threading.Event(), threading.Event()
    reading = threading.Thread(target=reader, args=(b, topic, stop_reading), daemon=True)
    reading.start()
    time.sleep(3.0)  # the query or the spout is up before the first message
    began = time.time() * 1000
    producing = steady_producer(b.setup.brokers, topic, stop_producing)
    time.sleep(LATENCY_SECONDS)
    stop_producing.set()
    producing.join()
    ended = time.time() * 1000
    time.sleep(3.0)  # the last messages reach the handler
    stop_reading.set()
    reading.join(timeout=60)
    figures = sorted(
        float(ms)
        for path in out.glob("*.txt")
        for ts, ms in (line.split() for line in path.read_text().splitlines())
        if began + LATENCY_SKIP * 1000 <= int(ts) <= ended
    )
    if not figures:
        raise SystemExit(f"{name}: no latencies were written to {out}")

    def at(q: float) -> float:
        return figures[min(len(figures) - 1, int(q * len(figures)))]

    return Latency(name, len(figures), at(0.50), at(0.99), figures[-1])


# -- the run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    group: str
    name: str
    records: int  # messages read
    seconds: float
    cpu: dict[str, float]  # CPU seconds by GROUPS

    @property
    def rate(self) -> float:
        return self.records / self.seconds

    def cpu_us(self, group: str | None = None) -> float:
        """CPU microseconds per record, of one group or of all."""
        spent = sum(self.cpu.values()) if group is None else self.cpu.get(group, 0.0)
        return spent * 1e6 / self.records


def expected(case: Case, n: int) -> int:
    return sum(1 + i % 4 for i in range(n)) if case.words else n


def measured(b: Bench, case: Case, topic: str, n: int) -> Figure:
    """One timed run of `case` over the n messages of `topic`, checked."""
    seen: list[int] = []

    def timed() -> float:
        t0 = time.perf_counter()
        seen.append(case.run(b, topic, n))
        return time.perf_counter() - t0

    took = sample(timed)
    want = expected(case, n)
    if seen[0] != want:
        raise SystemExit(f"{case.name}: saw {seen[0]:,}, expected {want:,}: the figures are wrong")
    return Figure(case.group, case.name, n, took.seconds, took.cpu)


def measure(b: Bench, topic: str, warm: str, n: int, cases: list[Case]) -> list[Figure]:
    """Every case, warmed up first over the `warm` topic, with a progress line each."""
    figures = []
    for case in cases:
        case.run(b, warm, WARM_N)  # untimed: query start-up, workers, JIT
        figure = measured(b, case, topic, n)
        figures.append(figure)
        print(
            f"  {case.group}: {case.name}: {figure.rate:,.0f} records/s, "
            f"{figure.cpu_us():.1f} CPU us/record",
            flush=True,
        )
    return figures


def report(figures: list[Figure], latencies: list[Latency]) -> None:
    baseline = {f.group: f for f in figures if f.name.startswith(SPARK_KAFKA)}
    rows = []
    for f in figures:
        base = baseline[f.group]
        rows.append(
            [
                f.group,
                f.name,
                f"{f.rate:,.0f}",
                f"{f.cpu_us():.1f}",
                *(f"{f.cpu_us(g):.1f}" for g in SHOWN),
                f"{f.rate / base.rate:.2f}x",
                f"{f.cpu_us() / base.cpu_us():.2f}x",
            ]
        )
    headers = ["case", "how", "records/s", "CPU us/rec", *SHOWN.values()]
    headers += ["rate vs Spark", "CPU vs Spark"]
    print(table(headers, rows, "<<" + ">" * (len(headers) - 2)))
    if not latencies:
        return
    print()
    print(f"Latency, produce to handler, at {RATE:,} messages/s (ms)")
    print(
        table(
            ["how", "records", "p50", "p99", "max"],
            [
                [x.name, f"{x.records:,}", f"{x.p50_ms:.0f}", f"{x.p99_ms:.0f}", f"{x.max_ms:.0f}"]
                for x in latencies
            ],
            "<>>>>",
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=200_000, help="messages (default 200,000)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency cases (e)")
    args = parser.parse_args(argv)
    n = args.messages - args.messages % PARTITIONS
    started = time.perf_counter()
    print(
        f"kspout beside Spark's Kafka source: {n:,} messages over {PARTITIONS} partitions of one "
        f"Apache Kafka broker; Spark {pyspark.__version__} {MASTER}; Python "
        f"{platform.python_version()}, {os.cpu_count()} cores; {load_note()}",
        flush=True,
    )
    with (
        tempfile.TemporaryDirectory(prefix="bench-vs-spark-") as tmp,
        DevStack(Path(tmp) / "stack", components=("kafka", "zookeeper")) as stack,
    ):
        setup = Setup(stack.info.brokers, stack.info.zookeeper)
        run_id = uuid.uuid4().hex[:6]
        topic, warm = f"bench-vs-{run_id}", f"bench-vs-warm-{run_id}"
        for name, count in ((topic, n), (warm, WARM_N)):
            create_topic(setup.brokers, name, PARTITIONS)
            produce(setup.brokers, name, count, "lz4", PARTITIONS)
            wait_all_in(setup.brokers, name, count, PARTITIONS)
        print(f"produced {n:,} messages; cases:", flush=True)
        os.environ[LATENCIES] = str(Path(tmp) / "latency")
        Path(os.environ[LATENCIES]).mkdir()
        spark = session()
        try:
            b = Bench(spark, setup, Path(tmp))
            figures = measure(b, topic, warm, n, CASES)
            latencies = []
            if not args.no_latency:
                for name, reader in LATENCY_CASES:
                    print(f"  e latency: {name}, {LATENCY_SECONDS:.0f} s ...", flush=True)
                    latencies.append(latency(b, name, reader))
        finally:
            spark.stop()
            close_fetchers()
    print()
    if args.json:
        print(
            json.dumps(
                {
                    "messages": n,
                    "spark": pyspark.__version__,
                    "cores": os.cpu_count(),
                    "cases": [
                        {**asdict(f), "records_per_s": f.rate, "cpu_us_per_record": f.cpu_us()}
                        for f in figures
                    ],
                    "latency": [asdict(x) for x in latencies],
                },
                indent=2,
            )
        )
    else:
        report(figures, latencies)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; {load_note()} at the end")
    return 0


if __name__ == "__main__":
    # Run from the imported module, not `__main__`: Spark's workers then import the cases'
    # functions and bolts by name, once per worker, instead of unpickling copies per task.
    from bench.bench_vs_spark import main as imported

    raise SystemExit(imported())

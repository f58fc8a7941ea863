"""The fault matrix: one bad task never costs a healthy message.

On Spark `local[2]` and the embedded stack, each case runs a few hundred messages with unique
ids (4 partitions) through `KafkaSpout.run` while one fault really strikes (tests/chaos/faults.py
injects and counts them):

| case      | fault                                                   | whose fault     |
|-----------|---------------------------------------------------------|-----------------|
| `poison`  | one record SIGKILLs its Python worker, every attempt    | the message's   |
| `hang`    | one record's handler blocks forever                     | the message's   |
| `slow`    | one record sleeps past `message_timeout` once           | the message's   |
| `cleanup` | a bolt's `cleanup()` raises once in the whole run       | infrastructure  |
| `redis`   | the dedup bolt's Redis is down longer than the budget   | infrastructure  |
| `fetch`   | one partition's leader is down longer than the budget   | infrastructure  |

A message's own fault costs that message alone (it ends on the dead-letter topic with its own
reason, or times out alone); an infrastructure fault costs no message anything: nothing is
dead-lettered, skipped or lost, and no attempt is spent (`released` instead of `retried`), however
long the outage (longer than `(max_retries + 1) * message_timeout`, the time in which timeouts
alone would exhaust the budget). Every case ends with ZooKeeper's commit points at the high
watermarks. Each case has a wall-clock limit: a spout that stalls fails fast, with the reason.

The outages (`redis`, `fetch`) begin while the spout runs, after a first part of the messages
is finished, and with work left that the fault must strike (produced once it began, or a paced
backlog the spout is in the middle of); those cases run the spout until the commit points reach
the high watermarks after the fault ended (what `until_caught_up` checks, seen from outside),
and count retries and timeouts from the moment the fault began. The `fetch` case runs on the
shared Apache Kafka cluster of three KRaft nodes (`kafka_cluster`), the broken partition's only
replica on node 2 and the others' on node 1, kills node 2 (SIGKILL) for the outage and then
starts it again. The other cases run `KafkaSpout.run(..., until_caught_up=True)`, on a Spark
session warmed by one small run first (a cold start can outlast `message_timeout`, and must not
be blamed on a fault).

At the end the matrix is printed (run with `pytest -s` to see it).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.devstack import DevStack, KafkaCluster
from kspout.driver import Progress
from kspout.errors import FetchTimeout
from kspout.executor.topology import ChainItem
from kspout.kafka import KafkaMetadata, PartitionFetcher
from kspout.outcomes import describe_error
from kspout.spout import KafkaSpout
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.session import ZkSession
from tests.chaos.faults import (
    CleanupFailsOnce,
    DedupApply,
    FaultyHandler,
    ProbedIdempotencyBolt,
    encode,
    spool_strikes,
)
from tests.integration.helpers import FAST_BACKOFF, PARTITIONS, dead_letter_headers

PER_PARTITION = 100  # messages per partition and case (phase 1 of the outage cases: half)
MAX_RETRIES = 2
MESSAGE_TIMEOUT = 3.0
SLOW_SECONDS = MESSAGE_TIMEOUT + 2.0
# Longer than every attempt of a retry budget spent on timeouts: (max_retries + 1) timeouts.
OUTAGE = (MAX_RETRIES + 2) * MESSAGE_TIMEOUT
LIMIT = 60.0  # wall-clock seconds a case may take to finish after its fault ended
POLL = 0.25


# -- the matrix --------------------------------------------------------------------------------


@dataclass
class Row:
    """What one case saw."""

    fault: str
    struck: int = 0
    dead_lettered: dict[str, str] = field(default_factory=dict)  # id -> kspout.reason
    lost: list[str] = field(default_factory=list)  # neither applied nor dead-lettered
    twice: list[str] = field(default_factory=list)  # effect applied more than once
    at_hwm: bool = False
    seconds: float = 0.0  # the whole run
    recovery: float | None = None  # fault ended -> commit points at the high watermarks
    stats: dict[str, int | None] = field(default_factory=dict)  # totals of the whole run
    during: dict[str, int | None] = field(default_factory=dict)  # since the fault began
    notes: list[str] = field(default_factory=list)

    def cells(self) -> list[str]:
        dead = str(len(self.dead_lettered))
        if 0 < len(self.dead_lettered) <= 2:
            dead += " (" + ", ".join(sorted(set(self.dead_lettered.values()))) + ")"
        recovery = "-" if self.recovery is None else f"{self.recovery:.1f}"
        return [
            self.fault,
            str(self.struck),
            dead,
            str(len(self.lost)),
            str(len(self.twice)),
            "yes" if self.at_hwm else "NO",
            f"{self.seconds:.1f}",
            recovery,
            "; ".join(self.notes),
        ]


MATRIX: dict[str, Row] = {}
HEADER = [
    "fault",
    "struck",
    "dead-lettered",
    "lost",
    "applied twice",
    "commit at HWM",
    "seconds",
    "recovery s",
    "notes",
]
STATS = ("acked", "duplicates", "retried", "timed_out", "released", "dead_lettered", "skipped")


def render(rows: Sequence[Row]) -> str:
    table = [HEADER, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in table]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def _print_matrix() -> Iterator[None]:
    yield
    if MATRIX:
        print("\n\nfault matrix (one bad task never costs a healthy message)\n")
        print(render(list(MATRIX.values())))
        for row in MATRIX.values():
            during = f"; from the fault on: {row.during}" if row.during else ""
            print(f"  {row.fault}: {row.stats}{during}")


# -- producing ---------------------------------------------------------------------------------


@dataclass
class Messages:
    """What was produced: ids by `(partition, offset)` (from the delivery reports) and faults."""

    ids: dict[tuple[int, int], str] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)  # id -> fault, faulty ones only

    def healthy(self) -> set[str]:
        return set(self.ids.values()) - set(self.faults)

    def high(self, partition: int) -> int:
        return 1 + max((o for p, o in self.ids if p == partition), default=-1)


def produce(
    producer: Producer,
    topic: str,
    prefix: str,
    counts: Mapping[int, int],
    messages: Messages,
    faults: Mapping[tuple[int, int], str] | None = None,
    every: str = "none",
) -> None:
    """`counts[p]` messages to partition `p`; the `i`-th one of partition `p` carries the fault
    `faults[(p, i)]` (or `every` one does). Offsets are recorded from the delivery reports."""
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            messages.ids[(msg.partition(), msg.offset())] = msg.key().decode()

    for partition, count in counts.items():
        for i in range(count):
            id_ = f"{prefix}-p{partition}-{i}"
            fault = (faults or {}).get((partition, i), every)
            if fault not in ("none", "pace"):
                messages.faults[id_] = fault
            while True:
                try:
                    producer.produce(
                        topic,
                        encode(id_, fault),
                        id_.encode(),
                        partition=partition,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
            producer.poll(0)
    assert producer.flush(30) == 0 and not failed, f"produce failed: {failed[:3]}"


# -- running the spout -------------------------------------------------------------------------


class SpoutThread:
    """`KafkaSpout.run` in a thread, so the test can watch it, inject faults, and stop it."""

    def __init__(
        self,
        spark: SparkSession,
        config: TopicConfig,
        chain: ChainItem | Sequence[ChainItem],
        *,
        until_caught_up: bool,
    ) -> None:
        self._spark = spark
        self.stop_event = threading.Event()
        self.progress: Progress | None = None  # what run() returned
        self.latest: Progress | None = None  # the driver's last progress report
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.ended: float | None = None

        def main() -> None:
            try:
                self.progress = KafkaSpout(config, spark).run(
                    chain,
                    until_caught_up=until_caught_up,
                    stop=self.stop_event,
                    on_progress=self._report,
                )
            except BaseException as exc:
                self.error = exc
            finally:
                self.ended = time.monotonic()

        self.thread = threading.Thread(target=main, name="fault-matrix-spout", daemon=True)
        self.thread.start()

    def _report(self, progress: Progress) -> None:
        self.latest = progress

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def seconds(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def wait(self, seconds: float) -> bool:
        """True once the run ended by itself within `seconds`."""
        self.thread.join(seconds)
        return not self.alive

    def stop(self) -> bool:
        """Ask the run to stop; if it cannot (a batch stuck on a hung task blocks the final
        drain), cancel Spark's jobs until it ends. True when it stopped without cancelling."""
        self.stop_event.set()
        self.thread.join(10)
        cancelled = False
        deadline = time.monotonic() + 60
        while self.alive and time.monotonic() < deadline:
            cancelled = True
            self._spark.sparkContext.cancelAllJobs()
            self.thread.join(2)
        assert not self.alive, "the spout did not stop even after its Spark jobs were cancelled"
        return not cancelled

    def check(self) -> None:
        """Fail at once when the run died."""
        if self.error is not None:
            raise AssertionError(f"the spout crashed: {describe_error(self.error)}")


class Watch:
    """The commit points in ZooKeeper and the high watermarks in Kafka, seen from outside."""

    def __init__(self, config: TopicConfig) -> None:
        self._session = ZkSession(config)
        self._store = ZkOffsetStore(self._session)
        self._metadata = KafkaMetadata(config)
        self._topic = config.topic

    def __enter__(self) -> Watch:
        self._session.start()
        self._metadata.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._metadata.close()
        self._session.close()

    def commits(self) -> dict[int, int]:
        return {p: s.offset for p, s in self._store.read_all().items()}

    def highs(self, partitions: Sequence[int] = PARTITIONS) -> dict[int, int]:
        return {p: self._metadata.watermarks(self._topic, p)[1] for p in partitions}

    def at_high(self, partitions: Sequence[int] = PARTITIONS) -> bool:
        commits = self.commits()
        return all(commits.get(p) == high for p, high in self.highs(partitions).items())

    def wait_at_high(
        self, run: SpoutThread, seconds: float, partitions: Sequence[int] = PARTITIONS
    ) -> float | None:
        """Seconds until every partition's commit point reached its high watermark, or None
        after `seconds` (or when the run died)."""
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            if self.at_high(partitions):
                return time.monotonic() - start
            if not run.alive:
                return None
            time.sleep(POLL)
        return None


def total(progress: Progress | None, name: str) -> int | None:
    """A Stats total, or None when the run returned none or the counter does not exist."""
    if progress is None:
        return None
    try:
        return progress.total(name)
    except AttributeError:
        return None


def case_config(make_config: Callable[..., TopicConfig], **overrides: Any) -> TopicConfig:
    settings: dict[str, Any] = {
        "batch_size": 100,
        "max_batches_in_flight": 2,
        "max_retries": MAX_RETRIES,
        "message_timeout": MESSAGE_TIMEOUT,
        "retry_backoff": FAST_BACKOFF,
        "commit_interval": 0.2,
        "fetch_timeout": 2.0,
    }
    if "infra_backoff" in TopicConfig.model_fields:  # the circuit breaker's waits
        settings["infra_backoff"] = {"initial": 0.2, "multiplier": 2.0, "max": 1.0}
    settings.update(overrides)
    return make_config(**settings)


def struck_in_redis(client: redis.Redis, topic: str, fault: str) -> int:
    return int(client.hget(f"{topic}:struck", fault) or 0)


def measure(
    row: Row,
    config: TopicConfig,
    messages: Messages,
    client: redis.Redis,
    brokers: str,
    run: SpoutThread,
    baseline: Progress | None = None,
) -> Row:
    """Fill `row` from the dead-letter topic, the effects in Redis, ZooKeeper and Kafka, and
    the run's counts (since `baseline`, the progress when the fault began, in `row.during`)."""
    for headers in dead_letter_headers(config, brokers):
        if headers.get("kspout.source.topic") != config.topic:
            continue
        where = (int(headers["kspout.source.partition"]), int(headers["kspout.source.offset"]))
        row.dead_lettered[messages.ids.get(where, f"?{where}")] = headers["kspout.reason"]
    applied = {
        k.decode() if isinstance(k, bytes) else k: int(v)
        for k, v in client.hgetall(f"{config.topic}:applied").items()
    }
    ids = set(messages.ids.values())
    row.lost = sorted(ids - set(applied) - set(row.dead_lettered))
    row.twice = sorted(i for i, n in applied.items() if n > 1)
    with Watch(config) as watch:
        commits, highs = watch.commits(), watch.highs()
    row.at_hwm = commits == highs
    if not row.at_hwm:
        row.notes.append(f"commits {commits} != highs {highs}")
    row.seconds = run.seconds
    row.stats = {name: total(run.progress, name) for name in STATS}
    if run.progress is not None:
        row.stats["batch_errors"] = run.progress.batch_errors
    if baseline is not None:
        for name in STATS:
            now, then = row.stats[name], total(baseline, name)
            row.during[name] = None if now is None or then is None else now - then
    reasons = Counter(r.split(" (")[0] for r in row.dead_lettered.values())
    if len(row.dead_lettered) > 2:
        row.notes.append(f"dead letters by reason {dict(reasons)}")
    if run.error is not None:
        row.notes.append(f"spout crashed: {describe_error(run.error)[:160]}")
    MATRIX[row.fault] = row
    return row


def report(row: Row) -> None:
    """The case's row, printed as soon as it is known (`pytest -s` shows it)."""
    during = f"\n  from the fault on: {row.during}" if row.during else ""
    print(f"\n{row.fault}: {row.cells()}\n  {row.stats}{during}")


def assert_no_message_paid(row: Row) -> None:
    """The invariants of an infrastructure fault: nothing dead-lettered, skipped or lost, no
    attempt spent (no retry, no timeout) from the fault on, commit points at the high
    watermarks."""
    assert not row.dead_lettered, (
        f"dead-lettered for an outage: {dict(list(row.dead_lettered.items())[:5])}"
    )
    assert not row.lost, f"lost: {row.lost[:10]}"
    assert not row.stats.get("skipped"), f"skipped: {row.stats}"
    assert row.at_hwm, "; ".join(row.notes)
    counts = row.during or row.stats
    assert counts["retried"] == 0, f"attempts spent on the fault: {counts}"
    assert counts["timed_out"] == 0, f"timeouts from the fault: {counts}"


_warmed: list[bool] = []


@pytest.fixture
def warm_spark(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    topic_factory: Callable[[str], str],
) -> SparkSession:
    """The Spark session after one small kspout run (once per session): a cold start (Python
    workers forked, kspout and confluent-kafka imported, the first job) can outlast
    `MESSAGE_TIMEOUT`, and a timeout it caused would be blamed on a case's fault."""
    if not _warmed:
        config = make_config(
            topic=topic_factory("warm-up"),
            spout_id=f"warm-up-{uuid.uuid4().hex[:8]}",
            message_timeout=60.0,
        )
        producer = Producer({"bootstrap.servers": stack.info.brokers})
        produce(producer, config.topic, "warm-up", dict.fromkeys(PARTITIONS, 2), Messages())
        handler = FaultyHandler(config.topic, stack.info.redis_url, SLOW_SECONDS)
        KafkaSpout(config, spark).run(handler, until_caught_up=True)
        _warmed.append(True)
    return spark


# -- the message's own faults: it alone pays -------------------------------------------------------


def run_until_caught_up(
    spark: SparkSession,
    config: TopicConfig,
    chain: ChainItem | Sequence[ChainItem],
    row: Row,
) -> SpoutThread:
    run = SpoutThread(spark, config, chain, until_caught_up=True)
    if not run.wait(LIMIT):
        row.notes.append(f"STALLED: not caught up after {LIMIT:.0f} s, stopped")
        row.notes.append("stopped cleanly" if run.stop() else "stuck Spark jobs cancelled")
    return run


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("fault", "where", "reason"),
    [
        ("poison", (2, 40), "crash"),  # the 41st message of partition 2 kills its worker
        ("hang", (1, 30), "timeout"),  # the 31st message of partition 1 never returns
    ],
)
def test_a_message_that_kills_or_hangs_its_worker_is_dead_lettered_alone(
    fault: str,
    where: tuple[int, int],
    reason: str,
    warm_spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = case_config(make_config)
    messages = Messages()
    counts = dict.fromkeys(PARTITIONS, PER_PARTITION)
    produce(producer, config.topic, fault, counts, messages, {where: fault})
    handler = FaultyHandler(config.topic, stack.info.redis_url, SLOW_SECONDS)
    row = Row(fault)

    run = run_until_caught_up(warm_spark, config, handler, row)

    row.struck = struck_in_redis(redis_client, config.topic, fault)
    measure(row, config, messages, redis_client, stack.info.brokers, run)
    report(row)
    (bad,) = messages.faults
    assert row.struck >= 1, f"the {fault} fault never struck"
    run.check()
    assert not any(n.startswith("STALLED") for n in row.notes), row.notes
    assert set(row.dead_lettered) == {bad}, (
        f"expected only {bad} dead-lettered, got {len(row.dead_lettered)}: "
        f"{dict(list(row.dead_lettered.items())[:5])}"
    )
    assert row.dead_lettered[bad].startswith(reason), row.dead_lettered[bad]
    assert not row.lost, f"lost: {row.lost[:10]}"
    assert row.at_hwm, "; ".join(row.notes)


@pytest.mark.timeout(240)
def test_a_slow_message_times_out_alone(
    warm_spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = case_config(make_config)
    messages = Messages()
    counts = dict.fromkeys(PARTITIONS, PER_PARTITION)
    # The 51st message of partition 3: 49 more wait behind it in its task.
    produce(producer, config.topic, "slow", counts, messages, {(3, 50): "slow"})
    handler = FaultyHandler(config.topic, stack.info.redis_url, SLOW_SECONDS)
    row = Row("slow")

    run = run_until_caught_up(warm_spark, config, handler, row)

    row.struck = struck_in_redis(redis_client, config.topic, "slow")
    measure(row, config, messages, redis_client, stack.info.brokers, run)
    report(row)
    assert row.struck >= 1, "the slow message never ran slow"
    run.check()
    assert not any(n.startswith("STALLED") for n in row.notes), row.notes
    assert row.stats["timed_out"] == 1, f"timed out: {row.stats['timed_out']}, expected 1"
    assert not row.dead_lettered, dict(list(row.dead_lettered.items())[:5])
    assert not row.lost, f"lost: {row.lost[:10]}"
    assert row.at_hwm, "; ".join(row.notes)


# -- infrastructure faults: no message pays --------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_cleanup_that_raises_spends_no_attempt(
    warm_spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = case_config(make_config)
    messages = Messages()
    produce(producer, config.topic, "cleanup", dict.fromkeys(PARTITIONS, PER_PARTITION), messages)
    row = Row("cleanup")

    run = run_until_caught_up(
        warm_spark, config, CleanupFailsOnce(config.topic, stack.info.redis_url), row
    )

    row.struck = struck_in_redis(redis_client, config.topic, "cleanup")
    measure(row, config, messages, redis_client, stack.info.brokers, run)
    report(row)
    assert row.struck == 1, f"cleanup() raised {row.struck} times, expected once"
    run.check()
    assert not any(n.startswith("STALLED") for n in row.notes), row.notes
    assert_no_message_paid(row)
    assert (row.stats["released"] or 0) > 0, f"nothing released: {row.stats}"


@pytest.mark.timeout(240)
def test_redis_down_longer_than_the_retry_budget_costs_no_message(
    warm_spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    config = case_config(
        make_config,
        redis={"url": stack.info.redis_url},
        dedup={"id_source": "key", "lease": 5.0},
        defer_delay=0.5,
    )
    messages = Messages()
    half = dict.fromkeys(PARTITIONS, PER_PARTITION // 2)
    produce(producer, config.topic, "redis-before", half, messages)
    spool = tmp_path / "redis-down.spool"
    bolt = ProbedIdempotencyBolt(DedupApply(config.topic), config, spool)
    row = Row("redis")
    baseline: Progress | None = None

    run = SpoutThread(warm_spark, config, bolt, until_caught_up=False)
    try:
        with Watch(config) as watch:
            assert watch.wait_at_high(run, LIMIT) is not None, "the first half never finished"
            # The outage, with a backlog produced after it began: the fault cannot miss.
            stack.redis.stop()
            baseline = run.latest
            try:
                produce(producer, config.topic, "redis-during", half, messages)
                deadline = time.monotonic() + OUTAGE
                while time.monotonic() < deadline and run.alive:
                    time.sleep(POLL)
            finally:
                stack.redis.start()
            row.recovery = watch.wait_at_high(run, LIMIT)
            if row.recovery is None and run.alive:
                row.notes.append(f"STALLED: not at the high watermarks {LIMIT:.0f} s after")
    finally:
        if run.alive:
            run.stop()

    row.struck = spool_strikes(spool)
    measure(row, config, messages, redis_client, stack.info.brokers, run, baseline)
    report(row)
    assert row.struck >= 1, "no batch ran while Redis was down"
    run.check()
    assert row.recovery is not None, row.notes
    assert_no_message_paid(row)
    assert not row.twice, f"applied more than once: {row.twice[:10]}"


@pytest.mark.timeout(240)
def test_a_partition_that_cannot_be_fetched_holds_back_only_itself(
    warm_spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    redis_client: redis.Redis,
    kafka_cluster: KafkaCluster,
) -> None:
    config = case_config(
        make_config,
        brokers=kafka_cluster.brokers,
        fetch_timeout=1.0,
        kafka={"log_level": 0},  # clients of a down broker log every reconnect: keep quiet
    )
    broken, others = 1, [p for p in PARTITIONS if p != 1]
    # Node 2 holds (and leads) the broken partition alone; node 1 everything else.
    kafka_cluster.create_topic(config.topic, [2 if p == broken else 1 for p in PARTITIONS])
    kafka_cluster.create_topic(config.dlq_topic, [1 for _ in PARTITIONS])
    producer = Producer(
        {"bootstrap.servers": kafka_cluster.brokers, "linger.ms": 5, "log_level": 0}
    )
    messages = Messages()
    produce(producer, config.topic, "fetch-before", dict.fromkeys(PARTITIONS, 25), messages)
    handler = FaultyHandler(config.topic, stack.info.redis_url, SLOW_SECONDS)
    row = Row("fetch")
    baseline: Progress | None = None
    others_done: float | None = None
    held = messages.high(broken)

    run = SpoutThread(warm_spark, config, handler, until_caught_up=False)
    try:
        with Watch(config) as watch:
            assert watch.wait_at_high(run, LIMIT) is not None, "the first messages never finished"
            # Five batches' worth for the partition, each message taking a moment: once the
            # spout is into the first batch, its leader goes down, and at least three batches
            # are still to be fetched.
            produce(producer, config.topic, "fetch-p1", {broken: 500}, messages, every="pace")
            first = f"fetch-p1-p{broken}-0"
            started = time.monotonic()
            while not redis_client.hexists(f"{config.topic}:applied", first):
                assert run.alive and time.monotonic() - started < LIMIT, "the backlog never began"
                time.sleep(0.01)
            kafka_cluster.node(2).kill()
            fault_began = time.monotonic()
            baseline = run.latest
            try:
                produce(
                    producer, config.topic, "fetch-others", dict.fromkeys(others, 100), messages
                )
                others_done = watch.wait_at_high(run, OUTAGE, others)
                if others_done is None:
                    row.notes.append("other partitions NOT at their highs during the fault")
                else:
                    row.notes.append(f"others at highs {others_done:.1f} s into the fault")
                probe = config.model_copy(update={"fetch_timeout": 0.5})
                while True:  # probe at least once, even when the spout is gone
                    row.struck += probe_fetch_fails(probe, broken, watch, redis_client)
                    if time.monotonic() - fault_began >= OUTAGE or not run.alive:
                        break
                    time.sleep(POLL)
                held = watch.commits().get(broken, 0)
                if held >= messages.high(broken):
                    row.notes.append("the spout had fetched the partition before the fault")
            finally:
                kafka_cluster.node(2).start()  # back once it serves (its old session lapses first)
            row.recovery = watch.wait_at_high(run, LIMIT)
            if row.recovery is None and run.alive:
                row.notes.append(f"STALLED: not at the high watermarks {LIMIT:.0f} s after")
    finally:
        if run.alive:
            run.stop()

    measure(row, config, messages, redis_client, kafka_cluster.brokers, run, baseline)
    report(row)
    assert row.struck >= 1, "the partition's fetch never failed"
    run.check()
    assert others_done is not None, "the healthy partitions did not flow during the fault"
    assert held < messages.high(broken), "the fault did not hold the partition back"
    assert row.recovery is not None, row.notes
    assert_no_message_paid(row)


def probe_fetch_fails(
    config: TopicConfig, partition: int, watch: Watch, client: redis.Redis
) -> int:
    """Fetch the partition at its commit point the way executors do; 1 (counted in Redis as a
    strike) when the fetch fails, 0 when it succeeds."""
    offset = watch.commits().get(partition, 0)
    with PartitionFetcher(config) as fetcher:
        try:
            fetcher.fetch(config.topic, partition, [(offset, offset + 1)])
        except FetchTimeout:
            client.hincrby(f"{config.topic}:struck", "fetch", 1)
            return 1
    return 0

"""One driver step with a thousand partitions: idle, and with 20,000 spans each, in one run.

    python -m bench.bench_driver            # 1,000 partitions, 20,000 spans each (~2 min)
    python -m bench.bench_driver --quick    # 1,000 partitions, 2,000 spans each (~30 s)

Starts ZooKeeper from the embedded dev stack and a cluster of three Apache Kafka brokers
(`KafkaCluster`, a topic of 1,000 partitions led by the three in turn), then runs the real `Driver`
(claims in ZooKeeper, batched watermark queries, planning, dead letters, commits) with an
executor that answers every task at once without fetching anything: the driver is what is
measured, not the executor. Two states of the same driver are timed:

* idle: the topic is empty; each step asks Kafka for the watermarks of every partition (they
  are all caught up) and finds nothing to plan;
* spans: every partition holds `spans` records; the executor acked the even offsets and failed
  the odd ones (retried in an hour), so each partition holds `spans` spans (one per offset,
  waiting and done in turn) above its commit point, and each step again finds nothing due.

A step's figure is the median and the slowest of `steps` calls to `Driver.step()`, run as
`kspout run --progress` runs it: a progress snapshot every 0.25 s, and a commit round every
`commit_interval` (1 s; the round takes a snapshot too, shared with the step's). The snapshot
(every partition's counts, watermarks, breaker and commit, for the progress table, the metrics
endpoint and the instance report) is also timed on its own. Two baselines are measured in the
same run:

* the Kafka floor: one batched query of every partition's high mark (one request per broker),
  which an idle step must make to see new records (its ratio says how much the driver's own
  work adds to it);
* one walk over every span of every partition: what each of the four per-step questions
  (`plan`, `expire`, `take_dead_letters`, `stats`) cost before they were answered from
  schedules and counters (its ratio is the speed-up over one of them).

This is a benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import Future

from confluent_kafka import Producer

from bench.bench_executor import load_note
from bench.report import table
from bench.stack import zookeeper_and_kafka_cluster
from kspout.config import TopicConfig
from kspout.contract import ChannelAddress, PartitionTask, TaskResult
from kspout.driver.loop import Driver
from kspout.kafka import KafkaMetadata
from kspout.outcomes import FailReason, Outcome, OutcomeKind

PARTITIONS = 1_000
BROKERS = 3
TARGET_MS = 20.0  # the issue's target for one step
FAIL = "odd offset (the benchmark fails every odd offset once)"


class AnsweringExecutor:
    """An executor that settles each planned offset at once, without fetching it: even
    offsets are acked, odd ones fail (the driver then retries them after the backoff)."""

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        """Answer the whole batch now; the returned future is already done."""
        future: Future[list[TaskResult]] = Future()
        future.set_result([self._answer(task) for task in tasks])
        return future

    @staticmethod
    def _answer(task: PartitionTask) -> TaskResult:
        plan = task.plan
        outcomes = [
            Outcome(o, OutcomeKind.FAIL, span.attempt, FailReason.EXCEPTION, FAIL)
            if o % 2
            else Outcome(o, OutcomeKind.ACK, span.attempt)
            for span in plan.spans
            for o in range(span.start, span.end)
        ]
        return TaskResult(task.topic, task.partition, plan.generation, outcomes)

    def cancel(self, batch: int) -> None:
        """Nothing runs in the background: nothing to cancel."""

    def stop_soon(self) -> None:
        """Nothing runs in the background: nothing to stop."""

    def channel_host(self) -> str | None:
        """No outcome channel: results come back with the future."""
        return None

    def attach(self, address: ChannelAddress) -> None:
        """Never called (no channel)."""

    def close(self, *, cancel: bool = False) -> None:
        """Nothing to release."""


def produce(brokers: str, topic: str, per_partition: int) -> None:
    """`per_partition` one-byte records into every partition, showing progress."""
    producer = Producer(
        {
            "bootstrap.servers": brokers,
            "linger.ms": 50,
            "batch.num.messages": 100_000,
            "batch.size": 10_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 2_000_000,
        }
    )
    started = time.perf_counter()
    for p in range(PARTITIONS):
        for _ in range(per_partition):
            while True:
                try:
                    producer.produce(topic, b"x", partition=p)
                    break
                except BufferError:
                    producer.poll(0.05)
        if p % 100 == 99:
            print(f"  produced {(p + 1) * per_partition:,} records", flush=True)
    producer.flush(300)
    print(f"  in {time.perf_counter() - started:.1f} s", flush=True)


def build_spans(driver: Driver, per_partition: int) -> None:
    """Step until every partition planned all its records and every batch was answered."""
    started = time.perf_counter()
    while True:
        driver.step()
        stats = [view.stats for view in driver.progress().partitions]
        emitted = sum(s.emitted_to for s in stats)
        print(f"  planned and answered {emitted:,} offsets", flush=True)
        if emitted >= PARTITIONS * per_partition:
            break
    waiting = sum(s.waiting for s in stats)
    print(f"  {waiting:,} offsets wait for a retry, in {time.perf_counter() - started:.1f} s")


def time_steps(driver: Driver, steps: int) -> list[float]:
    """Seconds of each of `steps` calls to `driver.step()`."""
    driver.step()  # not timed: the first step after a change may plan or commit
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        driver.step()
        times.append(time.perf_counter() - started)
    return times


def time_watermark_floor(config: TopicConfig, rounds: int) -> float:
    """Seconds of the fastest batched query of every partition's high mark."""
    best = float("inf")
    partitions = list(range(PARTITIONS))
    with KafkaMetadata(config) as metadata:
        lows = {p: low for p, (low, _) in metadata.watermarks_of(config.topic, partitions).items()}
        for _ in range(rounds):
            started = time.perf_counter()
            metadata.watermarks_now(config.topic, partitions, lows)
            best = min(best, time.perf_counter() - started)
    return best


def time_span_walk(driver: Driver) -> tuple[float, int]:
    """Seconds of one walk over every span of every partition, and how many spans there are."""
    managers = driver.partition_managers.values()
    started = time.perf_counter()
    spans = sum(1 for pm in managers for _ in pm.spans())
    return time.perf_counter() - started, spans


def time_snapshot(driver: Driver, rounds: int = 20) -> float:
    """Seconds of the fastest progress snapshot (`Driver.progress()`)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        driver.progress()
        best = min(best, time.perf_counter() - started)
    return best


def summary(name: str, times: list[float], snapshot: float, floor: float, walk: float) -> list[str]:
    """One table row: the step's median and slowest, the snapshot, and the ratios to both
    baselines."""
    median = statistics.median(times)
    return [
        name,
        f"{median * 1000:.1f} ms",
        f"{max(times) * 1000:.1f} ms",
        "PASS" if median * 1000 < TARGET_MS else "MISS",
        f"{snapshot * 1000:.1f} ms",
        f"{floor * 1000:.1f} ms",
        f"{median / floor:.2f}x",
        f"{walk * 1000:.1f} ms" if walk else "-",
        f"{walk / median:.1f}x" if walk else "-",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 spans per partition")
    parser.add_argument("--steps", type=int, default=100, help="steps timed per state")
    args = parser.parse_args(argv)
    per_partition = 2_000 if args.quick else 20_000
    print(
        f"Driver step: {PARTITIONS:,} partitions, {BROKERS} Kafka brokers, idle and with "
        f"{per_partition:,} spans each, {args.steps} steps per state; Python "
        f"{platform.python_version()}, {os.cpu_count()} cores; {load_note()}",
        flush=True,
    )
    snapshots: list[int] = []
    settings = {
        "batch_size": 2_000,
        "max_batches_in_flight": 1,
        "max_retries": 3,
        "message_timeout": 3600,
        "commit_interval": 1,
        "retry_backoff": {"initial": 3600.0, "max": 3600.0},
    }
    with zookeeper_and_kafka_cluster("bench-driver", BROKERS, **settings) as (cluster, config):
        cluster.create_topic(config.topic, [1 + p % BROKERS for p in range(PARTITIONS)])
        with Driver(
            config,
            AnsweringExecutor(),
            on_progress=lambda progress: snapshots.append(len(progress.partitions)),
        ) as driver:
            print("idle: timing steps", flush=True)
            idle = time_steps(driver, args.steps)
            idle_snapshot = time_snapshot(driver)
            idle_floor = time_watermark_floor(config, 5)
            print(f"producing {per_partition:,} records into each partition", flush=True)
            produce(cluster.brokers, config.topic, per_partition)
            print("planning them, acking even offsets and failing odd ones", flush=True)
            build_spans(driver, per_partition)
            print("with spans: timing steps", flush=True)
            busy = time_steps(driver, args.steps)
            busy_snapshot = time_snapshot(driver)
            busy_floor = time_watermark_floor(config, 5)
            walk, spans = time_span_walk(driver)
    assert snapshots and all(n == PARTITIONS for n in snapshots), "a snapshot missed partitions"
    print()
    print(
        table(
            [
                "state",
                "step (median)",
                "slowest",
                f"< {TARGET_MS:.0f} ms",
                "snapshot",
                "high-mark query",
                "step / query",
                "walk every span",
                "walk / step",
            ],
            [
                summary("idle", idle, idle_snapshot, idle_floor, 0.0),
                summary(
                    f"{spans // PARTITIONS:,} spans each", busy, busy_snapshot, busy_floor, walk
                ),
            ],
            "<>>>>>>>>",
        )
    )
    print(f"\n{load_note()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

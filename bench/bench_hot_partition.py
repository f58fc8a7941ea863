"""One hot partition on two workers: `ordering = key` with the partition split by key hash.

    python -m bench.bench_hot_partition            # 100,000 messages (~3 min)
    python -m bench.bench_hot_partition --quick    # 40,000

Starts the embedded dev stack (Apache Kafka's broker, one KRaft node started from its jars, and
ZooKeeper) and a local Spark standalone cluster of two one-core workers from the pyspark wheel.
All messages sit in a topic of one partition (created through the admin API), with distinct
keys. A handler that spends about 20 us of CPU per record (hashing its value) runs until
caught up in three ways, in the same run:

* `ordering = "none"`, two batches in flight: Storm's semantics, the baseline;
* `ordering = "key"`, one task per partition: a record waits for earlier ones of its key, and
  the partition is planned again only when its task is over;
* `ordering = "key"`, `max_tasks_per_partition = 2`: each batch is two Spark tasks, one per
  half of the keys.

Printed per case: messages per second, CPU microseconds per record for the whole process tree,
and the ratio to the baseline. A benchmark, not a test: it exits 0 unless a run acks the wrong
count.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.bench_executor import (
    Setup,
    load_note,
    produce,
    sample,
    spout_run,
    wait_all_in,
)
from bench.bench_scaling import session
from bench.report import table
from kspout.devstack import DevStack, SparkStandalone, create_topic
from kspout.kafka import Record

BATCH_SIZE = 20_000
ROUNDS = 40  # blake2b rounds per record: about 20 us of CPU


def busy(record: Record) -> None:
    """A handler with real per-record work, so the Python worker is what bounds a task."""
    digest = record.value or b""
    for _ in range(ROUNDS):
        digest = hashlib.blake2b(digest, digest_size=16).digest()


CASES: list[tuple[str, dict[str, Any]]] = [
    ('ordering = "none", 2 batches in flight', {"ordering": "none"}),
    ('ordering = "key", 1 task per partition', {"ordering": "key"}),
    (
        'ordering = "key", max_tasks_per_partition = 2',
        {"ordering": "key", "max_tasks_per_partition": 2},
    ),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="40,000 messages")
    args = parser.parse_args(argv)
    n = 40_000 if args.quick else 100_000
    print(
        f"Hot partition: {n:,} messages in one partition; 2 Spark standalone workers of 1 core; "
        f"Python {platform.python_version()}, {os.cpu_count()} cores; {load_note()}"
    )
    rows: list[tuple[str, float, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-hot-") as tmp,
        DevStack(Path(tmp) / "stack", components=("kafka", "zookeeper")) as stack,
        SparkStandalone(Path(tmp) / "spark", cores=1, workers=2) as cluster,
    ):
        setup = Setup(stack.info.brokers, stack.info.zookeeper)
        topic = f"bench-hot-{uuid.uuid4().hex[:6]}"
        create_topic(setup.brokers, topic, partitions=1)
        produce(setup.brokers, topic, n, "lz4", partitions=1)
        wait_all_in(setup.brokers, topic, n, partitions=1)
        spark = session(cluster)
        try:
            spout_run(setup.config(topic, BATCH_SIZE), spark, busy, n)  # workers warm
            for name, extra in CASES:
                config = setup.config(topic, BATCH_SIZE, **extra)
                run = sample(lambda c=config: spout_run(c, spark, busy, n)[0])
                rows.append((name, n / run.seconds, run.total_cpu * 1e6 / n))
                print(f"  {name}: {n / run.seconds:,.0f}/s")
        finally:
            spark.stop()
    baseline, one_task = rows[0][1], rows[1][1]
    print()
    print(
        table(
            ["case", "msgs/s", "CPU us/rec", "vs ordering none", "vs key, 1 task"],
            [
                [
                    name,
                    f"{rate:,.0f}",
                    f"{cpu:.1f}",
                    f"{rate / baseline:.2f}x",
                    f"{rate / one_task:.2f}x",
                ]
                for name, rate, cpu in rows
            ],
            "<>>>>",
        )
    )
    print(f"\n{load_note()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

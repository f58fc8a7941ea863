"""How throughput grows with partitions and executors: kspout on a local Spark standalone
cluster with 1 and then 2 workers, over 1, 2 and 4 partitions holding the data.

    python -m bench.bench_scaling            # 200,000 messages per case (~5 min)
    python -m bench.bench_scaling --quick    # 60,000 (~3 min)

Starts the embedded dev stack (Apache Kafka's broker, one KRaft node started from its jars, and
ZooKeeper), and a standalone cluster from the pyspark wheel (`kspout.devstack.SparkStandalone`)
whose workers offer one core each, so a cluster of k workers runs k Python tasks at once. For
each partition count P it creates a fresh topic of P partitions through the admin API, produces
N messages round-robin into them, then runs `KafkaSpout.run` with a plain handler until caught
up (a fresh spout id, so from offset 0; exactly N acked, or the case is an error). A partition
is one Spark task per batch, so P bounds the parallelism as much as the executors do.

Printed per case: messages per second, CPU microseconds per record over the whole process tree
(driver, Kafka broker, ZooKeeper, Spark's JVMs and Python workers) and the broker's JVM's share
of it, the ratio to the same partitions on one worker; beside them the bare confluent-kafka
loop over the same topic, in the same run, and the ratio to it. This is a benchmark, not a
test: it always exits 0 unless a run acks the wrong count.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import uuid
from functools import partial
from pathlib import Path

from pyspark.sql import SparkSession

from bench.bench_executor import (
    Setup,
    bare_values,
    load_note,
    produce,
    sample,
    spout_run,
    trivial,
    wait_all_in,
)
from bench.report import table
from kspout.config import TopicConfig
from kspout.devstack import DevStack, SparkStandalone, create_topic

PARTITION_COUNTS = (1, 2, 4)
WORKER_COUNTS = (1, 2)
BATCH_SIZE = 50_000  # offsets per partition per batch: a few batches per case
REPO = Path(__file__).resolve().parents[1]


def seconds_of_run(config: TopicConfig, spark: SparkSession, n: int) -> float:
    """Seconds `KafkaSpout.run` takes to ack the `n` messages of `config`'s topic."""
    return spout_run(config, spark, trivial, n)[0]


def session(cluster: SparkStandalone) -> SparkSession:
    """A SparkSession on `cluster` (the Python workers run this interpreter: PySpark ships
    PYSPARK_PYTHON with every Python function, and falls back to `python3` from PATH)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("bench-scaling")
    for key, value in cluster.session_conf().items():
        builder = builder.config(key, value)
    # The handler lives in `bench`: executors started by the worker must find it too.
    builder = builder.config("spark.executorEnv.PYTHONPATH", str(REPO))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="60,000 messages per case")
    args = parser.parse_args(argv)
    most = 60_000 if args.quick else 200_000
    counts = dict.fromkeys(PARTITION_COUNTS, most)
    print(
        f"Scaling: {most:,} messages per case (lz4), one Apache Kafka broker; Spark standalone "
        f"workers of 1 core each; Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"{load_note()}"
    )
    rows: dict[tuple[int, int], tuple[float, float, float]] = {}
    bare: dict[int, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp,
        DevStack(Path(tmp) / "stack", components=("kafka", "zookeeper")) as stack,
    ):
        setup = Setup(stack.info.brokers, stack.info.zookeeper)
        topics = {}
        for p in PARTITION_COUNTS:
            topics[p] = f"bench-scale-{p}-{uuid.uuid4().hex[:6]}"
            n = counts[p]
            create_topic(setup.brokers, topics[p], partitions=p)
            produce(setup.brokers, topics[p], n, "lz4", partitions=p)
            wait_all_in(setup.brokers, topics[p], n, partitions=p)
            seconds = [bare_values(setup.brokers, topics[p], n, partitions=p) for _ in range(2)]
            bare[p] = n / min(seconds)
        for workers in WORKER_COUNTS:
            cluster = SparkStandalone(Path(tmp) / f"spark-{workers}", cores=1, workers=workers)
            with cluster:
                spark = session(cluster)
                try:
                    warm = setup.config(topics[1], BATCH_SIZE)
                    spout_run(warm, spark, trivial, counts[1])  # workers started, JIT warm
                    for p in PARTITION_COUNTS:
                        n = counts[p]
                        config = setup.config(topics[p], BATCH_SIZE)
                        run = sample(partial(seconds_of_run, config, spark, n))
                        broker = run.cpu.get("broker", math.nan)
                        rows[(workers, p)] = (
                            n / run.seconds,
                            run.total_cpu * 1e6 / n,
                            broker * 1e6 / n,
                        )
                        print(f"  {workers} worker(s), {p} partition(s): {n / run.seconds:,.0f}/s")
                finally:
                    spark.stop()
    print()
    print(
        table(
            [
                "partitions",
                "messages",
                "workers",
                "msgs/s",
                "CPU us/rec",
                "broker us/rec",
                "vs 1 worker",
                "bare loop msgs/s",
                "vs bare loop",
            ],
            [
                [
                    str(p),
                    f"{counts[p]:,}",
                    str(w),
                    f"{rows[(w, p)][0]:,.0f}",
                    f"{rows[(w, p)][1]:.1f}",
                    f"{rows[(w, p)][2]:.1f}",
                    f"{rows[(w, p)][0] / rows[(1, p)][0]:.2f}x",
                    f"{bare[p]:,.0f}",
                    f"{rows[(w, p)][0] / bare[p]:.2f}",
                ]
                for p in PARTITION_COUNTS
                for w in WORKER_COUNTS
            ],
            ">>>>>>>>>",
        )
    )
    print(f"\n{load_note()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

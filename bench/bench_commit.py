"""The driver's per-partition I/O, batched, beside the one-partition-at-a-time way, in one run.

    python -m bench.bench_commit            # 1,000 partitions, best of 5 rounds (~30 s)
    python -m bench.bench_commit --quick    # 1,000 partitions, best of 2 rounds (~15 s)

Starts ZooKeeper from the embedded dev stack, and librdkafka's mock cluster (three brokers) in
its own process through `tests.chaos.faults.MockCluster`: the dev stack's mock can only
auto-create topics of 4 partitions (the mock has no CreateTopics), while `MockCluster` reaches
the mock's API and makes a topic of 1,000 partitions, led by the three brokers in turn. Then,
for those 1,000 partitions, it times:

* the watermark query: `KafkaMetadata.watermarks_of` (one batched query: two ListOffsets
  requests per broker) against the loop the driver, `kspout status` and the streaming planner
  used before, `KafkaMetadata.watermarks` once per partition (a round trip each);
* a commit of every partition: `ZkOffsetStore.commit_all` (each partition's fenced
  compare-and-set transaction, all sent before any answer is awaited) against `commit` once per
  partition, each waiting for its answer. Both write the same records: storm-kafka's JSON with
  kspout's fields (finished runs, emitted, history), fenced by a claim on every partition.

Each figure is the best of the rounds, after one round not timed. Both servers run on
loopback, where a round trip costs far less than on a network: there the ratios grow. This is
a benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from bench.bench_executor import load_note
from bench.report import table
from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack
from kspout.kafka import KafkaMetadata
from kspout.offsets import OffsetWrite, ZkOffsetStore, encode_done
from kspout.ownership.tree import SpoutTree
from tests.chaos.faults import MockCluster

PARTITIONS = 1_000
BROKERS = 3
ZK_ROOT = "/bench-commit"


def best(rounds: int, run: Callable[[int], object]) -> float:
    """Seconds of the fastest of `rounds` calls `run(round)`, after one call not timed."""
    run(0)
    times = []
    for number in range(1, rounds + 1):
        started = time.perf_counter()
        run(number)
        times.append(time.perf_counter() - started)
    return min(times)


def make_topic(cluster: MockCluster, topic: str) -> None:
    """`PARTITIONS` partitions led by the brokers in turn, each holding a few messages."""
    cluster.create_topic(topic, [1 + p % BROKERS for p in range(PARTITIONS)])
    producer = Producer({"bootstrap.servers": cluster.brokers, "linger.ms": 5})
    for p in range(PARTITIONS):
        for _ in range(p % 5):
            producer.produce(topic, b"x", partition=p)
    producer.flush(30)


def time_watermarks(config: TopicConfig, rounds: int) -> tuple[float, float]:
    """Seconds for the watermarks of every partition: one at a time, batched."""
    topic, partitions = config.topic, range(PARTITIONS)
    with KafkaMetadata(config) as metadata:
        one_by_one = {p: metadata.watermarks(topic, p) for p in partitions}
        assert metadata.watermarks_of(topic, partitions) == one_by_one, "the answers differ"
        loop = best(rounds, lambda _: [metadata.watermarks(topic, p) for p in partitions])
        batched = best(rounds, lambda _: metadata.watermarks_of(topic, partitions))
    return loop, batched


class Records:
    """Every partition claimed by one store, and the next write of each (its version kept)."""

    def __init__(self, store: ZkOffsetStore) -> None:
        self.store = store
        tree = SpoutTree(store.path)
        self.fences = {p: tree.claim(p) for p in range(PARTITIONS)}
        self.versions: dict[int, int] = {}
        for p, fence in self.fences.items():
            claimed = store.claim(p, fence, b'{"instance": "bench"}', lambda: 0)
            assert claimed is not None
            self.versions[p] = claimed.version

    def write(self, p: int, offset: int) -> OffsetWrite:
        """The driver's commit of partition `p` at `offset`: a few finished runs above it."""
        spans = [(offset + 10 * i + 2, offset + 10 * i + 7) for i in range(8)]
        extra = {**encode_done(offset, spans, None), "emitted": offset + 100, "advanced_at": 1}
        return OffsetWrite(
            p, offset, self.versions[p], ("kafka-1", 9092), extra, fence=self.fences[p]
        )

    def one_by_one(self, offset: int) -> None:
        """Commit every partition at `offset`, each waiting for its answer."""
        for p in range(PARTITIONS):
            w = self.write(p, offset)
            self.versions[p] = self.store.commit(
                p, w.offset, version=w.version, broker=w.broker, extra=w.extra, fence=w.fence
            )

    def batched(self, offset: int) -> None:
        """Commit every partition at `offset` in one `commit_all`."""
        outcomes = self.store.commit_all([self.write(p, offset) for p in range(PARTITIONS)])
        for p, outcome in outcomes.items():
            assert isinstance(outcome, int), outcome
            self.versions[p] = outcome


def time_commits(config: TopicConfig, rounds: int) -> tuple[float, float]:
    """Seconds for a commit of every partition: one at a time, batched."""
    with ZkOffsetStore(config) as store:
        records = Records(store)
        loop = best(rounds, lambda n: records.one_by_one(1000 * n))
        batched = best(rounds, lambda n: records.batched(1000 * n + 500))
    return loop, batched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="best of 2 rounds instead of 5")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 5
    print(
        f"Batched driver I/O: {PARTITIONS:,} partitions, {BROKERS} mock brokers, best of "
        f"{rounds} rounds; Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"{load_note()}"
    )
    cluster = MockCluster(brokers=BROKERS)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-commit-") as tmp,
            DevStack(Path(tmp) / "stack", components=("zookeeper",)) as stack,
        ):
            config = parse_config(
                {
                    "topic": f"bench-commit-{uuid.uuid4().hex[:8]}",
                    "spout_id": f"bench-{uuid.uuid4().hex[:10]}",
                    "zk_root": ZK_ROOT,
                    "brokers": cluster.brokers,
                    "zookeeper": stack.info.zookeeper,
                }
            )
            make_topic(cluster, config.topic)
            figures = {
                "watermark query": time_watermarks(config, rounds),
                "commit (fenced, per partition)": time_commits(config, rounds),
            }
    finally:
        cluster.close()
    print()
    print(
        table(
            [f"{PARTITIONS:,} partitions", "one at a time", "batched", "ratio"],
            [
                [
                    name,
                    f"{loop * 1000:.1f} ms",
                    f"{batched * 1000:.1f} ms",
                    f"{loop / batched:.1f}x",
                ]
                for name, (loop, batched) in figures.items()
            ],
            "<>>>",
        )
    )
    print(f"\n{load_note()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

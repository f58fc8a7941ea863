"""The driver's per-partition I/O, batched, beside the one-partition-at-a-time way, in one run.

    python -m bench.bench_commit            # 1,000 partitions, best of 5 rounds (~40 s)
    python -m bench.bench_commit --quick    # 1,000 partitions, best of 2 rounds (~20 s)

Starts ZooKeeper from the embedded dev stack, and a cluster of three Apache Kafka brokers
(`KafkaCluster`) with a topic of 1,000 partitions led by the three brokers in turn. Then,
for those 1,000 partitions, it times:

* the watermark query: `KafkaMetadata.watermarks_of` (one batched query: two ListOffsets
  requests per broker) against the loop the driver, `kspout status` and the streaming planner
  used before, `KafkaMetadata.watermarks` once per partition (a round trip each);
* a commit of every partition, three ways: `commit` once per partition, each waiting for its
  answer; `ZkOffsetStore.commit_all` with `bundle_writes=1` (each partition's fenced
  compare-and-set transaction, all sent before any answer is awaited); and `commit_all` as the
  driver calls it (bundles of up to 100 partitions in one transaction each, pipelined). All
  write the same records: storm-kafka's JSON with kspout's fields (finished runs, emitted,
  history), fenced by a claim on every partition;
* a read of every record (what `kspout status`, `lag` and `offsets show` do): the listing then
  `read` once per partition, against `read_all` (every read sent before any answer is awaited).

Each figure is the best of the rounds, after one round not timed, with its speed-up over the
one-at-a-time way of the same run. Both servers run on loopback, where a round trip costs far
less than on a network: there the ratios grow. This is a benchmark, not a test: it always
exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

from confluent_kafka import Producer

from bench.bench_executor import load_note
from bench.report import table
from bench.stack import zookeeper_and_kafka_cluster
from kspout.config import TopicConfig
from kspout.devstack import KafkaCluster
from kspout.kafka import KafkaMetadata
from kspout.ownership.tree import SpoutTree
from kspout.zk.claims import claim_partition
from kspout.zk.offsets import BUNDLE_WRITES, OffsetWrite, ZkOffsetStore
from kspout.zk.record import StoredOffset, encode_done
from kspout.zk.session import ZkSession

PARTITIONS = 1_000
BROKERS = 3


def best(rounds: int, run: Callable[[int], object]) -> float:
    """Seconds of the fastest of `rounds` calls `run(round)`, after one call not timed."""
    run(0)
    times = []
    for number in range(1, rounds + 1):
        started = time.perf_counter()
        run(number)
        times.append(time.perf_counter() - started)
    return min(times)


def make_topic(cluster: KafkaCluster, topic: str) -> None:
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
            claimed = claim_partition(store, p, fence, b'{"instance": "bench"}', lambda: 0)
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

    def batched(self, offset: int, bundle_writes: int = BUNDLE_WRITES) -> None:
        """Commit every partition at `offset` in one `commit_all`."""
        writes = [self.write(p, offset) for p in range(PARTITIONS)]
        outcomes = self.store.commit_all(writes, bundle_writes=bundle_writes)
        for p, outcome in outcomes.items():
            assert isinstance(outcome, int), outcome
            self.versions[p] = outcome

    def read_one_by_one(self) -> dict[int, StoredOffset]:
        """Every record as `read_all` read them before: the listing, then one read each."""
        found = (self.store.read(int(name[len("partition_") :])) for name in self.listing())
        return {s.partition: s for s in found if s is not None}

    def listing(self) -> list[str]:
        """The record nodes under the spout path."""
        return [
            n for n in self.store.session.children_of(self.store.path) if n.startswith("partition_")
        ]


def time_zookeeper(config: TopicConfig, rounds: int) -> dict[str, float]:
    """Seconds for a commit of every partition, and a read of every record, each way."""
    with ZkSession(config) as session:
        store = ZkOffsetStore(session)
        records = Records(store)
        figures = {
            "commit: one at a time": best(rounds, lambda n: records.one_by_one(3000 * n)),
            "commit: pipelined, a transaction per partition": best(
                rounds, lambda n: records.batched(3000 * n + 1000, bundle_writes=1)
            ),
            f"commit: pipelined, {BUNDLE_WRITES} partitions per transaction": best(
                rounds, lambda n: records.batched(3000 * n + 2000)
            ),
        }
        assert records.read_one_by_one() == store.read_all(), "the reads differ"
        figures["read records: one at a time"] = best(rounds, lambda _: records.read_one_by_one())
        figures["read records: pipelined (read_all)"] = best(rounds, lambda _: store.read_all())
    return figures


def report(figures: dict[str, float]) -> str:
    """The table: each figure, and its speed-up over the one-at-a-time way of its kind."""
    rows = []
    for name, seconds in figures.items():
        baseline = figures[name.split(":")[0] + ": one at a time"]
        rows.append([name, f"{seconds * 1000:.1f} ms", f"{baseline / seconds:.1f}x"])
    return table([f"{PARTITIONS:,} partitions", "time", "vs one at a time"], rows, "<>>")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="best of 2 rounds instead of 5")
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 5
    print(
        f"Batched driver I/O: {PARTITIONS:,} partitions, {BROKERS} Kafka brokers, best of "
        f"{rounds} rounds; Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"{load_note()}"
    )
    with zookeeper_and_kafka_cluster("bench-commit", BROKERS) as (cluster, config):
        make_topic(cluster, config.topic)
        loop, batched = time_watermarks(config, rounds)
        figures = {"watermarks: one at a time": loop, "watermarks: batched": batched}
        figures.update(time_zookeeper(config, rounds))
    print()
    print(report(figures))
    print(f"\n{load_note()} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

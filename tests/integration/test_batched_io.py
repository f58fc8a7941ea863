"""The driver's per-partition costs, batched: watermarks of many partitions in one query, a
commit round's records in bundled transactions, pipelined (each partition fenced on its own),
records read pipelined, and the instance report written only when it changed or as a
heartbeat. Real processes: Apache Kafka (the stack's broker, or the shared cluster of three
KRaft nodes, `kafka_cluster`, for a topic whose partitions are placed on chosen nodes, one of
which is then killed) and the stack's ZooKeeper.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from kazoo.client import KazooClient

from kspout.config import TopicConfig
from kspout.devstack import KafkaCluster
from kspout.driver import Driver
from kspout.driver.watermarks import MAX_AGE, WatermarkCache
from kspout.errors import KafkaRequestFailed, OffsetConflict
from kspout.executor.local import LocalExecutor
from kspout.kafka import KafkaMetadata, Record
from kspout.kafka.metadata import Bounds
from kspout.ownership.tree import SpoutTree
from kspout.zk.claims import claim_partition
from kspout.zk.offsets import BUNDLE_BYTES, OffsetWrite, ZkOffsetStore
from tests.chaos.faults import wait_led
from tests.integration.helpers import PARTITIONS, highs, open_store, produce, register, stored

MANY = 40  # partitions of the `many` topic, on nodes 1 and 2 of `kafka_cluster` in turn


def handled(_record: Record) -> None:
    """A handler that acks everything."""


class CountingConsumer:
    """Passes every call on to a confluent-kafka consumer, counting them by method name."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.consumer, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)

        return counted


@pytest.fixture
def many(kafka_cluster: KafkaCluster, make_config: Callable[..., TopicConfig]) -> TopicConfig:
    """A topic of `MANY` unreplicated partitions on `kafka_cluster`, partition p on node 1 + p % 2
    (its leader) and holding p % 7 messages."""
    config = make_config(brokers=kafka_cluster.brokers, kafka={"log_level": 0})
    kafka_cluster.create_topic(config.topic, [1 + p % 2 for p in range(MANY)])
    producer = Producer({"bootstrap.servers": kafka_cluster.brokers, "log_level": 0})
    produce(producer, config.topic, {p: range(p % 7) for p in range(MANY)})
    return config


def test_watermarks_of_many_partitions_are_one_query_and_match_each_partitions_own(
    many: TopicConfig,
) -> None:
    partitions = list(range(MANY))
    with KafkaMetadata(many) as metadata:
        one_by_one = {p: metadata.watermarks(many.topic, p) for p in partitions}
        counting = CountingConsumer(metadata._client())
        metadata._consumer = counting  # type: ignore[assignment]
        batched = metadata.watermarks_of(many.topic, partitions)
        calls = dict(counting.calls)
    assert batched == one_by_one == {p: (0, p % 7) for p in partitions}
    # Two requests (the earliest offsets, then the latest), whatever the number of partitions;
    # `poll(0)` only serves the client's queue (a refused login's callback), asking nothing.
    calls.pop("poll", None)
    assert calls == {"offsets_for_times": 2}


def test_caught_up_partitions_are_asked_their_high_only_until_their_low_is_old(
    many: TopicConfig, kafka_cluster: KafkaCluster
) -> None:
    """A caught-up partition is asked every step; its low mark, which moves only when
    retention deletes records, is asked again once it is `MAX_AGE` old: one request per broker
    instead of two on the steps between."""
    partitions = list(range(MANY))
    now = [100.0]
    with KafkaMetadata(many) as metadata:
        counting = CountingConsumer(metadata._client())
        metadata._consumer = counting  # type: ignore[assignment]
        cache = WatermarkCache(metadata, many.topic, lambda: now[0])
        caught_up = {p: p % 7 for p in partitions}  # every partition planned to its high
        assert cache.refresh(caught_up) == {}
        assert counting.calls["offsets_for_times"] == 2, "the first query asks both ends"
        producer = Producer({"bootstrap.servers": kafka_cluster.brokers, "log_level": 0})
        produce(producer, many.topic, {3: range(5)})
        now[0] += MAX_AGE / 2
        assert cache.refresh(caught_up) == {}
        assert counting.calls["offsets_for_times"] == 3, "a young low: the high only"
        assert cache.known(3) == (0, 3 + 5), "the new records are seen"
        assert all(cache.known(p) == (0, p % 7) for p in partitions if p != 3)
        now[0] += MAX_AGE
        assert cache.refresh({p: cache.known(p)[1] for p in partitions}) == {}
        assert counting.calls["offsets_for_times"] == 5, "an old low: both ends again"
        # With the lows given, the batched query asks only the partitions' highs.
        lows = {p: 0 for p in partitions}
        found, failed = metadata.watermarks_now(many.topic, partitions, lows)
    assert failed == {} and found == {p: cache.known(p) for p in partitions}
    assert counting.calls["offsets_for_times"] == 6


def test_a_broker_down_holds_back_only_the_partitions_it_leads(
    many: TopicConfig, kafka_cluster: KafkaCluster
) -> None:
    """Node 2 killed: first while the metadata still names it the leader of its partitions
    (until its session lapses), then once the controller has left them without one."""
    partitions = list(range(MANY))
    led_by_2 = {p for p in partitions if p % 2 == 1}
    healthy = {p: (0, p % 7) for p in partitions if p not in led_by_2}
    seen: list[tuple[Bounds, dict[int, KafkaRequestFailed]]] = []
    with KafkaMetadata(many) as metadata:
        metadata.watermarks_of(many.topic, partitions)  # connected to both brokers
        kafka_cluster.node(2).kill()
        try:
            seen.append(metadata.watermarks_now(many.topic, partitions))
            deadline = time.monotonic() + 30
            while any(metadata.leaders(many.topic)[p] != ("", -1) for p in led_by_2):
                assert time.monotonic() < deadline, "node 2's partitions kept their leader"
                time.sleep(0.2)
            seen.append(metadata.watermarks_now(many.topic, partitions))
        finally:
            kafka_cluster.node(2).start()
            wait_led(kafka_cluster.brokers, many.topic)
        assert metadata.watermarks_of(many.topic, partitions) == {
            p: (0, p % 7) for p in partitions
        }, "node 2 back: every partition answers again"
    for found, failed in seen:
        assert found == healthy
        assert set(failed) == led_by_2
        assert all(isinstance(exc, KafkaRequestFailed) for exc in failed.values())


def test_a_partition_kafka_does_not_have_fails_the_query_and_is_named(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(3)})
    with KafkaMetadata(config) as metadata, pytest.raises(KafkaRequestFailed) as failed:
        metadata.watermarks_of(config.topic, [0, 1, 9])
    assert "watermark query failed" in str(failed.value)
    assert "partition 9" in str(failed.value) and "check that the topic and partition exist" in (
        str(failed.value)
    )


def test_a_commit_round_refuses_only_the_partition_whose_claim_was_taken(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    # Commits only when asked: the one below writes all four partitions in one round.
    config = make_config(commit_interval=300.0)
    produce(producer, config.topic, {p: range(10) for p in PARTITIONS})
    with (
        Driver(config, LocalExecutor(config, handled)) as driver,
        open_store(config, instance_id="another") as another,
    ):
        driver.run(until_caught_up=True)
        assert stored(config) == dict.fromkeys(PARTITIONS, 10)
        # The driver's claim on partition 2 is gone (as after a session expiry), and another
        # instance claims it: a new claim node, and the record rewritten (a new version).
        claim = SpoutTree(config.zk_spout_path).claim(2)
        zk.delete(claim)
        assert claim_partition(another, 2, claim, b'{"instance": "another"}', lambda: 0) is not None
        produce(producer, config.topic, {p: range(10, 15) for p in PARTITIONS})
        # One batch for the four partitions, then one commit round.
        driver.run(max_batches=driver.progress().batches + 1)
        progress = driver.progress()
    assert (progress.commits_refused, progress.partitions_dropped) == (1, 1)
    assert {v.partition for v in progress.partitions} == {0, 1, 3}
    assert stored(config) == {0: 15, 1: 15, 2: 10, 3: 15}
    assert highs(config)[2] == 15


def test_the_instance_report_is_written_when_it_changed_or_as_a_heartbeat(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    config = make_config(commit_interval=300.0)
    skew = 0.0  # seconds the driver's clock is ahead of the monotonic one

    def clock() -> float:
        return time.monotonic() + skew

    produce(producer, config.topic, {p: range(5) for p in PARTITIONS})
    with Driver(config, LocalExecutor(config, handled), clock=clock) as driver:
        driver.run(until_caught_up=True)  # its last commit writes the report
        node = f"{config.zk_spout_path}/instances/{driver.progress().instance}"

        def writes() -> int:
            stat = zk.exists(node)
            assert stat is not None
            return int(stat.version)

        written = writes()
        driver.commit()
        assert writes() == written, "nothing changed: the report stays as it was"
        produce(producer, config.topic, {1: range(5, 9)})
        driver.run(until_caught_up=True)
        assert writes() == written + 1, "new counts: written at the next commit"
        driver.commit()
        assert writes() == written + 1
        skew += 2 * config.commit_interval  # REPORT_EVERY intervals on: a heartbeat is due
        driver.commit()
        assert writes() == written + 2


def claim_all(store: ZkOffsetStore, count: int) -> tuple[dict[int, str], dict[int, int]]:
    """Partitions 0 to `count` - 1 claimed by `store`: their claim nodes and record versions."""
    tree = SpoutTree(store.path)
    fences = {p: tree.claim(p) for p in range(count)}
    versions = {}
    for p, fence in fences.items():
        claimed = claim_partition(store, p, fence, b'{"instance": "mine"}', lambda: 0)
        assert claimed is not None
        versions[p] = claimed.version
    return fences, versions


def spy_transactions(monkeypatch: pytest.MonkeyPatch, store: ZkOffsetStore) -> list[Any]:
    """The transactions `store` makes from now on (kazoo's, with their `operations`)."""
    made: list[Any] = []
    real = store.session.client.transaction

    def transaction() -> Any:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(store.session.client, "transaction", transaction)
    return made


def test_a_bundled_commit_refuses_only_the_partition_whose_claim_was_taken(
    make_config: Callable[..., TopicConfig], zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    with (
        open_store(config, instance_id="mine") as store,
        open_store(config, instance_id="another") as another,
    ):
        fences, versions = claim_all(store, 10)
        # Partition 3's claim is gone (as after a session expiry) and another instance holds it.
        zk.delete(fences[3])
        theirs = b'{"instance": "another"}'
        assert claim_partition(another, 3, fences[3], theirs, lambda: 0) is not None
        made = spy_transactions(monkeypatch, store)
        writes = [OffsetWrite(p, 100 + p, versions[p], fence=fences[p]) for p in range(10)]
        outcomes = store.commit_all(writes, bundle_writes=5)
        records = store.read_all()
    assert isinstance(outcomes.pop(3), OffsetConflict)
    assert outcomes == {p: versions[p] + 1 for p in range(10) if p != 3}
    assert {p: r.offset for p, r in records.items()} == {
        p: 0 if p == 3 else 100 + p for p in range(10)
    }
    # Two bundles of five (a claim check and a write each); the refused one, which held
    # partition 3, sent again one partition per transaction.
    assert [len(t.operations) for t in made] == [10, 10] + [2] * 5


def test_a_commit_larger_than_a_bundles_bytes_is_split_and_every_record_lands(
    make_config: Callable[..., TopicConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    # 60 records of 20 KB: 1.2 MB, over ZooKeeper's 1 MB request limit (in one transaction,
    # the server would drop the connection and the commit would never get through).
    pad = {"pad": "x" * 20_000}
    with open_store(make_config(), retry_timeout=5.0) as store:
        fences, versions = claim_all(store, 60)
        made = spy_transactions(monkeypatch, store)
        writes = [OffsetWrite(p, 7, versions[p], extra=pad, fence=fences[p]) for p in range(60)]
        outcomes = store.commit_all(writes)
        records = store.read_all()
    assert outcomes == {p: versions[p] + 1 for p in range(60)}
    assert {p: r.offset for p, r in records.items()} == dict.fromkeys(range(60), 7)
    sizes = [sum(len(getattr(op, "data", b"")) for op in t.operations) for t in made]
    assert len(made) == 3 and all(size <= BUNDLE_BYTES for size in sizes), sizes


def test_read_all_sends_every_read_first_and_equals_each_records_own_read(
    make_config: Callable[..., TopicConfig], zk: KazooClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(make_config()) as store:
        for p in range(0, 60, 2):  # some partitions have no record
            store.commit(p, 10 * p, version=None, extra={"emitted": 10 * p + 3})
        register(store)  # a child of the spout path that is not a record
        events: list[str] = []
        real_get_async = store.session.client.get_async

        class Answer:
            """A kazoo async result that notes when it is awaited."""

            def __init__(self, result: Any) -> None:
                self.result = result

            def get(self, *args: Any, **kwargs: Any) -> Any:
                events.append("wait")
                return self.result.get(*args, **kwargs)

        def get_async(path: str, *args: Any) -> Answer:
            events.append("send")
            return Answer(real_get_async(path, *args))

        monkeypatch.setattr(store.session.client, "get_async", get_async)
        every = store.read_all()
        assert events == ["send"] * 30 + ["wait"] * 30, "one round trip for all the records"
        some = store.read_many([1, 2, 3, 4])
        one_by_one = {}
        for p in range(60):
            path = store.partition_path(p)
            if zk.exists(path):
                raw, stat = zk.get(path)
                one_by_one[p] = store.decode(p, path, raw, stat.version)
    assert every == one_by_one and list(every) == sorted(every)
    assert some == {2: one_by_one[2], 4: one_by_one[4]}

"""The driver's per-partition costs, batched: watermarks of many partitions in one query, a
commit round's records pipelined (each fenced on its own), and the instance report written
only when it changed or as a heartbeat. Real processes: librdkafka's mock cluster (the
stack's, or a `MockCluster` for many partitions over two brokers) and the stack's ZooKeeper.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from kazoo.client import KazooClient

from kspout.config import TopicConfig
from kspout.driver import Driver
from kspout.errors import KafkaRequestFailed
from kspout.kafka import KafkaMetadata, Record
from kspout.local_executor import LocalExecutor
from kspout.offsets import ZkOffsetStore
from kspout.ownership.tree import SpoutTree
from tests.chaos.faults import MockCluster
from tests.integration.helpers import PARTITIONS, highs, produce, stored

MANY = 40  # partitions of the MockCluster topic, led by brokers 1 and 2 in turn


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
def cluster() -> Iterator[MockCluster]:
    """A mock cluster of two brokers in its own process (the stack's cannot make a topic of
    more than 4 partitions, nor lead partitions from chosen brokers)."""
    mock = MockCluster(brokers=2)
    yield mock
    mock.close()


@pytest.fixture
def many(cluster: MockCluster, make_config: Callable[..., TopicConfig]) -> TopicConfig:
    """A topic of `MANY` partitions on `cluster`, partition p holding p % 7 messages."""
    config = make_config(brokers=cluster.brokers, kafka={"log_level": 0})
    cluster.create_topic(config.topic, [1 + p % 2 for p in range(MANY)])
    producer = Producer({"bootstrap.servers": cluster.brokers, "log_level": 0})
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
    # Two calls (the earliest offsets, then the latest), whatever the number of partitions.
    assert calls == {"offsets_for_times": 2}


def test_a_broker_down_holds_back_only_the_partitions_it_leads(
    many: TopicConfig, cluster: MockCluster
) -> None:
    partitions = list(range(MANY))
    led_by_2 = {p for p in partitions if p % 2 == 1}
    with KafkaMetadata(many) as metadata:
        metadata.watermarks_of(many.topic, partitions)  # connected to both brokers
        cluster.broker_down(2)
        try:
            found, failed = metadata.watermarks_now(many.topic, partitions)
        finally:
            cluster.broker_up(2)
    assert found == {p: (0, p % 7) for p in partitions if p not in led_by_2}
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
        ZkOffsetStore(config, instance_id="another") as another,
    ):
        driver.run(until_caught_up=True)
        assert stored(config) == dict.fromkeys(PARTITIONS, 10)
        # The driver's claim on partition 2 is gone (as after a session expiry), and another
        # instance claims it: a new claim node, and the record rewritten (a new version).
        claim = SpoutTree(config.zk_spout_path).claim(2)
        zk.delete(claim)
        assert another.claim(2, claim, b'{"instance": "another"}', lambda: 0) is not None
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

"""Shared fixtures: one real dev stack (Apache Kafka's broker, ZooKeeper, Redis) for the whole
session, and its PostgreSQL server (`postgres`), started only for the tests that ask for it.

Fixtures that touch it are lazy: a run of unit tests alone starts no server. Tests that use the
stack, or live under `tests/integration/`, are marked `integration` (`-m "not integration"`
skips them). A test that stops or kills a server through `stack.<component>` must start it again.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from confluent_kafka import Producer
from kazoo.client import KazooClient

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, KafkaCluster, PostgresServer, create_topic
from tests.integration.helpers import (
    FAST_BACKOFF,
    PARTITIONS,
    ZK_ROOT,
    TopicFactory,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Spark's Python workers must run this interpreter (it has confluent-kafka and kspout), not the
# `python3` on PATH; set before any test starts a SparkSession.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
# ... and import test modules (bolts in tests/integration/spark_jobs.py travel by reference).
REPO = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))

INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        uses_stack = "stack" in getattr(item, "fixturenames", ())
        if uses_stack or INTEGRATION_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """The session's DevStack: `.info` has the addresses, `.kafka/.zookeeper/.redis` the handles."""
    with DevStack(tmp_path_factory.mktemp("devstack")) as dev_stack:
        yield dev_stack


@pytest.fixture(scope="session")
def postgres(stack: DevStack) -> PostgresServer:
    """The stack's PostgreSQL server, started by the first test that asks for it (use tables
    unique to the test); the stack removes it at the end."""
    stack.postgres.start()
    return stack.postgres


@pytest.fixture(scope="session")
def _shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes for the tests that need brokers of their own to lead, lose or
    replicate partitions (the stack's single broker is never taken down for them); started
    once, as three JVMs take 15-25 s on two cores. A follower that stops fetching leaves the
    ISR after 2 s."""
    with KafkaCluster(
        tmp_path_factory.mktemp("cluster"), settings={"replica.lag.time.max.ms": "2000"}
    ) as nodes:
        yield nodes


@pytest.fixture
def kafka_cluster(_shared_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """The shared three-node cluster with every node serving: a node the test killed is
    started again afterwards, and one it froze is thawed first. Use topics of the test's own."""
    yield _shared_cluster
    for node in _shared_cluster.nodes:
        if node.running:
            node.thaw()  # a no-op unless it was frozen
    _shared_cluster.start()


@pytest.fixture
def topic_factory(request: pytest.FixtureRequest, stack: DevStack) -> TopicFactory:
    """Makes unique topics `t-<test>-<suffix>-<uuid8>`, created on the stack's broker through
    the admin API (4 partitions unless told; `create=False` for a name only): no two tests
    share a topic, so none sees another's messages or commit points."""
    test = re.sub(r"[^a-zA-Z0-9._-]+", "-", request.node.name).strip("-")[:120]

    def make(
        suffix: str = "",
        *,
        partitions: int = len(PARTITIONS),
        config: Mapping[str, str] | None = None,
        create: bool = True,
    ) -> str:
        parts = ["t", test, suffix, uuid.uuid4().hex[:8]]
        name = "-".join(part for part in parts if part)[:249]  # Kafka's longest topic name
        if create:
            create_topic(stack.info.brokers, name, partitions, config=config)
        return name

    return make


@pytest.fixture
def topic_name(topic_factory: TopicFactory) -> str:
    """A topic name used by this test only."""
    return topic_factory("")


@pytest.fixture
def zk(stack: DevStack) -> Iterator[KazooClient]:
    """A started kazoo client on the stack's ZooKeeper, stopped and closed after the test."""
    client = KazooClient(hosts=stack.info.zookeeper, timeout=10.0)
    client.start(timeout=15.0)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def redis_client(stack: DevStack) -> Iterator[redis.Redis]:
    """A redis-py client on the stack's Redis (not flushed: use keys unique to the test)."""
    client = redis.Redis.from_url(stack.info.redis_url)
    yield client
    client.close()


@pytest.fixture
def spark() -> Iterator[SparkSession]:
    """A Spark `local[2]` session, shared by the tests that use it (it takes ~10 s to start).

    Function-scoped on purpose: it returns the active session, so a test that needs another
    master (the standalone cluster test) can stop this one and the next test starts it again.
    """
    from kspout.spark import spark_session

    session = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
    session.sparkContext.setLogLevel("ERROR")
    yield session


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_exit() -> Iterator[None]:
    yield
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture
def make_config(stack: DevStack, topic_name: str) -> Callable[..., TopicConfig]:
    """Factory: this test's topic with its own spout id, small batches and fast retries."""
    spout_id = f"spout-{uuid.uuid4().hex[:8]}"

    def make(**overrides: Any) -> TopicConfig:
        data: dict[str, Any] = {
            "topic": topic_name,
            "spout_id": spout_id,
            "topology_name": "run-test",
            "zk_root": ZK_ROOT,
            "brokers": stack.info.brokers,
            "zookeeper": stack.info.zookeeper,
            "batch_size": 200,
            "max_retries": 3,
            "retry_backoff": FAST_BACKOFF,
            "commit_interval": 0.2,
            # A stuck fetch or a lost outcome shows up in seconds, not minutes.
            "fetch_timeout": 5.0,
            "message_timeout": 10.0,
        }
        data.update(overrides)
        return parse_config(data)

    return make


@pytest.fixture
def dedup_config(
    make_config: Callable[..., TopicConfig], stack: DevStack
) -> Callable[..., TopicConfig]:
    """`make_config` for a chain with the dedup bolt: ids from the key, the stack's Redis."""

    def make(**overrides: Any) -> TopicConfig:
        overrides["dedup"] = {"id_source": "key", "lease": 30.0, **overrides.get("dedup", {})}
        overrides.setdefault("redis", {"url": stack.info.redis_url})
        return make_config(**overrides)

    return make


@pytest.fixture
def producer(stack: DevStack) -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": stack.info.brokers, "linger.ms": 5})
    yield client
    client.flush(10)

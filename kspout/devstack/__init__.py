"""The embedded development stack: Kafka (Apache Kafka's own broker, KRaft), ZooKeeper and
Redis as real processes on loopback ports, for the demo, `kspout dev` and the integration tests;
a cluster of Kafka brokers for replication tests; PostgreSQL on demand, for the fenced SQL sink;
and a Spark standalone master and worker for the cluster test."""

from kspout.devstack.components import (
    Component,
    PostgresServer,
    RedisServer,
    ZooKeeperServer,
)
from kspout.devstack.kafka_broker import KafkaBroker, KafkaCluster
from kspout.devstack.spark_cluster import SparkStandalone
from kspout.devstack.stack import DevStack
from kspout.devstack.state import (
    ComponentState,
    StackInfo,
    StackState,
    default_dir,
    load_stack_info,
)
from kspout.devstack.topics import create_topic

__all__ = [
    "Component",
    "ComponentState",
    "DevStack",
    "KafkaBroker",
    "KafkaCluster",
    "PostgresServer",
    "RedisServer",
    "SparkStandalone",
    "StackInfo",
    "StackState",
    "ZooKeeperServer",
    "create_topic",
    "default_dir",
    "load_stack_info",
]

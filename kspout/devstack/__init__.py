"""The embedded development stack: Kafka (librdkafka's mock cluster), ZooKeeper and Redis as
real processes on loopback ports, for the demo, `kspout dev` and the integration tests; PostgreSQL
on demand, for the fenced SQL sink; and a Spark standalone master and worker for the cluster
test."""

from kspout.devstack.components import (
    Component,
    KafkaMock,
    PostgresServer,
    RedisServer,
    ZooKeeperServer,
)
from kspout.devstack.spark_cluster import SparkStandalone
from kspout.devstack.stack import DevStack
from kspout.devstack.state import (
    ComponentState,
    StackInfo,
    StackState,
    default_dir,
    load_stack_info,
)

__all__ = [
    "Component",
    "ComponentState",
    "DevStack",
    "KafkaMock",
    "PostgresServer",
    "RedisServer",
    "SparkStandalone",
    "StackInfo",
    "StackState",
    "ZooKeeperServer",
    "default_dir",
    "load_stack_info",
]

"""The servers the driver benchmarks run against: ZooKeeper from the embedded dev stack, and a
cluster of Apache Kafka brokers (`KafkaCluster`, whose `create_topic` makes topics of any
number of partitions, led by chosen brokers)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, KafkaCluster


@contextmanager
def zookeeper_and_kafka_cluster(
    name: str, brokers: int, **settings: Any
) -> Iterator[tuple[KafkaCluster, TopicConfig]]:
    """Both, started and stopped around the block, and a topic file's config that names them:
    a fresh topic and spout id starting with `name`, under the ZooKeeper root `/<name>`, with
    `settings` for the rest."""
    with (
        tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp,
        KafkaCluster(Path(tmp) / "kafka", brokers) as cluster,
        DevStack(Path(tmp) / "stack", components=("zookeeper",)) as stack,
    ):
        config = parse_config(
            {
                "topic": f"{name}-{uuid.uuid4().hex[:8]}",
                "spout_id": f"{name}-{uuid.uuid4().hex[:10]}",
                "zk_root": f"/{name}",
                "brokers": cluster.brokers,
                "zookeeper": stack.info.zookeeper,
                **settings,
            }
        )
        yield cluster, config

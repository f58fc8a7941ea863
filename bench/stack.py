"""The servers the driver benchmarks run against: ZooKeeper from the embedded dev stack, and
librdkafka's mock cluster in a process of its own (`tests.chaos.faults.MockCluster`, which can
make topics of any number of partitions, led by chosen brokers)."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack
from tests.chaos.faults import MockCluster


@contextmanager
def zookeeper_and_mock_cluster(
    name: str, brokers: int, **settings: Any
) -> Iterator[tuple[MockCluster, TopicConfig]]:
    """Both servers, started and stopped around the block, and a topic file's config that
    names them: a fresh topic and spout id starting with `name`, under the ZooKeeper root
    `/<name>`, with `settings` for the rest."""
    cluster = MockCluster(brokers=brokers)
    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp,
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
    finally:
        cluster.close()

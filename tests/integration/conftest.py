"""Fixtures shared by the integration tests: per-test topic configs and a producer."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack
from tests.integration.helpers import FAST_BACKOFF, ZK_ROOT


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
def producer(stack: DevStack) -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": stack.info.brokers, "linger.ms": 5})
    yield client
    client.flush(10)

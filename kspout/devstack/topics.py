"""Topics on a dev stack's Kafka, made through the admin API (the broker would auto-create a
topic on first use, but with one partition and the broker's defaults)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kspout.errors import StackError
from kspout.kafka import LIBRDKAFKA_LOG


def create_topic(
    brokers: str,
    topic: str,
    partitions: int = 1,
    *,
    replication: int = 1,
    placement: Sequence[int] | None = None,
    config: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> None:
    """Create `topic` and return once every partition has a leader.

    `placement` puts partition `p` on node `placement[p]` alone (replication 1, and as many
    partitions as it has entries): a test or benchmark then chooses which node's stop or
    crash takes which partitions away. `config` holds topic configs (`cleanup.policy`, ...).
    """
    client: dict[str, Any] = {"bootstrap.servers": brokers, "logger": LIBRDKAFKA_LOG}
    admin = AdminClient(client)
    settings = dict(config or {})
    if placement is None:
        new = NewTopic(topic, partitions, replication, config=settings)
    else:
        partitions = len(placement)
        assignment = [[node] for node in placement]
        new = NewTopic(topic, partitions, replica_assignment=assignment, config=settings)
    admin.create_topics([new], operation_timeout=timeout)[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        known = admin.list_topics(topic, timeout=timeout).topics[topic]
        led = [p for p in known.partitions.values() if p.leader >= 0 and p.error is None]
        if known.error is None and len(led) == partitions:
            return
        if time.monotonic() > deadline:
            raise StackError(
                f"topic {topic}: {len(led)} of {partitions} partitions had a leader after "
                f"{timeout:g} s"
            )
        time.sleep(0.05)

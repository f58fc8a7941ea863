"""This process's fetchers, one per topic config, kept for the process's life.

Kafka consumers do not pickle, so each Spark Python worker makes its own `PartitionFetcher` on
first use and every later task it runs reuses it: `KafkaSpout`'s tasks, `foreach_batch`'s
frames and the streaming source's reads alike.
"""

from __future__ import annotations

from kspout.config import TopicConfig
from kspout.kafka import PartitionFetcher
from kspout.worker_clients import WorkerClients


def _started(config: TopicConfig) -> PartitionFetcher:
    fetcher = PartitionFetcher(config)
    fetcher.start()
    return fetcher


_fetchers = WorkerClients(_started)


def fetcher_for(config: TopicConfig) -> PartitionFetcher:
    """This worker's fetcher for the config, started on first use."""
    return _fetchers.get(config)


def close_fetchers() -> None:
    """Close the fetchers `fetcher_for` made in this process (for tools that run task bodies
    in process; a Spark worker keeps its fetcher until it exits)."""
    _fetchers.close_all(PartitionFetcher.close)

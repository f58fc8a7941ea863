"""This process's fetchers, one per Kafka cluster, kept for the process's life.

Kafka consumers do not pickle, so each Spark Python worker makes its own `PartitionFetcher` on
first use and every later task it runs reuses it: `KafkaSpout`'s tasks, `foreach_batch`'s
frames and the streaming source's reads alike.
"""

from __future__ import annotations

from kspout.config import TopicConfig
from kspout.kafka import PartitionFetcher

_fetchers: dict[str, PartitionFetcher] = {}


def fetcher_for(config: TopicConfig) -> PartitionFetcher:
    """This worker's fetcher for the config's cluster, started on first use."""
    key = repr((config.brokers, sorted(config.kafka_config().items())))
    fetcher = _fetchers.get(key)
    if fetcher is None:
        fetcher = PartitionFetcher(config)
        fetcher.start()
        _fetchers[key] = fetcher
    return fetcher


def close_fetchers() -> None:
    """Close the fetchers `fetcher_for` made in this process (for tools that run task bodies
    in process; a Spark worker keeps its fetcher until it exits)."""
    while _fetchers:
        _, fetcher = _fetchers.popitem()
        fetcher.close()

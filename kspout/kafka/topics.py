"""Create topics through the admin API, with the topic file's connection settings."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kspout.config import TopicConfig
from kspout.errors import KafkaRequestFailed
from kspout.kafka._client import REQUEST_TIMEOUT, client_settings


def ensure_topic(
    config: TopicConfig, partitions: int, *, timeout: float = 3 * REQUEST_TIMEOUT
) -> None:
    """Create the config's topic with `partitions` partitions (the brokers' default replication
    factor); a topic that exists is kept as it is."""
    error = try_create_topic(config, config.topic, partitions, timeout=timeout)
    if error is not None:
        raise KafkaRequestFailed(
            "topic creation",
            config.topic,
            None,
            str(error),
            "check the brokers and that this client may create topics",
        )


def try_create_topic(
    config: TopicConfig,
    topic: str,
    partitions: int = -1,
    *,
    timeout: float = 3 * REQUEST_TIMEOUT,
) -> KafkaError | None:
    """Ask Kafka to create `topic` (`partitions` -1: the brokers' default, as their own
    auto-creation would; their default replication factor): None once it exists, created now
    or before, else Kafka's error, for the caller to say what it means to it."""
    admin = AdminClient(client_settings(config))
    futures = admin.create_topics([NewTopic(topic, partitions)], request_timeout=REQUEST_TIMEOUT)
    try:
        futures[topic].result(timeout)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return None if error.code() == KafkaError.TOPIC_ALREADY_EXISTS else error
    return None

"""Create a topic through the admin API, with the topic file's connection settings."""

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
    admin = AdminClient(client_settings(config))
    future = admin.create_topics([NewTopic(config.topic, partitions)])[config.topic]
    try:
        future.result(timeout)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaRequestFailed(
                "topic creation",
                config.topic,
                None,
                str(error),
                "check the brokers and that this client may create topics",
            ) from exc

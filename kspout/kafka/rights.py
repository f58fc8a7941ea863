"""The rights a spout checks before it claims anything: Read on its topic, Write on its
dead-letter topic.

The broker is asked which operations the principal may perform on each topic (Kafka's
"authorized operations", KIP-430: a metadata request answered for the asking principal, so no
right to list ACLs is needed). Without this check a refused fetch or dead-letter write would
surface only as a failed batch, released and asked again for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient  # type: ignore[attr-defined]

from kspout.config import TopicConfig
from kspout.kafka._client import REQUEST_TIMEOUT, call_kafka, client_settings
from kspout.kafka.access import access_denied, refusal


def require_spout_rights(config: TopicConfig) -> None:
    """`KafkaAccessDenied` unless the principal may Read the topic and Write the dead-letter
    topic (when it exists: a missing one is created on first use, where the cluster allows)."""
    require_rights(config, {config.topic: AclOperation.READ, config.dlq_topic: AclOperation.WRITE})


def require_rights(config: TopicConfig, wanted: Mapping[str, AclOperation]) -> None:
    """`KafkaAccessDenied` for the first topic whose operation in `wanted` the principal lacks
    (Read and Write imply Describe, as Kafka's authorizer has it). A topic that does not exist
    is passed over: the caller says so in its own words. A transient error (a controller
    election, a broker restarting) is asked again; one that lasts is `KafkaRequestFailed`."""
    admin = AdminClient(client_settings(config))
    for topic, operation in wanted.items():
        name = operation.name.capitalize()
        allowed = call_kafka(
            "describe", topic, None, partial(_authorized, admin, config, topic, name)
        )
        if allowed is None:
            continue
        if operation not in allowed and AclOperation.ALL not in allowed:
            shown = ", ".join(sorted(op.name.capitalize() for op in allowed)) or "nothing"
            raise access_denied(config, name, topic, f"it may {shown}")


def _authorized(
    admin: AdminClient, config: TopicConfig, topic: str, name: str
) -> list[AclOperation] | None:
    """The operations the principal may perform on `topic` (None: it does not exist); a
    refusal as `KafkaAccessDenied` (or the login's), any other error as Kafka raised it."""
    asked = TopicCollection([topic])
    answers = admin.describe_topics(
        asked, include_authorized_operations=True, request_timeout=REQUEST_TIMEOUT
    )
    try:
        # The request times out first (REQUEST_TIMEOUT): its error is Kafka's, asked again.
        return list(answers[topic].result(2 * REQUEST_TIMEOUT).authorized_operations or [])
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        found = refusal(config, error, name, topic)
        if found is None:
            raise
        raise found from None

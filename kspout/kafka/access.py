"""What a secured cluster's refusals mean for kspout: errors to fix, not outages to wait out.

On a cluster with SASL logins and ACLs, a wrong password and a missing ACL are not outages:
asking again never helps, so they end a command or a run at once, naming the principal, the
topic and the setting or ACL to fix (`KafkaLoginRefused`, `KafkaAccessDenied`), instead of the
backoff an unreachable broker gets.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from kspout.config import TopicConfig
from kspout.errors import KafkaAccessDenied, KafkaLoginRefused

# librdkafka's codes for a refused login (its own, and the broker's).
LOGIN_REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED})
# The broker's codes for an operation the principal's ACLs do not allow.
NOT_AUTHORIZED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


def principal(config: TopicConfig) -> str:
    """The principal this config logs in as, as ACLs name it: `User:<sasl.username>`; without
    a SASL user, whatever the cluster makes of the connection (TLS certificate, anonymous)."""
    user = config.kafka.get("sasl.username")
    return f"User:{user}" if user else "this client's principal (no `kafka.sasl.username` set)"


def login_refused(config: TopicConfig, cause: str) -> KafkaLoginRefused:
    """The error for a login the brokers refused (`cause`: librdkafka's words)."""
    return KafkaLoginRefused(principal(config), config.brokers, config.path, cause)


def access_denied(config: TopicConfig, operation: str, topic: str, why: str) -> KafkaAccessDenied:
    """The error for `operation` (an ACL operation: Read, Write, Describe) refused on `topic`."""
    return KafkaAccessDenied(principal(config), operation, topic, config.brokers, config.path, why)


def refusal(config: TopicConfig, error: KafkaError, operation: str, topic: str) -> Exception | None:
    """The kspout error for a broker refusal that retrying cannot cure, else None."""
    if error.code() in LOGIN_REFUSED:
        return login_refused(config, error.str())
    if error.code() in NOT_AUTHORIZED:
        return access_denied(config, operation, topic, error.str())
    return None

"""Which broker refusals stop kspout at once, and what their errors tell a user to fix
(`kspout.kafka.access`); the real refusals are in tests/integration/test_kafka_security.py."""

from __future__ import annotations

import pickle

import pytest
from confluent_kafka import KafkaError

from kspout.config import TopicConfig, parse_config
from kspout.errors import KafkaAccessDenied, KafkaLoginRefused
from kspout.kafka._client import BrokerReports
from kspout.kafka.access import principal, refusal

SECRET = "s3cret-pw"


def secured(**kafka: str) -> TopicConfig:
    return parse_config(
        {
            "topic": "orders",
            "spout_id": "orders",
            "brokers": "k1:9093",
            "kafka": {"sasl.password": SECRET, **kafka},
        },
        "orders.toml",
    )


def test_the_principal_is_the_sasl_user_as_acls_name_it_or_says_none_is_set() -> None:
    assert principal(secured(**{"sasl.username": "alice"})) == "User:alice"
    assert "no `kafka.sasl.username` set" in principal(secured())


def test_a_refused_login_names_the_user_the_keys_and_the_file_never_the_password() -> None:
    config = secured(**{"sasl.username": "alice"})
    error = KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error")
    found = refusal(config, error, "Read", "orders")
    assert isinstance(found, KafkaLoginRefused)
    text = str(found)
    assert "refused the login of User:alice" in text
    assert "`kafka.sasl.username`" in text and "orders.toml" in text and "k1:9093" in text
    assert SECRET not in text


def test_a_missing_acl_names_the_operation_the_topic_and_the_grant() -> None:
    config = secured(**{"sasl.username": "alice"})
    error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    found = refusal(config, error, "Write", "orders.dlq")
    assert isinstance(found, KafkaAccessDenied)
    assert (found.principal, found.operation, found.topic) == ("User:alice", "Write", "orders.dlq")
    assert (
        "kafka-acls.sh --bootstrap-server k1:9093 --add --allow-principal User:alice "
        "--operation Write --topic orders.dlq"
    ) in str(found)


def test_an_outage_is_no_refusal() -> None:
    config = secured()
    for code in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError.LEADER_NOT_AVAILABLE):
        assert refusal(config, KafkaError(code), "Read", "orders") is None


def test_a_refusal_found_on_a_worker_reaches_the_driver_whole() -> None:
    """A refusal travels pickled in a Spark task's result: it arrives with its fields and
    its message, as the driver raises it."""
    config = secured(**{"sasl.username": "alice"})
    error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    found = refusal(config, error, "Read", "orders")
    assert isinstance(found, KafkaAccessDenied)
    copy = pickle.loads(pickle.dumps(found))
    assert type(copy) is KafkaAccessDenied
    assert (copy.principal, copy.operation, copy.topic) == ("User:alice", "Read", "orders")
    assert str(copy) == str(found)


def test_a_login_refused_to_a_running_client_is_raised_once_naming_the_user() -> None:
    """A client's error callback hears of a login refused on a reconnect (the password changed
    while it ran): its next look raises it, once; an outage is not one."""
    config = secured(**{"sasl.username": "alice"})
    reports = BrokerReports()
    reports(KafkaError(KafkaError._TRANSPORT, "Disconnected"))
    reports.raise_refused(config)  # nothing to raise
    reports(
        KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: Authentication failed")
    )
    with pytest.raises(KafkaLoginRefused, match="refused the login of User:alice"):
        reports.raise_refused(config)
    reports.raise_refused(config)  # cleared: a client asked again is judged afresh

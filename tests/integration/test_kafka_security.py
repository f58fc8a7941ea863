"""A secured Kafka: SASL_SSL (SCRAM-SHA-512 over TLS with this module's own certificates) and
ACLs enforced by Kafka's StandardAuthorizer, on Apache Kafka's real broker.

A principal with exactly the rights README's "Secured clusters" lists runs `kspout run` (a
handler that publishes through `KafkaOutput` and fails some records into the dead-letter topic,
commit points mirrored to a consumer group), `KafkaSpout.run` on Spark, the streaming source,
and `status`, `lag` and `dlq show`; a wrong password, a principal without Read on the topic,
one without Write on the dead-letter topic and one without Describe are stopped at once with
an error naming the principal, the topic and what to fix. No command prints the password, at
`-vv` either.

The broker and a ZooKeeper of this module's own start once for the module; a broker that does
not start fails every test here (never a skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Consumer, Producer, TopicPartition
from cryptography.hazmat.primitives import serialization
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from kspout import KafkaSpout, load_config
from kspout.devstack import ZooKeeperServer, create_topic
from kspout.devstack.secured_kafka import SecuredKafkaBroker, grant
from kspout.kafka import Record
from tests.integration.helpers import kspout_command, read_topic

PASSWORD = "scram-s3cret-pw"  # every user's, but the wrong one's
USERS = {name: PASSWORD for name in ("spout", "no-read", "no-dlq")}
PARTITIONS = 2
PER_PARTITION = 10
FAILING = 5  # the handler fails every record whose offset is a multiple of it
QUICK = 20.0  # seconds a refused login or a missing ACL may take to stop a command

HANDLER = f"""
import os

from kspout.config import load_config
from kspout.output import KafkaOutput

OUTPUT = KafkaOutput(load_config(os.environ["TOPIC_FILE"]), os.environ["OUTPUT_TOPIC"])


def handle(record):
    if record.offset % {FAILING} == 0:
        raise ValueError("refused by the test")
    OUTPUT.send(record, record.value)
    OUTPUT.flush()
"""


@dataclass(frozen=True)
class Secured:
    broker: SecuredKafkaBroker
    zookeeper: str
    ca: Path

    @property
    def setup_brokers(self) -> str:
        """The PLAINTEXT listener: the test's own super user, for topics, ACLs and checks."""
        return self.broker.address


def broker_certificate(home: Path) -> tuple[Path, Path]:
    """A test CA's PEM file, and a PEM file with a certificate for 127.0.0.1 it signed and its
    PKCS#8 key (as Kafka's PEM key store wants it)."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    certificate = home / "broker.pem"
    certificate.write_bytes(pkcs8 + b"".join(pem.bytes() for pem in issued.cert_chain_pems))
    ca_file = home / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return certificate, ca_file


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("secured-kafka")
    certificate, ca = broker_certificate(home)
    broker = SecuredKafkaBroker(home, certificate=certificate, users=USERS)
    zookeeper = ZooKeeperServer(home)
    try:
        broker.start()
        zookeeper.start()
        yield Secured(broker, zookeeper.address, ca)
    finally:
        zookeeper.stop()
        broker.stop()


@dataclass(frozen=True)
class Spout:
    """One test's topic (with its dead-letter and output topics) and topic file."""

    topic: str
    dlq: str
    output: str
    file: Path
    workdir: Path


MakeSpout = Callable[..., Spout]


@pytest.fixture
def make_spout(secured: Secured, tmp_path: Path) -> Iterator[MakeSpout]:
    def make(user: str, password: str = PASSWORD, extra: str = "") -> Spout:
        topic = f"secured-{uuid.uuid4().hex[:8]}"
        dlq, output = f"{topic}.dlq", f"{topic}.out"
        for name, partitions in ((topic, PARTITIONS), (dlq, 1), (output, 1)):
            create_topic(secured.setup_brokers, name, partitions)
        (tmp_path / "password").write_text(password + "\n")
        file = tmp_path / "topic.toml"
        file.write_text(
            textwrap.dedent(
                f"""\
                topic = "{topic}"
                spout_id = "{topic}"
                zk_root = "/secured"
                brokers = "{secured.broker.secure_address}"
                zookeeper = "{secured.zookeeper}"
                max_retries = 0
                commit_interval = 0.5
                fetch_timeout = 10.0
                {extra}

                [retry_backoff]
                initial = 0.05

                [kafka]
                "security.protocol" = "SASL_SSL"
                "sasl.mechanism" = "SCRAM-SHA-512"
                "sasl.username" = "{user}"
                "sasl.password_file" = "{tmp_path / "password"}"
                "ssl.ca.location" = "{secured.ca}"
                """
            )
        )
        (tmp_path / "secured_handler.py").write_text(HANDLER)
        return Spout(topic, dlq, output, file, tmp_path)

    yield make


def produce(secured: Secured, topic: str, partitions: int = PARTITIONS) -> None:
    producer = Producer({"bootstrap.servers": secured.setup_brokers})
    for partition in range(partitions):
        for offset in range(PER_PARTITION):
            producer.produce(topic, value=b"%d-%d" % (partition, offset), partition=partition)
    assert producer.flush(30) == 0


def listed_rights(secured: Secured, user: str, spout: Spout) -> None:
    """Exactly the rights README's "Secured clusters" lists for a spout, `dlq show` (Read on the
    dead-letter topic) and a `KafkaOutput` topic."""
    principal = f"User:{user}"
    grant(secured.setup_brokers, principal, spout.topic, "DESCRIBE", "READ")
    grant(secured.setup_brokers, principal, spout.dlq, "DESCRIBE", "WRITE", "READ")
    grant(secured.setup_brokers, principal, spout.output, "DESCRIBE", "WRITE")


def kspout(spout: Spout, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`kspout -vv <args> --config <the topic file>`, run as a user would, to the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    env |= {"TOPIC_FILE": str(spout.file), "OUTPUT_TOPIC": spout.output}
    argv = [str(kspout_command()), "-vv", *args, "--config", str(spout.file)]
    done = subprocess.run(
        argv, cwd=spout.workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert PASSWORD not in done.stdout + done.stderr, f"{args}: the password was printed"
    return done


def run_spout(spout: Spout) -> subprocess.CompletedProcess[str]:
    return kspout(spout, "run", "--handler", "secured_handler:handle", "--until-caught-up")


def test_a_principal_with_the_listed_rights_consumes_dead_letters_publishes_and_reports(
    secured: Secured, make_spout: MakeSpout
) -> None:
    group = f"mirror-{uuid.uuid4().hex[:8]}"
    spout = make_spout("spout", extra=f'consumer_group = "{group}"')
    listed_rights(secured, "spout", spout)
    grant(secured.setup_brokers, "User:spout", group, "READ", kind="GROUP")
    produce(secured, spout.topic)

    done = run_spout(spout)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in done.stderr.splitlines():  # the group kspout never uses needs no ACL
        assert not ("GROUP_AUTHORIZATION" in line and "WARNING" in line), line
    failing = PARTITIONS * len(range(0, PER_PARTITION, FAILING))
    published = read_topic(secured.setup_brokers, spout.output, PARTITIONS * PER_PARTITION)
    assert len(published) == PARTITIONS * PER_PARTITION - failing
    letters = read_topic(secured.setup_brokers, spout.dlq, failing)
    assert len(letters) == failing

    status = kspout(spout, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    rows = json.loads(status.stdout)["partitions"]
    assert [row["committed"] for row in rows] == [PER_PARTITION] * PARTITIONS
    lag = kspout(spout, "lag", "--json")
    assert lag.returncode == 0, lag.stderr[-3000:]
    shown = kspout(spout, "dlq", "show", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert len(json.loads(shown.stdout)["letters"]) == failing
    assert mirrored(secured, spout.topic, group) == [PER_PARTITION] * PARTITIONS


def mirrored(secured: Secured, topic: str, group: str) -> list[int]:
    """The offsets `consumer_group` holds for each partition of `topic`."""
    consumer = Consumer({"bootstrap.servers": secured.setup_brokers, "group.id": group})
    try:
        asked = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        return [tp.offset for tp in consumer.committed(asked, timeout=10)]
    finally:
        consumer.close()


def stream(spark: SparkSession, spout: Spout) -> list[tuple[int, int]]:
    """One `availableNow` run of the spout's topic file as a stream: (partition, offset) of
    every row it delivered."""
    seen: list[tuple[int, int]] = []

    def sink(frame: DataFrame, _batch: int) -> None:
        seen.extend((row.partition, row.offset) for row in frame.collect())

    query = (
        spark.readStream.format("kspout")
        .option("config", str(spout.file))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(spout.workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        assert not query.isActive, "the availableNow run did not end within 120 s"
    finally:
        query.stop()
    return seen


def test_the_streaming_source_reads_a_secured_topic_with_the_listed_rights(
    secured: Secured, make_spout: MakeSpout, spark: SparkSession
) -> None:
    spout = make_spout("spout")
    listed_rights(secured, "spout", spout)
    produce(secured, spout.topic)
    expected = [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
    assert sorted(stream(spark, spout)) == expected


def test_the_streaming_source_without_read_fails_its_query_naming_the_acl(
    secured: Secured, make_spout: MakeSpout, spark: SparkSession
) -> None:
    spout = make_spout("no-read")
    grant(secured.setup_brokers, "User:no-read", spout.topic, "DESCRIBE")
    produce(secured, spout.topic)
    with pytest.raises(StreamingQueryException) as failed:
        stream(spark, spout)
    assert f"Kafka refused User:no-read Read on topic '{spout.topic}'" in str(failed.value)


def fail_every_fifth(record: Record) -> None:
    """A handler for Spark's workers (found there by reference to this module)."""
    if record.offset % FAILING == 0:
        raise ValueError("refused by the test")


def test_kafka_spout_run_on_spark_consumes_and_dead_letters_with_the_listed_rights(
    secured: Secured, make_spout: MakeSpout, spark: SparkSession
) -> None:
    spout = make_spout("spout")
    listed_rights(secured, "spout", spout)
    produce(secured, spout.topic)
    progress = KafkaSpout(load_config(spout.file), spark).run(
        fail_every_fifth, until_caught_up=True
    )
    failing = PARTITIONS * len(range(0, PER_PARTITION, FAILING))
    assert progress.total("acked") == PARTITIONS * PER_PARTITION - failing
    assert progress.total("dead_lettered") == failing
    assert [p.committed for p in progress.partitions] == [PER_PARTITION] * PARTITIONS
    assert len(read_topic(secured.setup_brokers, spout.dlq, failing)) == failing


def test_a_wrong_password_stops_a_run_and_status_at_once_naming_the_user_and_the_keys(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("spout", password="not-the-password")
    listed_rights(secured, "spout", spout)
    run = ["run", "--handler", "secured_handler:handle", "--until-caught-up"]
    for args, code in ((["status"], 3), (run, 1)):  # status: 3 is "could not tell"
        began = time.monotonic()
        done = kspout(spout, *args)
        took = time.monotonic() - began
        assert done.returncode == code, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert "refused the login of User:spout" in last, last
        assert "`kafka.sasl.username`" in last and "`kafka.sasl.password`" in last, last
        assert str(spout.file) in last, last
        assert "not-the-password" not in done.stdout + done.stderr
        assert took < QUICK, f"{args[0]}: {took:.1f} s to refuse a wrong password"


def test_a_principal_without_read_on_the_topic_is_stopped_naming_the_acl_to_grant(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("no-read")
    grant(secured.setup_brokers, "User:no-read", spout.topic, "DESCRIBE")
    grant(secured.setup_brokers, "User:no-read", spout.dlq, "DESCRIBE", "WRITE")
    produce(secured, spout.topic)
    began = time.monotonic()
    done = run_spout(spout)
    assert time.monotonic() - began < QUICK
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"Kafka refused User:no-read Read on topic '{spout.topic}'" in last, last
    assert f"--allow-principal User:no-read --operation Read --topic {spout.topic}" in last
    assert "`kafka.sasl.username`" in last, last
    # Describe is all `status` and `lag` need.
    status = kspout(spout, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    assert [row["committed"] for row in json.loads(status.stdout)["partitions"]] == [None] * 2
    lag = kspout(spout, "lag", "--json")
    assert lag.returncode == 0, lag.stderr[-3000:]


def test_a_principal_without_write_on_the_dead_letter_topic_is_stopped_before_it_claims(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("no-dlq")
    grant(secured.setup_brokers, "User:no-dlq", spout.topic, "DESCRIBE", "READ")
    grant(secured.setup_brokers, "User:no-dlq", spout.dlq, "DESCRIBE")
    produce(secured, spout.topic)
    began = time.monotonic()
    done = run_spout(spout)
    assert time.monotonic() - began < QUICK
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"Kafka refused User:no-dlq Write on topic '{spout.dlq}'" in last, last
    assert "it may Describe" in last, last
    produce(secured, spout.dlq, partitions=1)  # something `dlq show` must read
    shown = kspout(spout, "dlq", "show")  # which needs Read there
    assert shown.returncode == 1, shown.stderr[-3000:]
    last = shown.stderr.strip().splitlines()[-1]
    assert f"Kafka refused User:no-dlq Read on topic '{spout.dlq}'" in last, last


def test_a_principal_without_describe_is_refused_by_every_command(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("no-read")  # no right at all on this spout's topics
    for args, code in ((["status"], 3), (["lag"], 3), (["dlq", "show"], 1)):
        done = kspout(spout, *args)
        assert done.returncode == code, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert "Kafka refused User:no-read Describe on topic" in last, last

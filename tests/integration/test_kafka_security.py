"""A secured Kafka: SASL_SSL (SCRAM-SHA-512 over TLS with this module's own certificates) and
ACLs enforced by Kafka's StandardAuthorizer, on Apache Kafka's real broker.

A principal with exactly the rights README's "Secured clusters" lists runs `kspout run` (a
handler that publishes through `KafkaOutput` and fails some records into the dead-letter topic,
commit points mirrored to a consumer group), `KafkaSpout.run` on Spark, the streaming source,
and `status`, `lag` and `dlq show`; a wrong password, a principal without Read on the topic,
one without Write on the dead-letter topic and one without Describe are stopped at once with
an error naming the principal, the topic and what to fix; so is a client that does not trust
the brokers' CA, and a run whose missing dead-letter topic may not be created. A right revoked
while a run goes on (Read on the topic, Write on the dead-letter topic or on a `KafkaOutput`
topic, in a chain's later stage too), a password changed (found at the next login: the
listener asks for one every `REAUTH_MS`) or the dead-letter topic deleted stops the run within
seconds with the same error, nothing dead-lettered for it, and the commit points hold exactly
what was finished.
`produce`, `offsets`, `dlq replay` and `foreach_batch` work with the listed rights. No command
prints the password, at `-vv` either.

The broker and a ZooKeeper of this module's own start once for the module; a broker that does
not start fails every test here (never a skip).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from cryptography.hazmat.primitives import serialization
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from kspout import KafkaSpout, load_config
from kspout.devstack import ZooKeeperServer, create_topic
from kspout.devstack.secured_kafka import SecuredKafkaBroker, grant, revoke, set_password
from kspout.driver.progress import Progress
from kspout.errors import KafkaAccessDenied
from kspout.kafka import Record
from tests.integration.helpers import kspout_command, open_store, read_topic

PASSWORD = "scram-s3cret-pw"  # every user's, but the wrong one's
USERS = {name: PASSWORD for name in ("spout", "no-read", "no-dlq", "rotated")}
# Milliseconds a SASL session lasts before its client must log in again (KIP-368): a password
# changed mid-run is found within this much, without a broker restart.
REAUTH_MS = 3000
PARTITIONS = 2
PER_PARTITION = 10
FAILING = 5  # the handler fails every record whose offset is a multiple of it
QUICK = 20.0  # seconds a refused login or a missing ACL may take to stop a command
FETCH_TIMEOUT = 10.0  # the topic file's `fetch_timeout`: also the dead-letter writer's timeout

HANDLER = f"""
import os

from kspout.bolts import BasicBolt
from kspout.config import load_config
from kspout.groupings import Shuffle
from kspout.output import KafkaOutput, Publish

OUTPUT = KafkaOutput(load_config(os.environ["TOPIC_FILE"]), os.environ["OUTPUT_TOPIC"])


def handle(record):
    if record.offset % {FAILING} == 0:
        raise ValueError("refused by the test")
    OUTPUT.send(record, record.value)
    OUTPUT.flush()


class Forward(BasicBolt):
    outputs = ("record",)

    def process(self, tuple_, collector):
        collector.emit((tuple_.record,))


def send(record, output):
    output.send(record, record.value)


CHAIN = [Forward(), Shuffle(), Publish(send, OUTPUT)]  # publishes in its second stage
"""

# Handlers for runs that lose a right while they go on: each record takes a little time, so the
# run is still busy when the ACL goes, and each writes "<partition> <offset>" to HANDLED_LOG
# once it finished (the test's own ledger of what was done).
MID_RUN_HANDLERS = f"""
import os
import time

from kspout.config import load_config
from kspout.output import KafkaOutput

OUTPUT = KafkaOutput(load_config(os.environ["TOPIC_FILE"]), os.environ["OUTPUT_TOPIC"])
HANDLED = open(os.environ["HANDLED_LOG"], "a", buffering=1)


def finished(record):
    HANDLED.write(f"{{record.partition}} {{record.offset}}\\n")


def read(record):
    time.sleep(0.02)
    finished(record)


def fail_some(record):
    time.sleep(0.02)
    if record.offset % {FAILING} == 0:
        raise ValueError("refused by the test")
    finished(record)


def publish(record):
    time.sleep(0.02)
    OUTPUT.send(record, record.value)
    OUTPUT.flush()
    finished(record)
"""
MID_RUN_PER_PARTITION = 400  # 2 x 400 records x 20 ms: the run outlasts the test's revoke


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
    broker = SecuredKafkaBroker(
        home,
        certificate=certificate,
        users=USERS,
        settings={"connections.max.reauth.ms": str(REAUTH_MS)},
    )
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
    def make(
        user: str,
        password: str = PASSWORD,
        extra: str = "",
        ca: Path | None = None,
        *,
        dlq_created: bool = True,
    ) -> Spout:
        topic = f"secured-{uuid.uuid4().hex[:8]}"
        dlq, output = f"{topic}.dlq", f"{topic}.out"
        for name, partitions in ((topic, PARTITIONS), (dlq, 1), (output, 1)):
            if name != dlq or dlq_created:
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
                fetch_timeout = {FETCH_TIMEOUT}
                {extra}

                [retry_backoff]
                initial = 0.05

                [kafka]
                "security.protocol" = "SASL_SSL"
                "sasl.mechanism" = "SCRAM-SHA-512"
                "sasl.username" = "{user}"
                "sasl.password_file" = "{tmp_path / "password"}"
                "ssl.ca.location" = "{ca or secured.ca}"
                """
            )
        )
        (tmp_path / "secured_handler.py").write_text(HANDLER)
        (tmp_path / "mid_run.py").write_text(MID_RUN_HANDLERS)
        return Spout(topic, dlq, output, file, tmp_path)

    yield make


def produce(
    secured: Secured, topic: str, partitions: int = PARTITIONS, per_partition: int = PER_PARTITION
) -> None:
    producer = Producer({"bootstrap.servers": secured.setup_brokers})
    for partition in range(partitions):
        for offset in range(per_partition):
            producer.produce(topic, value=b"%d-%d" % (partition, offset), partition=partition)
    assert producer.flush(30) == 0


def listed_rights(secured: Secured, user: str, spout: Spout) -> None:
    """Exactly the rights README's "Secured clusters" lists for a spout, `dlq show` (Read on the
    dead-letter topic) and a `KafkaOutput` topic."""
    principal = f"User:{user}"
    grant(secured.setup_brokers, principal, spout.topic, "DESCRIBE", "READ")
    grant(secured.setup_brokers, principal, spout.dlq, "DESCRIBE", "WRITE", "READ")
    grant(secured.setup_brokers, principal, spout.output, "DESCRIBE", "WRITE")


def kspout_env(spout: Spout) -> dict[str, str]:
    """The environment a `kspout` command runs in: no KSPOUT_ overrides, the handlers' files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    return env | {
        "TOPIC_FILE": str(spout.file),
        "OUTPUT_TOPIC": spout.output,
        "HANDLED_LOG": str(spout.workdir / "handled.log"),
    }


def kspout(
    spout: Spout, *args: str, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`kspout -vv <args> --config <the topic file>`, run as a user would, to the end."""
    argv = [str(kspout_command()), "-vv", *args, "--config", str(spout.file)]
    done = subprocess.run(
        argv,
        cwd=spout.workdir,
        env=kspout_env(spout),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert PASSWORD not in done.stdout + done.stderr, f"{args}: the password was printed"
    return done


def run_spout(spout: Spout) -> subprocess.CompletedProcess[str]:
    return kspout(spout, "run", "--handler", "secured_handler:handle", "--until-caught-up")


def refused_run(spout: Spout) -> str:
    """Run the spout, which must stop within QUICK seconds, failing: its last line of stderr."""
    began = time.monotonic()
    done = run_spout(spout)
    assert time.monotonic() - began < QUICK
    assert done.returncode == 1, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


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
    assert written(secured, spout.output) == PARTITIONS * PER_PARTITION - failing
    assert written(secured, spout.dlq) == failing

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
    last = refused_run(spout)
    assert f"Kafka refused User:no-read Read on topic '{spout.topic}'" in last, last
    assert f"--allow-principal User:no-read --operation Read --topic {spout.topic}" in last
    assert "`kafka.sasl.username`" in last, last
    # Describe is all `status` and `lag` need.
    status = kspout(spout, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    assert [row["committed"] for row in json.loads(status.stdout)["partitions"]] == [None] * 2
    lag = kspout(spout, "lag", "--json")
    assert lag.returncode == 0, lag.stderr[-3000:]


def test_write_refused_in_a_later_stage_of_a_chain_stops_the_run_dead_lettering_nothing(
    secured: Secured, make_spout: MakeSpout
) -> None:
    """A chain's second stage publishes to a topic the principal may not Write: the refusal
    stops the run as a first stage's does, instead of the backoff of an outage."""
    spout = make_spout("spout")
    grant(secured.setup_brokers, "User:spout", spout.topic, "DESCRIBE", "READ")
    grant(secured.setup_brokers, "User:spout", spout.dlq, "DESCRIBE", "WRITE")
    grant(secured.setup_brokers, "User:spout", spout.output, "DESCRIBE")
    produce(secured, spout.topic)
    began = time.monotonic()
    done = kspout(spout, "run", "--handler", "secured_handler:CHAIN", "--until-caught-up")
    assert time.monotonic() - began < QUICK, done.stderr[-3000:]
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"Kafka refused User:spout Write on topic '{spout.output}'" in last, last
    assert f"--allow-principal User:spout --operation Write --topic {spout.output}" in last, last
    assert written(secured, spout.dlq) == 0, "a source message was dead-lettered"


def test_a_principal_without_write_on_the_dead_letter_topic_is_stopped_before_it_claims(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("no-dlq")
    grant(secured.setup_brokers, "User:no-dlq", spout.topic, "DESCRIBE", "READ")
    grant(secured.setup_brokers, "User:no-dlq", spout.dlq, "DESCRIBE")
    produce(secured, spout.topic)
    last = refused_run(spout)
    assert f"Kafka refused User:no-dlq Write on topic '{spout.dlq}'" in last, last
    assert "it may Describe" in last, last
    produce(secured, spout.dlq, partitions=1)  # something `dlq show` must read
    shown = kspout(spout, "dlq", "show")  # which needs Read there
    assert shown.returncode == 1, shown.stderr[-3000:]
    last = shown.stderr.strip().splitlines()[-1]
    assert f"Kafka refused User:no-dlq Read on topic '{spout.dlq}'" in last, last


def test_a_missing_dead_letter_topic_is_created_at_the_start_or_the_run_stops_there(
    secured: Secured, make_spout: MakeSpout
) -> None:
    """The principal may not Create the missing dead-letter topic: the run stops at its start
    saying how to create it or grant Create, instead of retrying its first dead letter for
    ever. With Create, the run creates it."""
    spout = make_spout("spout", dlq_created=False)
    listed_rights(secured, "spout", spout)
    produce(secured, spout.topic)
    last = refused_run(spout)
    assert f"the dead-letter topic '{spout.dlq}' does not exist" in last, last
    assert f"--create --topic {spout.dlq}`" in last, last
    assert f"--allow-principal User:spout --operation Create --topic {spout.dlq}`" in last, last
    assert "`dead_letter_topic`" in last and str(spout.file) in last, last

    grant(secured.setup_brokers, "User:spout", spout.dlq, "CREATE")
    done = run_spout(spout)
    assert done.returncode == 0, done.stderr[-3000:]
    failing = PARTITIONS * len(range(0, PER_PARTITION, FAILING))
    assert written(secured, spout.dlq) == failing


def test_a_principal_without_describe_is_refused_by_every_command(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("no-read")  # no right at all on this spout's topics
    for args, code in ((["status"], 3), (["lag"], 3), (["dlq", "show"], 1)):
        done = kspout(spout, *args)
        assert done.returncode == code, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert "Kafka refused User:no-read Describe on topic" in last, last


def test_a_client_that_does_not_trust_the_brokers_ca_is_told_to_fix_the_ca_setting(
    secured: Secured, make_spout: MakeSpout, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    spout = make_spout("spout", ca=other_ca)
    done = kspout(spout, "status")
    assert done.returncode == 3, done.stderr[-3000:]  # 3: could not tell
    last = done.stderr.strip().splitlines()[-1]
    assert f"TLS with Kafka at {secured.broker.secure_address} failed" in last, last
    assert "certificate verify failed" in last, last
    assert "`kafka.ssl.ca.location`" in last and str(spout.file) in last, last
    assert "cannot reach Kafka" not in last, last


@dataclass
class MidRun:
    """A `kspout run` going on while a test takes a right away from its principal."""

    spout: Spout
    process: subprocess.Popen[str]
    stderr: Path

    def handled(self) -> dict[int, set[int]]:
        """What the handler finished so far (its own log), by partition."""
        done: dict[int, set[int]] = {p: set() for p in range(PARTITIONS)}
        log = self.spout.workdir / "handled.log"
        for line in log.read_text().splitlines() if log.exists() else []:
            partition, offset = map(int, line.split())
            done[partition].add(offset)
        return done

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.process.poll() is None, f"the run ended early: {self.tail()}"
            assert time.monotonic() < deadline, f"no {what} within {timeout:g}s: {self.tail()}"
            time.sleep(0.2)

    def stopped_within(self, seconds: float) -> str:
        """The run's exit (1, a setup error) within `seconds`: its last line of stderr."""
        try:
            code = self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"the run went on {seconds:g}s after the right was revoked: {self.tail()}")
        assert code == 1, self.tail()
        text = self.stderr.read_text()
        assert PASSWORD not in text, "the password was printed"
        return text.strip().splitlines()[-1]

    def tail(self) -> str:
        return self.stderr.read_text()[-3000:]


@pytest.fixture
def start_run() -> Iterator[Callable[[Spout, str], MidRun]]:
    """Starts `kspout -vv run --handler mid_run:<handler>` (never caught up: it goes on until
    it is stopped); kills what a failed test left running."""
    started: list[MidRun] = []

    def start(spout: Spout, handler: str) -> MidRun:
        stderr = spout.workdir / "run.stderr"
        argv = [str(kspout_command()), "-vv", "run", "--handler", f"mid_run:{handler}"]
        with stderr.open("w") as sink:
            process = subprocess.Popen(
                [*argv, "--config", str(spout.file)],
                cwd=spout.workdir,
                env=kspout_env(spout),
                stdout=subprocess.DEVNULL,
                stderr=sink,
                text=True,
            )
        run = MidRun(spout, process, stderr)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def commit_points(spout: Spout) -> list[int]:
    """Each partition's commit point, read from ZooKeeper (0 where there is no record)."""
    with open_store(load_config(spout.file)) as store:
        records = store.read_all()
    return [records[p].offset if p in records else 0 for p in range(PARTITIONS)]


def finished(spout: Spout) -> int:
    """How many offsets the spout's ZooKeeper records hold finished: below each commit point
    and in the finished runs listed above it."""
    with open_store(load_config(spout.file)) as store:
        records = store.read_all().values()
    return sum(r.offset + sum(hi - lo for lo, hi in r.done) for r in records)


def written(secured: Secured, topic: str) -> int:
    """How many messages `topic` holds (the sum of its partitions' high watermarks)."""
    consumer = Consumer({"bootstrap.servers": secured.setup_brokers, "group.id": "test-counter"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in parts)
    finally:
        consumer.close()


def mid_run_spout(secured: Secured, make_spout: MakeSpout) -> Spout:
    """A spout with the listed rights, small batches, and a topic that takes a while."""
    spout = make_spout("spout", extra="batch_size = 20")
    listed_rights(secured, "spout", spout)
    produce(secured, spout.topic, per_partition=MID_RUN_PER_PARTITION)
    return spout


def test_read_revoked_mid_run_stops_the_run_naming_the_grant_and_commits_what_finished(
    secured: Secured, make_spout: MakeSpout, start_run: Callable[[Spout, str], MidRun]
) -> None:
    spout = mid_run_spout(secured, make_spout)
    run = start_run(spout, "read")
    run.wait_for(lambda: sum(map(len, run.handled().values())) >= 60, "records handled")
    revoke(secured.setup_brokers, "User:spout", spout.topic, "READ")
    last = run.stopped_within(QUICK)
    assert f"Kafka refused User:spout Read on topic '{spout.topic}'" in last, last
    assert f"--allow-principal User:spout --operation Read --topic {spout.topic}" in last, last
    handled = run.handled()
    assert sum(map(len, handled.values())) < PARTITIONS * MID_RUN_PER_PARTITION
    # What finished is committed, and nothing past it: every handled run starts at 0.
    points = commit_points(spout)
    for p in range(PARTITIONS):
        assert handled[p] == set(range(points[p])), (p, points[p], sorted(handled[p])[-3:])
    assert written(secured, spout.dlq) == 0, "a record was dead-lettered for a revoked right"


def test_a_password_changed_mid_run_stops_the_run_at_its_next_login_naming_the_user(
    secured: Secured, make_spout: MakeSpout, start_run: Callable[[Spout, str], MidRun]
) -> None:
    """The user's SCRAM credential changes while the run goes on: at its clients' next login
    (the broker asks for one every `REAUTH_MS`) the run stops with the refused login, not the
    backoff of an outage, and commits what finished."""
    spout = make_spout("rotated", extra="batch_size = 20")
    listed_rights(secured, "rotated", spout)
    produce(secured, spout.topic, per_partition=MID_RUN_PER_PARTITION)
    run = start_run(spout, "read")
    run.wait_for(lambda: sum(map(len, run.handled().values())) >= 60, "records handled")
    set_password(secured.setup_brokers, "rotated", "a-new-password")
    last = run.stopped_within(REAUTH_MS / 1000 + QUICK)
    assert "refused the login of User:rotated" in last, last
    assert "`kafka.sasl.username`" in last and "`kafka.sasl.password`" in last, last
    handled = run.handled()
    assert sum(map(len, handled.values())) < PARTITIONS * MID_RUN_PER_PARTITION
    points = commit_points(spout)
    for p in range(PARTITIONS):
        assert handled[p] == set(range(points[p])), (p, points[p], sorted(handled[p])[-3:])


def test_write_on_the_dead_letter_topic_revoked_mid_run_stops_the_run_losing_no_letter(
    secured: Secured, make_spout: MakeSpout, start_run: Callable[[Spout, str], MidRun]
) -> None:
    spout = mid_run_spout(secured, make_spout)
    run = start_run(spout, "fail_some")
    run.wait_for(lambda: written(secured, spout.dlq) >= 4, "dead letters written")
    revoke(secured.setup_brokers, "User:spout", spout.dlq, "WRITE")
    last = run.stopped_within(QUICK)
    assert f"Kafka refused User:spout Write on topic '{spout.dlq}'" in last, last
    assert f"--allow-principal User:spout --operation Write --topic {spout.dlq}" in last, last
    letters = {
        (int(h[b"kspout.source.partition"]), int(h[b"kspout.source.offset"]))
        for h in (
            {name.encode(): value for name, value in m.headers() or []}
            for m in read_topic(secured.setup_brokers, spout.dlq, written(secured, spout.dlq))
        )
    }
    handled = run.handled()
    points = commit_points(spout)
    assert sum(points) < PARTITIONS * MID_RUN_PER_PARTITION, "the run ended before the revoke"
    for p in range(PARTITIONS):
        # Below the commit point each record finished: handled, or its letter is in the topic.
        for offset in range(points[p]):
            assert offset in handled[p] or (p, offset) in letters, (p, offset, points[p])


def test_the_dead_letter_topic_deleted_mid_run_stops_the_run_naming_it(
    secured: Secured, make_spout: MakeSpout, start_run: Callable[[Spout, str], MidRun]
) -> None:
    """Deleted while the run writes to it, on a cluster that will not create it again for
    this principal: the run stops with the missing topic's error, not retrying for ever."""
    spout = mid_run_spout(secured, make_spout)
    run = start_run(spout, "fail_some")
    run.wait_for(lambda: written(secured, spout.dlq) >= 4, "dead letters written")
    admin = AdminClient({"bootstrap.servers": secured.setup_brokers})
    admin.delete_topics([spout.dlq])[spout.dlq].result(30)
    last = run.stopped_within(QUICK + FETCH_TIMEOUT)  # the letters in flight time out first
    assert f"the dead-letter topic '{spout.dlq}' does not exist" in last, last
    assert f"--create --topic {spout.dlq}`" in last, last


def test_write_on_the_output_topic_revoked_mid_run_stops_the_run_dead_lettering_nothing(
    secured: Secured, make_spout: MakeSpout, start_run: Callable[[Spout, str], MidRun]
) -> None:
    spout = mid_run_spout(secured, make_spout)
    run = start_run(spout, "publish")
    run.wait_for(lambda: sum(map(len, run.handled().values())) >= 60, "records published")
    revoke(secured.setup_brokers, "User:spout", spout.output, "WRITE")
    last = run.stopped_within(QUICK)
    assert f"Kafka refused User:spout Write on topic '{spout.output}'" in last, last
    handled = run.handled()
    points = commit_points(spout)
    for p in range(PARTITIONS):
        assert handled[p] == set(range(points[p])), (p, points[p], sorted(handled[p])[-3:])
    assert written(secured, spout.dlq) == 0, "a source message was dead-lettered"


def test_produce_offsets_and_dlq_replay_work_with_the_listed_rights(
    secured: Secured, make_spout: MakeSpout
) -> None:
    spout = make_spout("spout")
    listed_rights(secured, "spout", spout)
    grant(secured.setup_brokers, "User:spout", spout.topic, "WRITE")  # produce, dlq replay
    produced = kspout(spout, "produce", "--file", "-", "--json", stdin="a\nb\nc\nd\ne\nf\n")
    assert produced.returncode == 0, produced.stderr[-3000:]
    assert json.loads(produced.stdout)["messages"] == 6
    done = run_spout(spout)  # offset 0 of each partition that got one is dead-lettered
    assert done.returncode == 0, done.stderr[-3000:]
    letters = written(secured, spout.dlq)
    assert letters >= 1

    shown = kspout(spout, "offsets", "show", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    moved = kspout(spout, "offsets", "set", "--partition", "0", "--to", "earliest")
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert commit_points(spout)[0] == 0

    replayed = kspout(spout, "dlq", "replay", "--all", "--json")
    assert replayed.returncode == 0, replayed.stderr[-3000:]
    assert written(secured, spout.topic) == 6 + letters


def test_foreach_batch_on_spark_reads_a_secured_topic_with_the_listed_rights(
    secured: Secured, make_spout: MakeSpout, spark: SparkSession
) -> None:
    spout = make_spout("spout")
    listed_rights(secured, "spout", spout)
    produce(secured, spout.topic)
    seen: list[int] = []

    def per_batch(frame: DataFrame, _batch: int) -> None:
        seen.extend(row.offset for row in frame.collect())

    progress = KafkaSpout(load_config(spout.file), spark).foreach_batch(
        per_batch, until_caught_up=True
    )
    assert len(seen) == PARTITIONS * PER_PARTITION
    assert [p.committed for p in progress.partitions] == [PER_PARTITION] * PARTITIONS


def slow_read(record: Record) -> None:
    """A handler for Spark's workers that keeps the run busy while the test revokes Read."""
    time.sleep(0.02)


def slow_frame(frame: DataFrame, _batch: int) -> None:
    """A `foreach_batch` function that keeps the run busy while the test revokes Read."""
    frame.collect()
    time.sleep(0.2)


@pytest.mark.parametrize("api", ["run", "foreach_batch"])
def test_read_revoked_under_spark_raises_the_refusal_on_the_driver(
    secured: Secured, make_spout: MakeSpout, spark: SparkSession, api: str
) -> None:
    """`KafkaSpout.run` (the fetch on a worker) and `foreach_batch` (the frame's fetch)."""
    spout = mid_run_spout(secured, make_spout)
    busy = threading.Event()
    stop = threading.Event()
    outcome: list[BaseException | Progress] = []

    def watch(progress: Progress) -> None:
        if progress.total("acked") >= 40:
            busy.set()

    def run() -> None:
        try:
            kafka_spout = KafkaSpout(load_config(spout.file), spark)
            if api == "run":
                outcome.append(kafka_spout.run(slow_read, stop=stop, on_progress=watch))
            else:
                outcome.append(kafka_spout.foreach_batch(slow_frame, stop=stop, on_progress=watch))
        except BaseException as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        assert busy.wait(120), "the run on Spark acked nothing within 120 s"
        revoke(secured.setup_brokers, "User:spout", spout.topic, "READ")
        runner.join(QUICK + 10)  # a Spark job in flight runs to its end first
        assert not runner.is_alive(), "the run went on after Read was revoked"
    finally:
        stop.set()
        runner.join(60)
    [error] = outcome
    assert isinstance(error, KafkaAccessDenied), error
    assert (error.principal, error.operation, error.topic) == ("User:spout", "Read", spout.topic)
    assert written(secured, spout.dlq) == 0, "a record was dead-lettered for a revoked right"
    # What was acked is recorded finished, though not always below the commit points: two
    # batches run at once, and when the second one's job gets Spark's cores first, the first
    # one's fetch is the one refused, its offsets unfinished below the second's.
    assert finished(spout) >= 40

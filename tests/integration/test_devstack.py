"""The embedded dev stack against its real servers: each answers, restarts keep data, missing
tools (and Kafka's jars) name their install command, and `kspout dev up|status|down` work from
a shell."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, Producer, TopicPartition
from kazoo.client import KazooClient

from kspout.devstack import (
    DevStack,
    KafkaBroker,
    PostgresServer,
    StackInfo,
    ZooKeeperServer,
    create_topic,
    load_stack_info,
)
from kspout.devstack.ports import port_open
from kspout.devstack.processes import pid_alive
from kspout.errors import StackError

pytestmark = pytest.mark.integration


def test_message_round_trip_through_the_broker(stack: DevStack, topic_name: str) -> None:
    producer = Producer({"bootstrap.servers": stack.info.brokers})
    delivered: list[Any] = []
    producer.produce(
        topic_name, key=b"k", value=b"hello", on_delivery=lambda e, m: delivered.append(m)
    )
    assert producer.flush(10) == 0
    [message] = delivered
    assert message.error() is None
    assert len(producer.list_topics(topic_name).topics[topic_name].partitions) == 4

    consumer = Consumer(
        {
            "bootstrap.servers": stack.info.brokers,
            "group.id": topic_name,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic_name, message.partition(), message.offset())])
    try:
        got = consumer.poll(10)
    finally:
        consumer.close()
    assert got is not None and got.error() is None
    assert (got.key(), got.value()) == (b"k", b"hello")


def produce_acked(brokers: str, topic: str, values: list[bytes]) -> None:
    """Produce `values` to partition 0, each acknowledged by every in-sync replica."""
    producer = Producer({"bootstrap.servers": brokers, "acks": "all"})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


def read_partition(brokers: str, topic: str, expected: int) -> list[bytes]:
    """The values of partition 0 from offset 0, waiting up to 30 s for `expected` of them."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"read-{uuid.uuid4().hex}"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    found: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(found) < expected and time.monotonic() < deadline:
            found += [m.value() for m in consumer.consume(100, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return found


def test_kafka_stops_kills_and_starts_again_on_its_port_with_its_data(tmp_path: Path) -> None:
    broker = KafkaBroker(tmp_path)
    try:
        broker.start()
        port, first_pid = broker.port, broker.pid
        create_topic(broker.address, "kept", 1)
        produce_acked(broker.address, "kept", [b"before-stop"])
        broker.stop()
        assert not port_open("127.0.0.1", port)
        broker.start()
        produce_acked(broker.address, "kept", [b"before-kill"])
        broker.kill()
        assert first_pid is not None and not pid_alive(first_pid)
        broker.start()  # after a crash: the log is recovered from the data folder
        assert broker.port == port
        values = [b"before-stop", b"before-kill"]
        assert read_partition(broker.address, "kept", expected=2) == values
        assert (tmp_path / "kafka" / "data" / "meta.properties").is_file()
        assert "Kafka Server started" in broker.log_path.read_text()  # log4j2 writes the log
    finally:
        broker.kill()


def test_missing_kafka_jars_name_the_setup_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KSPOUT_KAFKA_LIBS", str(tmp_path / "no-jars"))
    with pytest.raises(StackError, match=r"no-jars; run `bash deploy/setup.sh`"):
        DevStack(tmp_path / "stack", ["kafka"]).start()


def test_zookeeper_answers(zk: KazooClient) -> None:
    path = f"/kspout-test/{uuid.uuid4().hex}"
    zk.create(path, b"v1", makepath=True)
    assert zk.get(path)[0] == b"v1"


def test_redis_answers(redis_client: redis.Redis) -> None:
    assert redis_client.ping()


def test_redis_restarts_on_same_port_with_aof_data(
    stack: DevStack, redis_client: redis.Redis
) -> None:
    key = f"kspout-test:{uuid.uuid4().hex}"
    redis_client.set(key, b"kept")
    port = stack.redis.port
    stack.redis.stop()
    assert not port_open("127.0.0.1", port)
    stack.redis.start()
    assert stack.redis.port == port
    assert redis_client.get(key) == b"kept"  # redis-py reconnects to the same address


def test_zookeeper_survives_sigkill_on_same_port(stack: DevStack, zk: KazooClient) -> None:
    path = f"/kspout-test/{uuid.uuid4().hex}"
    zk.create(path, b"durable", makepath=True)  # acked only once in ZooKeeper's txn log
    address = stack.info.zookeeper
    stack.zookeeper.kill()
    stack.zookeeper.start()
    assert stack.info.zookeeper == address
    assert zk.retry(zk.get, path)[0] == b"durable"


@pytest.mark.parametrize(
    ("component", "install"),
    [
        ("redis", "apt-get install -y redis-server"),
        ("zookeeper", "apt-get install -y openjdk-17-jre-headless"),
    ],
)
def test_missing_binary_names_install_command(tmp_path: Path, component: str, install: str) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    with pytest.raises(StackError, match=install):
        DevStack(tmp_path / "stack", [component], path=str(empty)).start()


def test_missing_pyspark_names_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kspout.devstack.tools.importlib.util.find_spec", lambda name: None)
    with pytest.raises(StackError, match="pip install pyspark"):
        DevStack(tmp_path, ["zookeeper"]).start()


def test_postgres_restarts_with_its_data_and_remove_deletes_it(tmp_path: Path) -> None:
    # tmp_path is under pytest's root-only directory: as root, the server runs as `postgres`
    server = PostgresServer(tmp_path)
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('durable')")
        port = server.port
        server.stop()
        server.start()
        server.kill()  # a crash: the next start recovers from the write-ahead log
        server.start()
        assert server.port == port
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT v FROM kept").fetchall() == [("durable",)]
    finally:
        server.remove()
    assert not server.running and not port_open("127.0.0.1", port)
    server.start()  # afresh
    try:
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT to_regclass('kept')").fetchone() == (None,)
    finally:
        server.remove()


def test_missing_postgres_names_install_command(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    with pytest.raises(StackError, match="apt-get install -y postgresql"):
        PostgresServer(tmp_path, path=str(empty)).start()


def test_start_timeout_reports_log_and_leaves_nothing_running(tmp_path: Path) -> None:
    zookeeper = ZooKeeperServer(tmp_path, start_timeout=0.0)
    with pytest.raises(StackError, match=r"zookeeper did not answer within 0 s; last lines of"):
        zookeeper.start()
    assert zookeeper.pid is not None and not pid_alive(zookeeper.pid)


def kspout(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the `kspout` command in a child interpreter, as a shell would."""
    code = "from kspout.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_cli_up_status_down(tmp_path: Path) -> None:
    workdir = tmp_path / "dev"
    up = kspout("dev", "up", "--dir", str(workdir), "--json")
    try:
        assert up.returncode == 0, up.stderr
        started = json.loads(up.stdout)
        info = StackInfo(**started["info"])
        # The servers outlive the `up` command and answer on the printed addresses.
        assert load_stack_info(workdir) == info
        host, _, port = info.brokers.partition(":")
        assert port_open(host, int(port))
        assert redis.Redis.from_url(info.redis_url).ping()
        zk = KazooClient(hosts=info.zookeeper)
        zk.start(timeout=15)
        zk.stop()
        zk.close()
        assert started["env"]["KSPOUT_ZOOKEEPER"] == info.zookeeper
        assert started["components"]["kafka"]["start_seconds"] > 0
        assert "kafka 4" in kspout("dev", "status", "--dir", str(workdir)).stderr

        again = kspout("dev", "up", "--dir", str(workdir))
        assert again.returncode == 0 and "already up" in again.stderr
        assert again.stdout.strip() == "export " + " ".join(
            f"{k}={v}" for k, v in started["env"].items()
        )

        status = kspout("dev", "status", "--dir", str(workdir), "--json")
        assert status.returncode == 0
        assert json.loads(status.stdout)["up"] is True
    finally:
        down = kspout("dev", "down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    pids = [c["pid"] for c in started["components"].values()]
    assert not any(pid_alive(pid) for pid in pids)
    assert load_stack_info(workdir) is None
    assert kspout("dev", "status", "--dir", str(workdir)).returncode == 1
    assert not workdir.exists()


def test_partial_stack_has_only_its_components(tmp_path: Path) -> None:
    with DevStack(tmp_path, ["kafka", "redis"]) as dev_stack:
        assert dev_stack.info.zookeeper == ""
        assert set(dev_stack.info.env()) == {"KSPOUT_BROKERS", "KSPOUT_REDIS_URL"}
        with pytest.raises(StackError, match="no zookeeper"):
            dev_stack.zookeeper.start()

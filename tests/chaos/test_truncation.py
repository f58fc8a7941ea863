"""An unclean leader election truncates a partition below what kspout handed out and committed,
new messages land at the reused offsets, and kspout processes them: never skips them. So do
`KafkaSpout.foreach_batch` and the streaming source, `readStream.format("kspout")`.

The cluster is three KRaft nodes (every node a controller: with two voters, one down would leave
no quorum to elect anyone), and the topic's one partition lives on two of them, nodes 1 (the
leader) and 2: replication factor 2, `min.insync.replicas=1`,
`unclean.leader.election.enable=true`. The story, as the issue tells it:

1. messages `a` are produced with `acks=all` (both replicas hold them);
2. the follower (node 2) is stopped; messages `b` are produced with `acks=1`: only node 1 has
   them; kspout runs until caught up, so it handed out and committed every `b`;
3. the leader (node 1) is SIGKILLed and the follower started: the controller elects it although
   it is out of sync (unclean; the test asks for the election itself when the controller has not
   within a few seconds), and its log ends where `a` ended;
4. messages `c` are produced: Kafka writes them at the offsets `b` had;
5. kspout runs again until caught up (the stored leader epoch is checked at start), or, in the
   last test, kspout runs through steps 3 and 4 without a restart (the leader's shorter log,
   or the first record of the new epoch, makes the driver check).

The restart tests share one election (the `struck` fixture): before it, the driver
(`KafkaSpout.run`'s loop), a `foreach_batch` run and an `availableNow` streaming query each read
`a` and `b` and stopped; after it, each runs again. Checked against the test's own ledger (the
delivery reports of what it produced, and what the handler or the batch function received,
recorded after it returned): every `c` reached it, none was skipped; kspout's log names the
exact range of replaced offsets with both leader epochs (the streaming source logs in Spark's
planning process, which the test cannot read: its count is checked); the `replaced` count says
how many; the commit point reaches the new high watermark, and the record in ZooKeeper keeps
storm-kafka's fields with the leader epoch beside them.
"""

from __future__ import annotations

import logging
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import (
    ElectionType,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack
from kspout.devstack.kafka_broker import KafkaCluster
from kspout.driver import Driver, Progress
from kspout.executor.local import LocalExecutor
from kspout.kafka.records import Record
from kspout.spout import KafkaSpout
from tests.integration.helpers import FAST_BACKOFF, open_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LEADER, FOLLOWER = 1, 2
A, B, C = 20, 30, 60  # messages produced at each step
ELECTION_WAIT = 20.0  # seconds the controller may take before the test asks for the election
READERS = ("driver", "frames", "stream")  # the restart tests' readers (`struck`)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes; a follower that stops fetching leaves the ISR after 2 s."""
    nodes = KafkaCluster(
        tmp_path_factory.mktemp("truncation-cluster"),
        size=3,
        settings={"replica.lag.time.max.ms": "2000"},
    )
    nodes.start()
    yield nodes
    nodes.stop()


def admin(cluster: KafkaCluster) -> AdminClient:
    """An admin client; keep it in a variable while its futures run (a collected client
    fails them with `_DESTROY`)."""
    return AdminClient({"bootstrap.servers": cluster.brokers, "log_level": 0})


def describe(cluster: KafkaCluster, topic: str) -> tuple[int, list[int]]:
    """Partition 0's leader (-1: none) and in-sync replicas, as Kafka says."""
    client = admin(cluster)
    described = client.describe_topics(TopicCollection([topic]), request_timeout=10)
    partition = described[topic].result(timeout=15).partitions[0]
    leader = -1 if partition.leader is None else partition.leader.id
    return leader, sorted(node.id for node in partition.isr)


def wait_for(what: str, check: Any, timeout: float = 60.0) -> None:
    """Until `check()` holds; a Kafka error (a node just killed, a controller moving) counts
    as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except KafkaException:
            pass
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.5)


def produce(cluster: KafkaCluster, topic: str, prefix: str, n: int, acks: str) -> list[int]:
    """`n` messages `<prefix>-<i>`; their offsets, from the delivery reports."""
    offsets: list[int] = []
    failed: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            offsets.append(msg.offset())

    producer = Producer(
        {"bootstrap.servers": cluster.brokers, "acks": acks, "log_level": 0, "linger.ms": 5}
    )
    for i in range(n):
        producer.produce(topic, f"{prefix}-{i}".encode(), partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0 and not failed, f"produce failed: {failed[:3]}"
    return sorted(offsets)


# What a reader received: (offset, value), recorded after its handler or batch function returned.
Ledger = list[tuple[int, bytes]]


def config_for(
    stack: DevStack, cluster: KafkaCluster, topic: str, reader: str = "driver"
) -> TopicConfig:
    """The topic's config for one reader; each reader has a spout id of its own."""
    return parse_config(
        {
            "topic": topic,
            "spout_id": f"{topic}-{reader}",
            "topology_name": "truncation",
            "zk_root": "/truncation",
            "brokers": cluster.brokers,
            "zookeeper": stack.info.zookeeper,
            "batch_size": 10,
            "retry_backoff": FAST_BACKOFF,
            "infra_backoff": {"initial": 0.2, "multiplier": 2.0, "max": 1.0},
            "commit_interval": 0.2,
            "fetch_timeout": 5.0,
            "kafka": {"log_level": 0},  # clients of the killed node log every reconnect
        }
    )


def run(config: TopicConfig, handled: Ledger) -> Progress:
    """kspout in process, as `kspout run --until-caught-up` runs it; the handler records what
    reached it."""

    def handle(record: Record) -> None:
        assert record.value is not None
        handled.append((record.offset, record.value))

    with Driver(config, LocalExecutor(config, handle)) as driver:
        return driver.run(until_caught_up=True)


def elect_unclean(cluster: KafkaCluster, topic: str) -> None:
    """Wait for the controller to elect the out-of-sync follower; ask for the unclean election
    when it has not within `ELECTION_WAIT` seconds."""
    leads = lambda: describe(cluster, topic)[0] == FOLLOWER  # noqa: E731
    try:
        wait_for("the controller elected the follower", leads, ELECTION_WAIT)
    except AssertionError:
        partition = [TopicPartition(topic, 0)]
        client = admin(cluster)
        try:
            asked = client.elect_leaders(ElectionType.UNCLEAN, partition).result(timeout=30)
        except KafkaException as exc:  # elected meanwhile, or the controller is moving
            asked = exc
        logging.getLogger(__name__).info("unclean election asked for: %s", asked)
        wait_for("the follower leads", leads)


def new_topic(cluster: KafkaCluster) -> str:
    """A topic whose one partition lives on the leader and the follower, both in sync (the
    leader, after a previous test killed it, is started again and catches up)."""
    cluster.start()
    topic = f"trunc-{uuid.uuid4().hex[:8]}"
    settings = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}
    new = NewTopic(topic, 1, replica_assignment=[[LEADER, FOLLOWER]], config=settings)
    client = admin(cluster)
    client.create_topics([new])[topic].result(60)
    wait_for("both replicas are in sync", lambda: describe(cluster, topic) == (LEADER, [1, 2]))
    return topic


def lose_the_leader(cluster: KafkaCluster, topic: str) -> None:
    """Step 3: SIGKILL the leader, start the out-of-sync follower, and see it elected."""
    cluster.node(LEADER).kill()
    cluster.node(FOLLOWER).start()
    elect_unclean(cluster, topic)


def the_story_until_b(cluster: KafkaCluster, topic: str) -> None:
    """Steps 1 and 2 (Kafka's part): `a` on both replicas, `b` on the leader alone."""
    assert produce(cluster, topic, "a", A, "all") == list(range(A))
    cluster.node(FOLLOWER).stop()
    wait_for("the follower left the ISR", lambda: describe(cluster, topic) == (LEADER, [1]))
    assert produce(cluster, topic, "b", B, "1") == list(range(A, A + B))


def produce_c(cluster: KafkaCluster, topic: str) -> None:
    """Step 4: Kafka writes `c` at the offsets `b` had."""
    offsets = produce(cluster, topic, "c", C, "1")
    assert offsets == list(range(A, A + C)), f"`c` is not at the reused offsets: {offsets}"


def frames(spark: SparkSession, config: TopicConfig, seen: Ledger) -> Progress:
    """`KafkaSpout.foreach_batch` until caught up; the batch function records its frame."""

    def f(df: DataFrame, batch_id: int) -> None:
        rows = df.select("offset", "value").collect()
        seen.extend((row.offset, bytes(row.value)) for row in rows)

    return KafkaSpout(config, spark).foreach_batch(f, until_caught_up=True)


def stream_file(path: Path, config: TopicConfig) -> Path:
    """The streaming query's topic file: `config`'s topic, spout id and servers."""
    path.write_text(
        textwrap.dedent(
            f"""\
            topic = "{config.topic}"
            spout_id = "{config.spout_id}"
            topology_name = "truncation"
            zk_root = "/truncation"
            brokers = "{config.brokers}"
            zookeeper = "{config.zookeeper}"

            [kafka]
            log_level = 0
            """
        )
    )
    return path


def stream(spark: SparkSession, toml: Path, checkpoint: Path, seen: Ledger) -> None:
    """One `availableNow` run of the streaming source from `checkpoint`; its `foreachBatch`
    records each batch."""

    def sink(df: DataFrame, batch_id: int) -> None:
        rows = df.select("offset", "value").collect()
        seen.extend((row.offset, bytes(row.value)) for row in rows)

    query = (
        spark.readStream.format("kspout")
        .option("config", str(toml))
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive, "the availableNow run did not end within 120 s"


def every_c_arrived(handled: Ledger) -> None:
    got = {value for _, value in handled}
    missing = [f"c-{i}" for i in range(C) if f"c-{i}".encode() not in got]
    assert not missing, f"messages written at reused offsets never reached the reader: {missing}"


def check_after(handled: Ledger, progress: Progress, caplog: pytest.LogCaptureFixture) -> str:
    """Every `c` reached the handler, the replaced range was logged once and counted; returns
    the warning."""
    every_c_arrived(handled)
    warned = [r.getMessage() for r in caplog.records if "unclean leader election" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert f"offsets {A}-{A + B - 1} were replaced by an unclean leader election" in warned[0]
    assert f"{B} messages handed out before" in warned[0]
    stats = progress.partitions[0].stats
    assert (stats.replaced, stats.lost, stats.skipped) == (B, 0, 0)
    assert (stats.commit_point, stats.emitted_to) == (A + C, A + C)
    return warned[0]


@dataclass(frozen=True)
class Struck:
    """The restart tests' shared election: each reader's config and what it read before."""

    topic: str
    old_epoch: int  # the leader epoch of `b`
    driver: TopicConfig
    frames: TopicConfig
    stream: TopicConfig
    stream_file: Path
    checkpoint: Path
    before: dict[str, Ledger]  # by reader


@pytest.fixture(scope="module")
def struck(
    stack: DevStack, cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Struck:
    """Steps 1 to 4, once, with every reader run to the end of `b` before the election."""
    from kspout.spark import spark_session

    spark = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
    topic = new_topic(cluster)
    configs = {name: config_for(stack, cluster, topic, name) for name in READERS}
    here = tmp_path_factory.mktemp("truncation-stream")
    toml = stream_file(here / "stream.toml", configs["stream"])
    the_story_until_b(cluster, topic)
    before: dict[str, Ledger] = {name: [] for name in READERS}
    run(configs["driver"], before["driver"])
    frames(spark, configs["frames"], before["frames"])
    stream(spark, toml, here / "checkpoint", before["stream"])
    with open_store(configs["driver"]) as store:
        record = store.read(0)
    assert record is not None and record.leader_epoch is not None
    lose_the_leader(cluster, topic)
    produce_c(cluster, topic)
    return Struck(
        topic,
        record.leader_epoch[1],
        configs["driver"],
        configs["frames"],
        configs["stream"],
        toml,
        here / "checkpoint",
        before,
    )


def read_a_and_b(struck: Struck, reader: str, config: TopicConfig) -> None:
    """Before the election, `reader` received `a` and `b` and committed past them with the
    leader epoch of `b` beside the offset."""
    assert sorted(offset for offset, _ in struck.before[reader]) == list(range(A + B))
    with open_store(config) as store:
        record = store.read(0)
    assert record is not None and record.offset == A + B
    if reader != "stream":  # a stream's epochs are in its checkpoint, not in the ZooKeeper copy
        assert record.leader_epoch == (A + B, struck.old_epoch)


def check_record(config: TopicConfig, old_epoch: int) -> None:
    """The record in ZooKeeper is at the new high watermark, with a newer leader epoch beside
    storm-kafka's fields."""
    with open_store(config) as store:
        record = store.read(0)
    assert record is not None and record.offset == A + C
    assert record.leader_epoch is not None and record.leader_epoch[1] > old_epoch
    assert {"topology", "offset", "partition", "broker", "topic"} <= set(record.data)


@pytest.mark.timeout(420)
def test_a_restart_after_an_unclean_election_processes_the_new_messages(
    struck: Struck, caplog: pytest.LogCaptureFixture
) -> None:
    """kspout is down while the election happens: the stored leader epoch is checked at start."""
    read_a_and_b(struck, "driver", struck.driver)
    second: Ledger = []
    with caplog.at_level(logging.WARNING, "kspout"):
        progress = run(struck.driver, second)
    warning = check_after(second, progress, caplog)
    assert f"(leader epoch {struck.old_epoch} -> " in warning
    assert sorted(offset for offset, _ in second) == list(range(A, A + C))  # `a` not again
    check_record(struck.driver, struck.old_epoch)


@pytest.mark.timeout(420)  # with `struck` when run alone
def test_foreach_batch_after_an_unclean_election_processes_the_new_messages(
    struck: Struck, caplog: pytest.LogCaptureFixture
) -> None:
    """The frames' fetches told the driver the leader epoch of `b`, which it stored; the start
    after the election checks it. Without it, the commit point (50) lies inside the new log
    (80): `c` at 20..49 would be skipped unseen."""
    from pyspark.sql import SparkSession

    read_a_and_b(struck, "frames", struck.frames)
    spark = SparkSession.getActiveSession()
    assert spark is not None
    second: Ledger = []
    with caplog.at_level(logging.WARNING, "kspout"):
        progress = frames(spark, struck.frames, second)
    check_after(second, progress, caplog)
    assert sorted(offset for offset, _ in second) == list(range(A, A + C))
    check_record(struck.frames, struck.old_epoch)


@pytest.mark.timeout(420)  # with `struck` when run alone
def test_a_streaming_query_after_an_unclean_election_reads_the_new_messages(
    struck: Struck,
) -> None:
    """The checkpoint keeps the leader epoch beside the offset of `b`'s end; the query started
    again from it checks the epoch and reads from where the logs part, at 20, not from 50."""
    from pyspark.sql import SparkSession

    read_a_and_b(struck, "stream", struck.stream)
    spark = SparkSession.getActiveSession()
    assert spark is not None
    second: Ledger = []
    stream(spark, struck.stream_file, struck.checkpoint, second)
    every_c_arrived(second)
    assert sorted(offset for offset, _ in second) == list(range(A, A + C))
    with open_store(struck.stream) as store:
        record = store.read(0)
    assert record is not None and record.offset == A + C
    assert record.data["kspout"].get("replaced") == B and "lost" not in record.data["kspout"]


@pytest.mark.timeout(420)
def test_a_running_driver_processes_the_new_messages_after_an_unclean_election(
    stack: DevStack, cluster: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """kspout runs through the election: the leader's shorter log, or the first record of the
    new epoch, makes the driver check the leader epoch of what it fetched."""
    topic = new_topic(cluster)
    config = config_for(stack, cluster, topic)
    the_story_until_b(cluster, topic)
    handled: Ledger = []
    stop = threading.Event()
    outcome: list[Progress | BaseException] = []

    def handle(record: Record) -> None:
        assert record.value is not None
        handled.append((record.offset, record.value))

    def drive() -> None:
        try:
            with Driver(config, LocalExecutor(config, handle)) as driver:
                outcome.append(driver.run(stop=stop))
        except BaseException as exc:  # shown by the test below
            outcome.append(exc)

    thread = threading.Thread(target=drive, name="truncation-driver", daemon=True)
    with caplog.at_level(logging.WARNING, "kspout"):
        thread.start()
        wait_for("`b` was handled", lambda: len(handled) >= A + B or bool(outcome))
        lose_the_leader(cluster, topic)
        produce_c(cluster, topic)
        c_values = {f"c-{i}".encode() for i in range(C)}
        wait_for(
            "every `c` was handled",
            lambda: c_values <= {value for _, value in handled} or bool(outcome),
            120.0,
        )
        stop.set()
        thread.join(60)
    assert not thread.is_alive(), "the driver did not stop"
    assert len(outcome) == 1 and isinstance(outcome[0], Progress), outcome
    check_after(handled, outcome[0], caplog)

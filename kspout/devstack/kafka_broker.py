"""Apache Kafka's own broker on loopback, in KRaft mode (broker and controller in one JVM, no
ZooKeeper for Kafka), and a cluster of such brokers for replication and failover.

A broker lives in `<workdir>/kafka/` (or `<workdir>/node<i>/kafka/` in a cluster): its
`server.properties`, `log4j2.properties`, data folder and `kafka.log` (stdout, where log4j2
writes). The first start formats the data folder with Kafka's storage tool; a later start, after
`stop()` or `kill()`, finds it formatted and comes back on the same ports with its data.

Topics are not created on first use by the tests' producers alone: the broker keeps Kafka's
default `auto.create.topics.enable=true` (a dead-letter topic appears as it would on a default
cluster) with one partition, and tests create their topics through the admin API with the
partitions and configs each needs.
"""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kspout.devstack.components import START_TIMEOUT, Component
from kspout.devstack.ports import LOOPBACK, free_port
from kspout.devstack.processes import GRACE, log_tail
from kspout.devstack.tools import find_java, kafka_classpath
from kspout.devstack.topics import create_topic
from kspout.errors import StackError

HEAP = ["-Xms256m", "-Xmx768m"]  # a dev broker on a 2-core, 24 GiB machine: room, not a lot
JVM_FLAGS = [  # Kafka's own defaults (kafka-run-class.sh), less its 1 GiB heap
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-Djava.awt.headless=true",
]
STARTED = "Kafka Server started"  # KafkaRaftServer logs it once the broker serves clients

# The broker's log: warnings and up, plus the line that says it started.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""

# Settings for a small local cluster; `settings=` on a broker or cluster adds or replaces any.
DEFAULTS: dict[str, str] = {
    "process.roles": "broker,controller",
    "inter.broker.listener.name": "PLAINTEXT",
    "controller.listener.names": "CONTROLLER",
    "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
    "num.partitions": "1",
    "offsets.topic.num.partitions": "2",  # 50 by default: seconds of start-up for nothing
    "group.initial.rebalance.delay.ms": "0",
    "num.network.threads": "2",  # two cores
    "num.io.threads": "4",
    # A restarted node waits for its previous registration to lapse, and a dead node keeps
    # leading its partitions until it does: 6 s instead of 9, with heartbeats to match.
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    "log.cleaner.backoff.ms": "1000",  # compacted test topics are cleaned within seconds
    "log.cleaner.dedupe.buffer.size": "16777216",  # the cleaner's 128 MB buffer is heap here
}


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding, as Kafka's
    `Uuid.randomUuid()` makes them (never starting with '-', which its tools reject)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


class KafkaBroker(Component):
    """One KRaft node, broker and controller in one process.

    Alone it is its own single-voter quorum; `KafkaCluster` makes several share one. Its ports
    (client and controller) are picked on the first start and kept.
    """

    name = "kafka"

    def __init__(
        self,
        workdir: Path,
        *,
        node_id: int = 1,
        settings: Mapping[str, str] | None = None,
        path: str | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        super().__init__(workdir, path=path, start_timeout=start_timeout)
        self.node_id = node_id
        self.settings = dict(settings or {})
        self.cluster_id = new_cluster_id()
        self._voters: str | None = None  # set by a cluster; else this node alone
        self._controller_port: int | None = None
        self._log_start = 0  # where this start's lines begin in the log

    @property
    def controller_port(self) -> int:
        if self._controller_port is None:
            raise StackError(f"{self.name} node {self.node_id} has not been started")
        return self._controller_port

    @property
    def voter(self) -> str:
        """`id@host:port` of this node's controller, as `controller.quorum.voters` lists it."""
        return f"{self.node_id}@{LOOPBACK}:{self.controller_port}"

    def reserve_ports(self) -> None:
        """Pick the client and controller ports, once."""
        if self._port is None:
            self._port = free_port()
        if self._controller_port is None:
            self._controller_port = free_port()

    def join(self, voters: str, cluster_id: str) -> None:
        """Make this node one voter of a quorum (before its first start)."""
        self._voters = voters
        self.cluster_id = cluster_id

    def server_properties(self) -> dict[str, str]:
        """The node's `server.properties`, defaults first, then this stack's `settings`."""
        self.reserve_ports()
        listeners = (
            f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}"
        )
        return {
            **DEFAULTS,
            "node.id": str(self.node_id),
            "controller.quorum.voters": self._voters or self.voter,
            "listeners": listeners,
            "advertised.listeners": listeners,
            "log.dirs": str(self.home / "data"),
            **self._replication_defaults(),
            **self.settings,
        }

    def _replication_defaults(self) -> dict[str, str]:
        """Replication of Kafka's internal topics: 1 alone (the defaults of 3 would never be
        met), else up to 3 copies with 2 in sync, as on a production cluster."""
        voters = 1 if self._voters is None else self._voters.count("@")
        copies, in_sync = str(min(voters, 3)), str(min(voters, 2))
        return {
            "offsets.topic.replication.factor": copies,
            "transaction.state.log.replication.factor": copies,
            "transaction.state.log.min.isr": in_sync,
            "share.coordinator.state.topic.replication.factor": copies,
            "share.coordinator.state.topic.min.isr": in_sync,
        }

    def _command(self) -> list[str]:
        java = find_java(self._path)
        classpath = kafka_classpath()
        properties = self.home / "server.properties"
        properties.write_text(
            "".join(f"{key}={value}\n" for key, value in self.server_properties().items())
        )
        log4j = self.home / "log4j2.properties"
        log4j.write_text(LOG4J2)
        jvm = [java, *HEAP, *JVM_FLAGS, f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
        if not (self.home / "data" / "meta.properties").exists():
            self._format(jvm, properties)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        return [*jvm, "kafka.Kafka", str(properties)]

    def _format(self, jvm: list[str], properties: Path) -> None:
        """Format the data folder for this node's cluster (Kafka's storage tool)."""
        argv = [*jvm, "kafka.tools.StorageTool", "format", "-t", self.cluster_id]
        argv += ["-c", str(properties), *self._format_options()]
        with self.log_path.open("ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.home)
        if done.returncode != 0:
            raise StackError(
                f"Kafka's storage tool could not format {self.home / 'data'} (exit "
                f"{done.returncode}); last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            )

    def _format_options(self) -> list[str]:
        """More options for the storage tool's `format` (none: a plain node)."""
        return []

    def _ready(self) -> bool:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_start)
                return STARTED.encode() in log.read()
        except FileNotFoundError:
            return False


class KafkaCluster:
    """`size` KRaft nodes on loopback that form one quorum (a static voter list) and one
    cluster; every node is a broker and a controller, so it keeps serving while a majority
    runs. Node `i` (from 1) lives in `<workdir>/node<i>/kafka/`; `node(i)` is its handle, to
    stop, kill, freeze or start it again."""

    def __init__(
        self,
        workdir: Path,
        size: int = 3,
        *,
        settings: Mapping[str, str] | None = None,
        path: str | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, got {size}")
        self.nodes = [
            KafkaBroker(
                workdir / f"node{i}",
                node_id=i,
                settings=settings,
                path=path,
                start_timeout=start_timeout,
            )
            for i in range(1, size + 1)
        ]
        for node in self.nodes:
            node.reserve_ports()
        voters = ",".join(node.voter for node in self.nodes)
        cluster_id = new_cluster_id()
        for node in self.nodes:
            node.join(voters, cluster_id)

    @property
    def brokers(self) -> str:
        """The bootstrap list: every node's `host:port`."""
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> KafkaBroker:
        """The handle of node `node_id` (Kafka's broker id, from 1)."""
        return self.nodes[node_id - 1]

    def create_topic(self, topic: str, placement: Sequence[int], **kwargs: Any) -> None:
        """`create_topic` on this cluster: partition `p` on node `placement[p]` alone."""
        create_topic(self.brokers, topic, placement=placement, **kwargs)

    def start(self) -> None:
        """Start every node that is not running, and return once all serve (they wait for a
        quorum, so all are launched before any is waited for)."""
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.await_ready()

    def stop(self, grace: float = GRACE) -> None:
        """Stop every node: all are asked at once (one by one, the last would wait for a
        quorum that has gone), then each is waited for."""
        for node in self.nodes:
            if node.running:
                node.terminate()
        for node in reversed(self.nodes):
            node.stop(grace)

    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

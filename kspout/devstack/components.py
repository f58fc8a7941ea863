"""The three servers of the dev stack, each a handle that can start, stop, kill and restart it.

States of a handle, and why it moves:

* new — nothing runs, no port yet; `start()` picks a free loopback port and starts the server;
* running — `stop()` (SIGTERM, then SIGKILL after a grace period) or `kill()` (SIGKILL, a crash)
  make it stopped;
* stopped — `start()` runs the server again on the same port with the same data directory, so
  ZooKeeper and Redis (AOF) come back with their data. The mock Kafka cannot: it keeps data in
  memory, so it restarts empty and librdkafka gives it a new port.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Literal

import redis

from kspout.devstack.ports import LOOPBACK, free_port, port_open
from kspout.devstack.processes import GRACE, spawn, start_time, stop_pid, wait_ready
from kspout.devstack.state import ComponentState
from kspout.devstack.tools import REDIS_INSTALL, find_binary, find_java, zookeeper_classpath
from kspout.errors import StackError

START_TIMEOUT = (
    60.0  # seconds; ZooKeeper's JVM needs ~1.5 s on an idle machine, far more on a busy CI
)


class Component(ABC):
    """One server process, living in `<workdir>/<name>/` (its data and `<name>.log`)."""

    name: ClassVar[str]

    def __init__(
        self, workdir: Path, *, path: str | None = None, start_timeout: float = START_TIMEOUT
    ) -> None:
        self.home = workdir / self.name
        self._path = path
        self._start_timeout = start_timeout
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def port(self) -> int:
        if self._port is None:
            raise StackError(f"{self.name} has not been started")
        return self._port

    @property
    def address(self) -> str:
        """`host:port` clients connect to."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server (a no-op if it runs) and return once it answers."""
        if self.running:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        process = spawn(self._command(), self.log_path, self.home)
        self._process = process
        try:
            wait_ready(
                process,
                self._ready,
                what=self.name,
                log_path=self.log_path,
                timeout=self._start_timeout,
            )
        except StackError:
            self.kill()
            raise

    def stop(self, grace: float = GRACE) -> None:
        """Stop the server: SIGTERM, then SIGKILL if it still runs after `grace` seconds."""
        if self._process is not None:
            stop_pid(self._process.pid, grace)
            self._process.wait()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        self.stop(grace=0)

    def state(self) -> ComponentState:
        """What `kspout dev status|down` need to find this server again from another process."""
        pid = self.pid
        if pid is None:
            raise StackError(f"{self.name} has not been started")
        return ComponentState(
            pid=pid,
            started=start_time(pid),
            address=self.address,
            port=self.port,
            log=str(self.log_path),
        )

    @abstractmethod
    def _command(self) -> list[str]:
        """The server's argv; picks the port on the first start."""

    @abstractmethod
    def _ready(self) -> bool:
        """True once the server answers clients."""


class KafkaMock(Component):
    """librdkafka's mock cluster, hosted by `python -m kspout.devstack.mock_kafka`."""

    name = "kafka"

    @property
    def _address_file(self) -> Path:
        return self.home / "address.json"

    def _command(self) -> list[str]:
        self._address_file.unlink(missing_ok=True)  # a restart gets a new port
        self._port = None
        return [
            sys.executable,
            "-m",
            "kspout.devstack.mock_kafka",
            "--address-file",
            str(self._address_file),
        ]

    def _ready(self) -> bool:
        if self._port is None:
            try:
                brokers = json.loads(self._address_file.read_text())["brokers"]
            except FileNotFoundError:
                return False
            self._port = int(brokers.rpartition(":")[2])
        return port_open(LOOPBACK, self._port)


class ZooKeeperServer(Component):
    """ZooKeeper's standalone server, from the jars in the pyspark wheel, on a loopback port."""

    name = "zookeeper"

    def _command(self) -> list[str]:
        java = find_java(self._path)
        classpath = zookeeper_classpath()
        if self._port is None:
            self._port = free_port()
        config = self.home / "zoo.cfg"
        config.write_text(
            "tickTime=2000\n"
            f"dataDir={self.home / 'data'}\n"
            f"clientPort={self._port}\n"
            f"clientPortAddress={LOOPBACK}\n"
        )
        return [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",  # a small heap and few threads: this server holds a few znodes
            "-Dzookeeper.admin.enableServer=false",  # else it also listens on port 8080
            "-cp",
            classpath,
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(config),
        ]

    def _ready(self) -> bool:
        # `srvr` is the one four-letter command enabled by default; it answers with the version
        # only once the server serves requests.
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as sock:
                sock.sendall(b"srvr")
                return sock.recv(64).startswith(b"Zookeeper version")
        except OSError:
            return False


class RedisServer(Component):
    """`redis-server` on a loopback port, append-only file on by default (for durability)."""

    name = "redis"

    def __init__(
        self,
        workdir: Path,
        *,
        path: str | None = None,
        start_timeout: float = START_TIMEOUT,
        appendonly: bool = True,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
    ) -> None:
        super().__init__(workdir, path=path, start_timeout=start_timeout)
        self.appendonly = appendonly
        self.appendfsync = appendfsync  # "always" survives SIGKILL without losing a write

    @property
    def url(self) -> str:
        return f"redis://{self.address}/0"

    def _command(self) -> list[str]:
        binary = find_binary("redis-server", REDIS_INSTALL, self._path)
        if self._port is None:
            self._port = free_port()
        return [
            binary,
            "--port",
            str(self._port),
            "--bind",
            LOOPBACK,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--dir",
            str(self.home),
        ]

    def _ready(self) -> bool:
        client = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1.0)
        try:
            return bool(client.ping())
        except redis.RedisError:  # includes "LOADING" while it replays the AOF
            return False
        finally:
            client.close()

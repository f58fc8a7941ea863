"""The servers of the dev stack, each a handle that can start, stop, kill and restart it.

States of a handle, and why it moves:

* new — nothing runs, no port yet; `start()` picks a free loopback port and starts the server;
* running — `stop()` (SIGTERM, then SIGKILL after a grace period) or `kill()` (SIGKILL, a crash)
  make it stopped;
* stopped — `start()` runs the server again on the same port with the same data directory, so
  ZooKeeper and Redis (AOF) come back with their data. The mock Kafka cannot: it keeps data in
  memory, so it restarts empty and librdkafka gives it a new port. PostgreSQL keeps its data
  until `remove()` deletes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Literal

import redis

from kspout.devstack.ports import LOOPBACK, free_port, port_open
from kspout.devstack.processes import GRACE, log_tail, spawn, start_time, stop_pid, wait_ready
from kspout.devstack.state import ComponentState
from kspout.devstack.tools import (
    REDIS_INSTALL,
    find_binary,
    find_java,
    find_postgres_bin,
    zookeeper_classpath,
)
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


POSTGRES_USER = "postgres"  # the unprivileged user Debian's package creates; used when root
SETPRIV_INSTALL = "apt-get install -y util-linux"


class PostgresServer(Component):
    """PostgreSQL (Debian's server binaries) on a loopback port, superuser `postgres`, trust
    authentication, TCP only.

    PostgreSQL refuses to run as root: a root process runs `initdb` and the server as the
    `postgres` system user (through `setpriv`, which execs, so the handle's pid is the
    postmaster's). That user must reach the data directory, and a workdir under a root-only
    directory (pytest's temporary directories) is not reachable: so the data directory is a fresh
    one in the system's temporary directory, made by the first `start()` and deleted by
    `remove()`; the workdir keeps the log. `fsync=off`: a crash of the server loses nothing
    (writes are in the OS's cache), only a crash of the machine would, and this server's data
    is disposable.
    """

    name = "postgres"

    def __init__(
        self, workdir: Path, *, path: str | None = None, start_timeout: float = START_TIMEOUT
    ) -> None:
        super().__init__(workdir, path=path, start_timeout=start_timeout)
        self._data: Path | None = None

    @property
    def url(self) -> str:
        """A libpq connection URI for the superuser's `postgres` database."""
        return f"postgresql://{POSTGRES_USER}@{self.address}/postgres"

    def stop(self, grace: float = GRACE) -> None:
        """Fast shutdown (SIGINT: sessions end, a checkpoint is written), then SIGKILL what is
        left after `grace` seconds; `grace=0` kills at once, as a crash would."""
        process = self._process
        if process is not None and grace > 0 and process.poll() is None:
            process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace)
        super().stop(grace=0)

    def remove(self, grace: float = GRACE) -> None:
        """Stop the server and delete its data directory; the next start begins afresh."""
        self.stop(grace)
        if self._data is not None:
            shutil.rmtree(self._data, ignore_errors=True)
            self._data = None

    def _command(self) -> list[str]:
        binaries = find_postgres_bin(self._path)
        if self._data is None:
            self._data = self._init_data(binaries / "initdb")
        if self._port is None:
            self._port = free_port()
        return [
            *self._as_server_user(),
            str(binaries / "postgres"),
            "-D",
            str(self._data),
            "-p",
            str(self._port),
            "-c",
            f"listen_addresses={LOOPBACK}",
            "-c",
            "unix_socket_directories=",  # TCP only: no socket file in a shared directory
            "-c",
            "fsync=off",
        ]

    def _init_data(self, initdb: Path) -> Path:
        """A fresh data directory, owned by the server's user, initialised by `initdb`."""
        data = Path(tempfile.mkdtemp(prefix="kspout-postgres-"))
        user = _server_user()
        if user is not None:
            os.chown(data, user.pw_uid, user.pw_gid)
        argv = [
            *self._as_server_user(),
            str(initdb),
            "-D",
            str(data),
            f"--username={POSTGRES_USER}",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]
        with self.log_path.open("ab") as log:
            done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=data)
        if done.returncode != 0:
            shutil.rmtree(data, ignore_errors=True)
            raise StackError(
                f"initdb exited with code {done.returncode}; last lines of {self.log_path}:\n"
                f"{log_tail(self.log_path)}"
            )
        return data

    def _as_server_user(self) -> list[str]:
        """The argv prefix that runs a command as the server's user (empty unless root)."""
        user = _server_user()
        if user is None:
            return []
        setpriv = find_binary("setpriv", SETPRIV_INSTALL, self._path)
        return [
            setpriv,
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--clear-groups",
            "--",
        ]

    def _ready(self) -> bool:
        # The postmaster writes its pid on line 1 of postmaster.pid and "ready" on line 8 once
        # it accepts connections (what `pg_ctl -w` waits for); a stale file names another pid.
        assert self._data is not None
        try:
            lines = (self._data / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) >= 8 and lines[0] == str(self.pid) and lines[7].strip() == "ready"


def _server_user() -> pwd.struct_passwd | None:
    """The user PostgreSQL runs as: None (this process's own) unless this process is root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(POSTGRES_USER)
    except KeyError:
        raise StackError(
            f"PostgreSQL refuses to run as root and there is no {POSTGRES_USER!r} user to run it "
            f"as; install Debian's package (`apt-get install -y postgresql`) or create the user "
            f"(`useradd --system {POSTGRES_USER}`)"
        ) from None

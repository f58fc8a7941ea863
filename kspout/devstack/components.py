"""The servers of the dev stack, each a handle that can start, stop, kill and restart it.

States of a handle, and why it moves:

* new — nothing runs, no port yet; `start()` picks a free loopback port and starts the server;
* running — `stop()` (SIGTERM, then SIGKILL after a grace period) or `kill()` (SIGKILL, a crash)
  make it stopped;
* stopped — `start()` runs the server again on the same port with the same data directory, so
  Kafka, ZooKeeper and Redis (AOF) come back with their data. PostgreSQL keeps its data until
  `remove()` deletes it.

`freeze()` and `thaw()` stop and continue a running server's process (SIGSTOP, SIGCONT), for
tests of a server that hangs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Literal

from kspout.devstack.ports import LOOPBACK, free_port
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
        self.start_seconds: float | None = None  # how long the last `start()` took

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
        began = time.monotonic()
        self.launch()
        self.await_ready()
        self.start_seconds = time.monotonic() - began

    def launch(self) -> None:
        """Start the server's process without waiting for it to answer (a no-op if it runs):
        the nodes of a cluster answer only once enough of them run."""
        if self.running:
            return
        self.home.mkdir(parents=True, exist_ok=True)
        self._process = spawn(self._command(), self.log_path, self.home)

    def await_ready(self) -> None:
        """Return once the launched server answers; kill it and raise `StackError` (with its
        log's tail) if it exits or does not answer within the start timeout."""
        if self._process is None:
            raise StackError(f"{self.name} has not been launched")
        try:
            wait_ready(
                self._process,
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

    def terminate(self) -> None:
        """SIGTERM the server without waiting for it to exit (`stop()` waits)."""
        self._signal(signal.SIGTERM)

    def freeze(self) -> None:
        """SIGSTOP the server: it holds its connections and answers nothing, as a hung process
        (a long GC pause, a stalled disk) would, until `thaw()`."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server: it goes on where it stopped."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: signal.Signals) -> None:
        if not self.running:
            raise StackError(f"{self.name} is not running")
        assert self._process is not None
        self._process.send_signal(signum)

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
            start_seconds=self.start_seconds,
        )

    @abstractmethod
    def _command(self) -> list[str]:
        """The server's argv; picks the port on the first start."""

    @abstractmethod
    def _ready(self) -> bool:
        """True once the server answers clients."""


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
    """`redis-server` on a loopback port, append-only file on by default (for durability).

    With `cluster_enabled`, a Redis Cluster node (its cluster bus on a port of its own, its
    cluster state in `nodes.conf` beside its data); `RedisClusterServers` makes a cluster of
    such nodes.
    """

    name = "redis"

    def __init__(
        self,
        workdir: Path,
        *,
        path: str | None = None,
        start_timeout: float = START_TIMEOUT,
        appendonly: bool = True,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        cluster_enabled: bool = False,
    ) -> None:
        super().__init__(workdir, path=path, start_timeout=start_timeout)
        self.appendonly = appendonly
        self.appendfsync = appendfsync  # "always" survives SIGKILL without losing a write
        self.cluster_enabled = cluster_enabled
        self._bus_port: int | None = None

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
            *self._cluster_options(),
        ]

    @property
    def bus_port(self) -> int | None:
        """A cluster node's cluster bus port (None for a plain server, or before its start)."""
        return self._bus_port

    def _cluster_options(self) -> list[str]:
        """The options of a cluster node (none otherwise). The bus gets a port of its own: the
        default, the port + 10000, may be taken or past 65535."""
        if not self.cluster_enabled:
            return []
        if self._bus_port is None:
            self._bus_port = free_port()
        return [
            "--cluster-enabled",
            "yes",
            "--cluster-port",
            str(self._bus_port),
            "--cluster-config-file",
            str(self.home / "nodes.conf"),
            "--cluster-node-timeout",
            "2000",
        ]

    def _ready(self) -> bool:
        # redis-py is imported where a server is spoken to: every `kspout` command imports the
        # dev stack (for --dev), and only those that start one may load a Redis client.
        import redis

        client = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1.0)
        try:
            return bool(client.ping())
        except redis.RedisError:  # includes "LOADING" while it replays the AOF
            return False
        finally:
            client.close()


class RedisClusterServers:
    """A Redis Cluster of `masters` local `redis-server --cluster-enabled yes` nodes, no replicas.

    `start()` starts the nodes (each in `<workdir>/node<i>/redis/`) and, the first time, gives
    each an equal range of the 16384 slots (CLUSTER ADDSLOTSRANGE) and introduces them to each
    other (CLUSTER MEET), then waits until every node reports `cluster_state:ok` and knows them
    all. A node's `nodes.conf` keeps its slots, so a node stopped and started again rejoins with
    them. Done by hand rather than with `redis-cli --cluster create`, which wants 3 masters.
    """

    SLOTS = 16384

    def __init__(
        self, workdir: Path, masters: int, *, path: str | None = None, appendonly: bool = True
    ) -> None:
        if masters < 1:
            raise ValueError(f"a cluster needs at least one master, got {masters}")
        self.nodes = [
            RedisServer(
                workdir / f"node{i}", path=path, appendonly=appendonly, cluster_enabled=True
            )
            for i in range(masters)
        ]
        self._formed = False

    @property
    def url(self) -> str:
        """A `redis://` URL of one node, enough for a cluster client to find the others."""
        return f"redis://{self.nodes[0].address}/0"

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the nodes (a no-op for those running); return once the cluster serves."""
        for node in self.nodes:
            node.start()
        if not self._formed:
            self._form()
            self._formed = True
        self._wait_ok(timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after the grace period)."""
        for node in self.nodes:
            node.stop()

    def _form(self) -> None:
        """Give each node its slot range and make them meet."""
        import redis  # here, not at the top: see `RedisServer._ready`

        first = self.nodes[0]
        share = -(-self.SLOTS // len(self.nodes))  # slots per node, rounded up
        for i, node in enumerate(self.nodes):
            with redis.Redis(host=LOOPBACK, port=node.port) as client:
                low, high = i * share, min(self.SLOTS, (i + 1) * share) - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
                if node is not first:
                    client.execute_command("CLUSTER", "MEET", LOOPBACK, first.port, first.bus_port)

    def _wait_ok(self, timeout: float) -> None:
        """Wait until every node sees the whole cluster, all slots served."""
        deadline = time.monotonic() + timeout
        while not all(self._node_ok(node) for node in self.nodes):
            if time.monotonic() > deadline:
                raise StackError(
                    f"the Redis Cluster of {len(self.nodes)} nodes was not ok after {timeout:g} "
                    f"s; logs in {self.nodes[0].home.parent.parent}"
                )
            time.sleep(0.1)

    def _node_ok(self, node: RedisServer) -> bool:
        """True if `node` reports the cluster ok and knows every node."""
        import redis  # here, not at the top: see `RedisServer._ready`

        try:
            with redis.Redis(host=LOOPBACK, port=node.port, socket_timeout=1.0) as client:
                info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError:
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
        return (
            fields.get("cluster_state") == "ok"
            and fields.get("cluster_known_nodes") == str(len(self.nodes))
            and fields.get("cluster_slots_ok") == str(self.SLOTS)
        )


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

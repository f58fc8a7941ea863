"""A real Spark standalone cluster on loopback: one master and one worker, from the pyspark wheel.

`local[*]` runs executors inside the driver's JVM and Python workers as its children; the
standalone cluster is the smallest setup where executors are separate JVMs started by a worker,
as on a production cluster, so closures must pickle and executor code must import on its own.

Both daemons start through the wheel's `bin/spark-class` (the script Spark's own `sbin/` uses),
with `SPARK_HOME` set to the pyspark package: spark-class asks Spark's launcher for the exact JVM
command (module options for Java 17+, classpath) and `exec`s it, so the pid we hold is the JVM's.
Each daemon leads its own session; executors the worker starts join the worker's process group,
so stopping the worker's group stops them too.

States of a handle, and why it moves:

* new — nothing runs, no port yet; `start()` picks four free loopback ports (master RPC, master
  web UI, worker RPC, worker web UI), starts the master, then the worker, and returns once the
  master lists the worker as alive;
* running — `stop()` (SIGTERM, then SIGKILL after a grace period) or `kill()` (SIGKILL at once)
  stop the worker with its executors, then the master;
* stopped — `stop()` again is a no-op; `start()` runs both again on the same ports (a standalone
  master keeps no state, so the new cluster is empty).

Python on the executors: the interpreter that runs Spark's Python workers is chosen by the
*driver* (`spark.pyspark.python`, else its `PYSPARK_PYTHON`, else `python3` from PATH) and shipped
with each task. The worker's environment here has `PYSPARK_PYTHON=sys.executable` too, and
executors inherit it, but a SparkSession should still set `spark.pyspark.python`: `session_conf()`
gives the settings to use.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from kspout.devstack.ports import LOOPBACK, free_port
from kspout.devstack.processes import GRACE, log_tail, stop_pid, wait_ready
from kspout.devstack.tools import PYSPARK_INSTALL, find_java
from kspout.errors import StackError
from kspout.lifecycle import Lifecycle

START_TIMEOUT = 90.0  # seconds; each daemon's JVM needs ~2-4 s idle, far more on a busy 2-core CI
DAEMON_MEMORY = "256m"  # heap of the master and the worker JVMs (Spark's default is 1g): they
# only keep the cluster's bookkeeping; executors get their own heap (`spark.executor.memory`)
MEMORY = re.compile(r"[0-9]+[kmgt]?b?", re.IGNORECASE)  # "512m", "1g": what the JVM and Spark take
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The pyspark package directory, which is a complete `SPARK_HOME` (`bin/`, `jars/`).

    Found through the import system without importing pyspark.
    """
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        home = Path(location)
        if (home / "bin" / "spark-class").is_file() and any(home.glob("jars/spark-core_*.jar")):
            return home
    raise StackError(
        f"Spark's launcher (bin/spark-class and jars/) was not found in the pyspark package; "
        f"install it with `{PYSPARK_INSTALL}`"
    )


class _Daemon:
    """One Spark daemon process, its log at `<home>/<name>.log`."""

    def __init__(self, name: str, home: Path) -> None:
        self.name = name
        self.home = home
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start `argv` in a new session with `env`, stdout and stderr appended to the log."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.home,
                env=env,
                start_new_session=True,
            )
        return self.process

    def stop(self, grace: float) -> None:
        """Stop the daemon's process group; a no-op if it was never started or already stopped."""
        process, self.process = self.process, None
        if process is not None:
            stop_pid(process.pid, grace)
            process.wait()


class SparkStandalone(Lifecycle):
    """A Spark standalone master and `workers` workers (one by default) on loopback ports,
    living in `workdir`; each worker offers `cores` cores and `memory`.

    `workdir/master/master.log` and `workdir/worker/worker.log` are the daemons' logs (further
    workers: `worker-2/`, ...); a worker keeps each application's executor logs under
    `<its dir>/work/<app>/<executor>/` and its scratch space under `<its dir>/local/`.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        cores: int = 2,
        memory: str = "1g",
        workers: int = 1,
        daemon_memory: str = DAEMON_MEMORY,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        for what, value in (("memory", memory), ("daemon_memory", daemon_memory)):
            if not MEMORY.fullmatch(value):
                raise ValueError(f"{what} {value!r} is not a size in Spark's syntax, e.g. '1g'")
        self.workdir = workdir
        self.cores = cores
        self.memory = memory  # what the worker offers to executors, in Spark's syntax ("1g")
        self.daemon_memory = daemon_memory
        self._start_timeout = start_timeout
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._master = _Daemon("master", workdir / "master")
        self._workers = [
            _Daemon("worker", workdir / ("worker" if i == 0 else f"worker-{i + 1}"))
            for i in range(workers)
        ]
        self._ports: dict[str, int] = {}

    # -- addresses ---------------------------------------------------------------------------

    def _port(self, name: str) -> int:
        try:
            return self._ports[name]
        except KeyError:
            raise StackError("the Spark cluster has not been started") from None

    @property
    def master_url(self) -> str:
        """What `SparkSession.builder.master()` takes: `spark://127.0.0.1:<port>`."""
        return f"spark://{LOOPBACK}:{self._port('master')}"

    @property
    def master_web_url(self) -> str:
        """The master's web UI; `<url>/json/` describes workers and applications."""
        return f"http://{LOOPBACK}:{self._port('master_webui')}"

    @property
    def master_log(self) -> Path:
        return self._master.log_path

    @property
    def worker_log(self) -> Path:
        return self._workers[0].log_path

    @property
    def master_pid(self) -> int | None:
        return None if self._master.process is None else self._master.process.pid

    @property
    def worker_pid(self) -> int | None:
        """The (first) worker JVM; executor JVMs are its children."""
        process = self._workers[0].process
        return None if process is None else process.pid

    @property
    def running(self) -> bool:
        return self._master.running and all(worker.running for worker in self._workers)

    def session_conf(self, *, executor_memory: str = "512m") -> dict[str, str]:
        """Settings for a SparkSession on this cluster (pass each to `builder.config`).

        The driver binds to loopback, the executors run this interpreter, and one executor
        takes all the worker's cores. The Spark UI is off: tests never read it, and it would
        take another port. The driver's environment needs `PYSPARK_PYTHON` too: PySpark ships
        it with every Python function, and without it the workers run `python3` from PATH.
        """
        return {
            "spark.master": self.master_url,
            "spark.driver.host": LOOPBACK,
            "spark.driver.bindAddress": LOOPBACK,
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
            "spark.executor.memory": executor_memory,
            "spark.cores.max": str(self.cores * len(self._workers)),
            "spark.ui.enabled": "false",
        }

    def master_state(self) -> dict[str, object]:
        """The master's JSON status (`aliveworkers`, `workers`, `activeapps`, ...)."""
        url = f"{self.master_web_url}/json/"
        with urllib.request.urlopen(url, timeout=2.0) as response:
            state: dict[str, object] = json.load(response)
            return state

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the master, then the worker; return once the worker has registered.

        A no-op if both run. Raises `StackError` with the relevant log's tail if a daemon exits
        or does not get ready within `start_timeout` seconds; nothing is left running then.
        """
        if self.running:
            return
        self.stop(grace=0)  # one of the two died: start both afresh
        if not self._ports:
            names = ["master", "master_webui"]
            for i in range(len(self._workers)):
                names += [f"worker_{i}", f"worker_webui_{i}"]
            self._ports = {name: free_port() for name in names}  # distinct, free right now
        try:
            self._start_master()
            for i in range(len(self._workers)):
                self._start_worker(i)
        except BaseException:
            self.stop(grace=0)
            raise

    def _start_master(self) -> None:
        argv = [
            *self._spark_class(MASTER_CLASS),
            "--host",
            LOOPBACK,
            "--port",
            str(self._port("master")),
            "--webui-port",
            str(self._port("master_webui")),
        ]
        env = self._env()
        # Spark 4 also starts a REST submission server, on fixed port 6066: not needed here, and
        # two clusters on one machine would collide on it.
        env["SPARK_MASTER_OPTS"] = "-Dspark.master.rest.enabled=false"
        process = self._master.spawn(argv, env)
        wait_ready(
            process,
            self._master_ready,
            what="the Spark master",
            log_path=self._master.log_path,
            timeout=self._start_timeout,
        )

    def _start_worker(self, i: int) -> None:
        worker = self._workers[i]
        home = worker.home
        argv = [
            *self._spark_class(WORKER_CLASS),
            "--host",
            LOOPBACK,
            "--port",
            str(self._port(f"worker_{i}")),
            "--webui-port",
            str(self._port(f"worker_webui_{i}")),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(home / "work"),
            self.master_url,
        ]
        env = self._env()
        env["SPARK_LOCAL_DIRS"] = str(home / "local")  # executors' shuffle and block files
        env["PYSPARK_PYTHON"] = sys.executable  # executors inherit the worker's environment
        process = worker.spawn(argv, env)
        wait_ready(
            process,
            functools.partial(self._workers_registered, i + 1),
            what=f"the Spark worker (registering with {self.master_url}, "
            f"whose log is {self._master.log_path})",
            log_path=worker.log_path,
            timeout=self._start_timeout,
        )

    def _spark_class(self, main_class: str) -> list[str]:
        find_java()  # spark-class runs $JAVA_HOME/bin/java or `java`; fail early, with a hint
        return [str(spark_home() / "bin" / "spark-class"), main_class]

    def _env(self) -> dict[str, str]:
        """The daemons' environment: this process's, minus any `SPARK_*` setting that could
        point them at another Spark installation or configuration."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("SPARK_")}
        conf_dir = self.workdir / "conf"  # empty: no spark-env.sh, no spark-defaults.conf
        conf_dir.mkdir(parents=True, exist_ok=True)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf_dir),
            SPARK_LOCAL_IP=LOOPBACK,  # the web UIs bind to this, not to 0.0.0.0
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            # A daemon whose port was taken since `free_port()` picked it exits with "Address
            # already in use" in its log, instead of silently binding the next port up, where
            # nobody would look for it (Spark's default is 16 more tries).
            SPARK_DAEMON_JAVA_OPTS="-Dspark.port.maxRetries=0",
        )
        return env

    def _master_ready(self) -> bool:
        # The web UI answers before the master has elected itself leader; `status` says when.
        # (A probe of the RPC port would work too, but logs a disconnect for each attempt.)
        try:
            return self.master_state().get("status") == "ALIVE"
        except (OSError, ValueError):  # URLError is an OSError; ValueError: JSON half written
            return False

    def _workers_registered(self, count: int) -> bool:
        try:
            alive = self.master_state().get("aliveworkers", 0)
        except (OSError, ValueError):
            return False
        return isinstance(alive, int) and alive >= count

    def stop(self, grace: float = GRACE) -> None:
        """Stop the workers (and their executors), then the master. Idempotent."""
        try:
            for worker in self._workers:
                worker.stop(grace)
        finally:
            self._master.stop(grace)

    def kill(self) -> None:
        """SIGKILL both daemons and the executors, as a crash would."""
        self.stop(grace=0)

    def close(self) -> None:
        """`stop()` with the default grace period (what `with` calls)."""
        self.stop()

    def log_tails(self, lines: int = 20) -> str:
        """The last lines of every daemon's log, for a failing test's message."""
        return "\n".join(
            f"--- {daemon.log_path}\n{log_tail(daemon.log_path, lines)}"
            for daemon in (self._master, *self._workers)
        )

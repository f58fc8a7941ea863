"""The nemesis's servers and `kspout run` instances, each a handle the faults can kill.

`Servers`: a KRaft cluster of Apache Kafka brokers (`KafkaCluster`, three nodes by default so
that a partition's leader can die while two in-sync replicas remain), ZooKeeper, and Redis
with its append-only file (`appendfsync everysec`: a SIGKILL of the process loses nothing it
acknowledged, the kernel holds it), all in one folder, started and stopped together.

`Instance`: one `kspout run` slot. Each start is a new process (an incarnation) with an attempt
log of its own (`job.py`); its stdout (the final `--json` report) and stderr go to files beside
that log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from kspout.devstack import DevStack, KafkaCluster
from kspout.devstack.kafka_broker import KafkaBroker

JOB = "bench.nemesis.job:bolt"
REPO = Path(__file__).resolve().parents[2]
STOP_GRACE = 60.0  # seconds an instance gets to finish its batches and commit after SIGTERM
# Seconds a Kafka node restarted by a fault may take to answer: a long run keeps a 2-core machine
# saturated, and a node once took more than the default 60 s (the run then stopped, unjudged).
BROKER_START_TIMEOUT = 300.0


class Servers:
    """Kafka (`brokers` nodes), ZooKeeper and Redis under `workdir`."""

    def __init__(self, workdir: Path, brokers: int) -> None:
        # A follower that stops fetching leaves the ISR after 2 s (the default is 30 s).
        settings = {"replica.lag.time.max.ms": "2000"}
        self.kafka = KafkaCluster(
            workdir / "kafka", brokers, settings=settings, start_timeout=BROKER_START_TIMEOUT
        )
        self.stack = DevStack(workdir / "stack", components=("zookeeper", "redis"))

    @property
    def brokers(self) -> str:
        return self.kafka.brokers

    def node(self, node_id: int) -> KafkaBroker:
        return self.kafka.node(node_id)

    def start(self) -> None:
        self.kafka.start()
        try:
            self.stack.start()
        except BaseException:
            self.kafka.stop()
            raise

    def stop(self) -> None:
        for node in self.kafka.nodes:
            if node.running:
                node.thaw()  # a node left frozen would hold up the cluster's shutdown
        self.stack.stop()
        self.kafka.stop()


class Instance:
    """A `kspout run --handler bench.nemesis.job:bolt` slot, started, killed, frozen and
    started again.

    States: new -> running (`start`) -> exited (`kill`: SIGKILL; `stop`: SIGTERM, it commits
    and prints its final report) -> running again (`start`: a new incarnation). `freeze` and
    `thaw` (SIGSTOP, SIGCONT) stop and continue a running one.
    """

    def __init__(self, index: int, topic_file: Path, hang_flag: Path, workdir: Path) -> None:
        self.index = index
        self.topic_file = topic_file
        self.hang_flag = hang_flag
        self.workdir = workdir
        self.incarnations: list[Path] = []  # the attempt log of each process started
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"instance {self.index}"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start a new process (a new incarnation)."""
        assert not self.running, f"{self.name} runs already"
        stem = self.workdir / f"instance-{self.index}-{len(self.incarnations)}"
        log = stem.with_suffix(".attempts")
        self.incarnations.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
        env |= {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
            "NEMESIS_CONFIG": str(self.topic_file),
            "NEMESIS_ATTEMPTS": str(log),
            "NEMESIS_HANG": str(self.hang_flag),
        }
        kspout = Path(sys.executable).with_name("kspout")
        argv = [str(kspout), "run", "--config", str(self.topic_file), "--handler", JOB, "--json"]
        with stem.with_suffix(".out").open("wb") as out, stem.with_suffix(".err").open("wb") as err:
            self.process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
            )

    def kill(self) -> int:
        """SIGKILL the process; its exit status."""
        return self._end(signal.SIGKILL, 30.0)

    def stop(self) -> int:
        """SIGTERM (after SIGCONT, should it be frozen): it finishes its batches, commits and
        prints its final report; SIGKILL after `STOP_GRACE` seconds. Its exit status."""
        if self.running:
            self.thaw()
        return self._end(signal.SIGTERM, STOP_GRACE)

    def freeze(self) -> None:
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)

    def stopped_by_signal(self) -> bool:
        """True while the process is stopped (state T in /proc)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] == "T"

    def _signal(self, signum: signal.Signals) -> None:
        assert self.process is not None and self.running, f"{self.name} is not running"
        self.process.send_signal(signum)

    def _end(self, signum: signal.Signals, wait: float) -> int:
        process = self.process
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(wait)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def close(self) -> None:
        """Kill a process still running (after a failure of the nemesis itself)."""
        if self.running:
            with contextlib.suppress(OSError):
                self.thaw()
            self.kill()

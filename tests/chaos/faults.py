"""Faults for the fault matrix (tests/chaos/test_fault_matrix.py), each one real and counted.

Handlers and bolts here run inside Spark's Python workers (the repo root is on their
PYTHONPATH, see tests/conftest.py), so they travel by reference and keep their Redis clients in
module-level caches. Every message is JSON `{"id": ..., "fault": kind}` keyed by its id; its
one effect is `HINCRBY <topic>:applied <id> 1`, so the test sees which ids took effect and how
often. Each fault that strikes is counted in `<topic>:struck` (HINCRBY, a plain write) *before*
it strikes, so a fault that kills or hangs its worker is still counted:

* `poison` (`FaultyHandler`): kills its own Python worker with SIGKILL, on every attempt.
* `hang` (`FaultyHandler`): blocks forever on an Event nobody sets.
* `slow` (`FaultyHandler`): its first run sleeps past `message_timeout`, then succeeds; later
  runs do not sleep (runs are counted per id in `<topic>:runs`).
* `pace` (`FaultyHandler`) is no fault: the message takes `PACE_SECONDS`, so that a backlog
  is still being worked through when the test takes a broker down.
* `cleanup` (`CleanupFailsOnce`): a bolt whose `cleanup()` raises exactly once in the whole
  run, across every Python worker (`INCR <topic>:cleanups`, raise on 1).
* a Redis outage (`ProbedIdempotencyBolt`): the dedup bolt, which checks Redis before each
  batch; a batch that finds it down cannot count that in Redis, so it appends a line to a
  spool file instead (`spool_strikes` reads it).
* one partition's fetch failing (`MockCluster`): not a worker fault but a broker one. The test
  runs its own librdkafka mock cluster with two brokers, one partition led by broker 2 and the
  rest by broker 1, and through librdkafka's mock API (ctypes) takes broker 2 down: every fetch
  and watermark query of that partition fails while the others flow, until it comes back.
  Executors' fetches are kspout's own code, so the test counts strikes with probe fetches of
  that partition through kspout's `PartitionFetcher` (`<topic>:struck`, field `fetch`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import redis

from dedup import Effects, IdempotencyBolt
from kspout.bolts import BasicBolt, BasicCollector, Collector, Tuple
from kspout.config import TopicConfig
from kspout.kafka import Record

FAULTS = ("none", "pace", "poison", "hang", "slow")
PACE_SECONDS = 0.01  # a `pace` message is no fault: it takes this long, so a backlog lasts


@cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2.0, socket_timeout=5.0)


def encode(id_: str, fault: str = "none") -> bytes:
    """A message's value."""
    assert fault in FAULTS, fault
    return json.dumps({"id": id_, "fault": fault}).encode()


def decode(record: Record) -> tuple[str, str]:
    """`(id, fault)` of a message."""
    message = json.loads(record.value or b"{}")
    return str(message["id"]), str(message["fault"])


def strike(redis_url: str, topic: str, fault: str) -> None:
    """Count one strike of `fault` in `<topic>:struck`."""
    _redis(redis_url).hincrby(f"{topic}:struck", fault, 1)


def apply(redis_url: str, topic: str, id_: str) -> None:
    """The message's effect (at least once: a plain write, no dedup)."""
    _redis(redis_url).hincrby(f"{topic}:applied", id_, 1)


@dataclass(frozen=True, slots=True)
class FaultyHandler:
    """A plain handler `f(record)`: applies each message after the fault it asks for."""

    topic: str
    redis_url: str
    slow_seconds: float

    def __call__(self, record: Record) -> None:
        id_, fault = decode(record)
        if fault == "poison":
            strike(self.redis_url, self.topic, fault)
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "hang":
            strike(self.redis_url, self.topic, fault)
            threading.Event().wait()  # forever: only killing the worker ends it
        elif fault == "slow" and self._first_run(id_):
            strike(self.redis_url, self.topic, fault)
            time.sleep(self.slow_seconds)
        elif fault == "pace":
            time.sleep(PACE_SECONDS)
        apply(self.redis_url, self.topic, id_)

    def _first_run(self, id_: str) -> bool:
        return _redis(self.redis_url).hincrby(f"{self.topic}:runs", id_, 1) == 1


class CleanupFailsOnce(BasicBolt):
    """Applies each message; its `cleanup()` raises exactly once in the whole run.

    The failure is outside per-message code: every message of the task was processed and
    acked by `process` before `cleanup` ran.
    """

    def __init__(self, topic: str, redis_url: str) -> None:
        self.topic = topic
        self.redis_url = redis_url

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        id_, _ = decode(tuple_.record)
        apply(self.redis_url, self.topic, id_)

    def cleanup(self) -> None:
        if _redis(self.redis_url).incr(f"{self.topic}:cleanups") == 1:
            strike(self.redis_url, self.topic, "cleanup")
            raise RuntimeError("injected: cleanup() fails once")


@dataclass(frozen=True, slots=True)
class DedupApply:
    """The dedup bolt's handler: the effect is applied atomically with marking the id DONE."""

    topic: str

    def __call__(self, record: Record, effects: Effects) -> None:
        effects.hincrby(f"{self.topic}:applied", effects.id)


class ProbedIdempotencyBolt(IdempotencyBolt):
    """The dedup bolt, unchanged, except that each batch first checks whether its Redis
    answers; when it does not (the outage the test injects strikes this batch), one line is
    appended to `spool` (Redis cannot count its own outage)."""

    def __init__(self, handler: DedupApply, config: TopicConfig, spool: Path) -> None:
        super().__init__(handler, config)
        self.spool = str(spool)

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        client = redis.Redis.from_url(
            self.config.redis.url, socket_connect_timeout=1.0, socket_timeout=1.0
        )
        try:
            client.ping()
        except redis.RedisError:
            with open(self.spool, "a") as spool:
                spool.write(f"{os.getpid()} {time.time():.3f}\n")
        finally:
            client.close()
        super().execute_batch(tuples, collector)

    def __getstate__(self) -> dict[str, object]:
        return {**super().__getstate__(), "spool": self.spool}


def spool_strikes(spool: Path) -> int:
    """How many batches found Redis down."""
    try:
        return len(spool.read_text().splitlines())
    except FileNotFoundError:
        return 0


# -- a mock Kafka cluster whose brokers can go down ----------------------------------------

REPO = Path(__file__).resolve().parents[2]
_RD_KAFKA_PRODUCER = 0


@cache
def _librdkafka() -> ctypes.CDLL:
    """librdkafka as confluent-kafka loaded it (dlsym on the extension module finds the
    symbols of the librdkafka it links, the very copy this process runs)."""
    from confluent_kafka import cimpl

    lib = ctypes.CDLL(cimpl.__file__)
    vp, cp, i32 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32
    signatures: dict[str, tuple[object, list[object]]] = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_set": (ctypes.c_int, [vp, cp, cp, cp, ctypes.c_size_t]),
        "rd_kafka_new": (vp, [ctypes.c_int, vp, cp, ctypes.c_size_t]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_handle_mock_cluster": (vp, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cp, [vp]),
        "rd_kafka_mock_topic_create": (ctypes.c_int, [vp, cp, ctypes.c_int, ctypes.c_int]),
        "rd_kafka_mock_topic_delete": (ctypes.c_int, [vp, cp]),
        "rd_kafka_mock_partition_set_leader": (ctypes.c_int, [vp, cp, i32, i32]),
        "rd_kafka_mock_broker_set_down": (ctypes.c_int, [vp, i32]),
        "rd_kafka_mock_broker_set_up": (ctypes.c_int, [vp, i32]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


class MockCluster:
    """librdkafka's mock cluster, as kspout's dev stack runs it, with its mock API at hand.

    It runs in a child process (`python -m tests.chaos.faults <brokers>`, commands on stdin), so
    a crash of the mock cannot take the test session with it. Each partition can be led by a
    chosen broker, and a broker can go down (connections closed, new ones refused) and come
    back: a partition led by a down broker can be neither fetched nor asked for its
    watermarks, while partitions led by the others flow. (Taking a partition's leader away
    outright, leader -1, crashed the mock's own process when a client fetched it.)
    """

    def __init__(self, brokers: int = 2) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.faults", str(brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        assert self._process.stdout is not None
        self.brokers = self._process.stdout.readline().strip()
        if not self.brokers:
            self._process.wait(10)
            raise RuntimeError(f"the mock cluster did not start (exit {self._process.returncode})")

    def create_topic(self, topic: str, leaders: Sequence[int]) -> None:
        """A topic with one partition per entry of `leaders`, each led by that broker."""
        self._call("topic", topic, len(leaders))
        for partition, broker in enumerate(leaders):
            self._call("leader", topic, partition, broker)

    def delete_topic(self, topic: str) -> None:
        """Delete a topic with its data (the mock cannot add partitions: a test that needs
        more deletes the topic and creates it again with them)."""
        self._call("delete", topic)

    def broker_down(self, broker: int) -> None:
        self._call("down", broker)

    def broker_up(self, broker: int) -> None:
        self._call("up", broker)

    def _call(self, *words: str | int) -> None:
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        command = " ".join(map(str, words))
        try:
            process.stdin.write(command + "\n")
            process.stdin.flush()
            answer = process.stdout.readline().strip()
        except BrokenPipeError:
            answer = ""
        if answer != "ok":
            raise RuntimeError(f"mock cluster: {command}: {answer or 'its process died'}")

    def close(self) -> None:
        process = self._process
        if process.poll() is None:
            assert process.stdin is not None
            process.stdin.close()  # the server's loop ends and destroys the cluster
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _serve(broker_count: int) -> None:
    """The child process of `MockCluster`: host the cluster, obey commands until stdin ends."""
    from confluent_kafka import KafkaError

    lib = _librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    for key, value in (("test.mock.num.brokers", str(broker_count)), ("log_level", "0")):
        if lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), error, 512) != 0:
            raise RuntimeError(f"librdkafka rejected {key}: {error.value.decode()}")
    rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, error, 512)
    if not rk:
        raise RuntimeError(f"cannot start a mock cluster: {error.value.decode()}")
    mock = lib.rd_kafka_handle_mock_cluster(rk)
    print(lib.rd_kafka_mock_cluster_bootstraps(mock).decode(), flush=True)
    for line in sys.stdin:
        op, *args = line.split()
        if op == "topic":
            err = lib.rd_kafka_mock_topic_create(mock, args[0].encode(), int(args[1]), 1)
        elif op == "delete":
            err = lib.rd_kafka_mock_topic_delete(mock, args[0].encode())
        elif op == "leader":
            err = lib.rd_kafka_mock_partition_set_leader(
                mock, args[0].encode(), int(args[1]), int(args[2])
            )
        elif op == "down":
            err = lib.rd_kafka_mock_broker_set_down(mock, int(args[0]))
        elif op == "up":
            err = lib.rd_kafka_mock_broker_set_up(mock, int(args[0]))
        else:
            print(f"error: unknown command {op!r}", flush=True)
            continue
        print("ok" if err == 0 else f"error: {KafkaError(err)}", flush=True)
    lib.rd_kafka_destroy(rk)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))

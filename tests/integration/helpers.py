"""Helpers shared by the integration tests: producing numbered messages, reading back
watermarks and the commit points stored in ZooKeeper, running `kspout run` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, cast

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.kafka import KafkaMetadata
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.registry import InstanceRegistry
from kspout.zk.session import ZkSession

ZK_ROOT = "/run-test"
PARTITIONS = (0, 1, 2, 3)  # `topic_name` and `topic_factory` create topics with 4 partitions
FAST_BACKOFF = {"initial": 0.01, "multiplier": 1.0, "max": 0.01}


class TopicFactory(Protocol):
    """The `topic_factory` fixture: a unique topic name, created unless `create=False`."""

    def __call__(
        self,
        suffix: str = "",
        *,
        partitions: int = len(PARTITIONS),
        config: Mapping[str, str] | None = None,
        create: bool = True,
    ) -> str: ...


def delete_records(brokers: str, topic: str, before: Mapping[int, int]) -> None:
    """Delete each partition's records below `before[partition]` (Kafka's DeleteRecords, what
    retention does to old segments) and return once the low watermarks are there."""
    admin = AdminClient({"bootstrap.servers": brokers})
    asked = [TopicPartition(topic, p, offset) for p, offset in before.items()]
    for asked_partition, future in admin.delete_records(asked, operation_timeout=30).items():
        assert future.result(30).low_watermark == before[asked_partition.partition]


def value_of(partition: int, offset: int) -> bytes:
    return b"p%d-o%d" % (partition, offset)


def produce(
    producer: Producer,
    topic: str,
    per_partition: Mapping[int, range],
    *,
    key: Callable[[int, int], bytes | None] = lambda p, o: b"k%d" % o,
    value: Callable[[int, int], bytes] = value_of,
) -> None:
    """Produce offsets `per_partition[p]` (which must continue the partition) to each partition."""
    for partition, offsets in per_partition.items():
        for offset in offsets:
            while True:
                try:
                    producer.produce(
                        topic, value(partition, offset), key(partition, offset), partition=partition
                    )
                    break
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)
            producer.poll(0)
    assert producer.flush(30) == 0


def watermarks(config: TopicConfig) -> dict[int, tuple[int, int]]:
    with KafkaMetadata(config) as metadata:
        return {p: metadata.watermarks(config.topic, p) for p in PARTITIONS}


def highs(config: TopicConfig) -> dict[int, int]:
    return {p: high for p, (_, high) in watermarks(config).items()}


@contextmanager
def open_store(
    config: TopicConfig, *, instance_id: str | None = None, **timeouts: float
) -> Iterator[ZkOffsetStore]:
    """An offset store on a session of its own (`ZkSession` with `timeouts`), closed on exit."""
    with ZkSession(config, **timeouts) as session:
        yield ZkOffsetStore(session, instance_id=instance_id)


def register(store: ZkOffsetStore) -> str:
    """Register `store`'s instance id as a live spout instance, as a driver does; its path."""
    return InstanceRegistry(store.session, store.instance_id).register()


def stored(config: TopicConfig) -> dict[int, int]:
    """The commit points in ZooKeeper, by partition."""
    with open_store(config) as store:
        return {p: s.offset for p, s in store.read_all().items()}


def kspout_command() -> Path:
    command = Path(sys.executable).with_name("kspout")
    assert command.exists(), f"the kspout console script is not installed next to {sys.executable}"
    return command


def topic_file(
    path: Path, stack: DevStack, config: TopicConfig, extra: str = "", *, batch_size: int = 25
) -> Path:
    """A config file for `config`'s topic and spout id, with small batches (`batch_size`) and a
    0.5 s commit interval (and the TOML lines in `extra`), written to `path`."""
    path.write_text(
        textwrap.dedent(
            f"""\
            topic = "{config.topic}"
            spout_id = "{config.spout_id}"
            topology_name = "{config.topology_name}"
            zk_root = "{ZK_ROOT}"
            brokers = "{stack.info.brokers}"
            zookeeper = "{stack.info.zookeeper}"
            batch_size = {batch_size}
            commit_interval = 0.5
            """
        )
        + extra
    )
    return path


def dead_letter_headers(config: TopicConfig, brokers: str) -> list[dict[str, str]]:
    """The decoded headers of every record on the topic's dead-letter topic (read until the
    topic has been quiet for 1.5 s)."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "dlq-reader"})
    try:
        topic = consumer.list_topics(config.dlq_topic, timeout=10).topics[config.dlq_topic]
        consumer.assign([TopicPartition(config.dlq_topic, p, 0) for p in topic.partitions])
        found: list[dict[str, str]] = []
        idle = 0
        while idle < 3:
            messages = [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
            idle = 0 if messages else idle + 1
            for message in messages:
                pairs = cast(list[tuple[str, bytes]], message.headers() or [])
                found.append({k: v.decode() for k, v in pairs})
        return found
    finally:
        consumer.close()


def read_topic(brokers: str, topic: str, expected: int) -> list[Message]:
    """Every message of `topic` (all partitions), waiting up to 10 s for `expected` of them."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "test-reader"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        found: list[Message] = []
        deadline = time.monotonic() + 10
        while len(found) < expected and time.monotonic() < deadline:
            found += [m for m in consumer.consume(100, 0.2) if m.error() is None]
        return found
    finally:
        consumer.close()


HANDLER_MODULE = """
import os
import time

LOG = open(os.environ["HANDLED_LOG"], "a", buffering=1)
PAUSE = float(os.environ.get("HANDLER_PAUSE", "0"))


def handle(record):
    time.sleep(PAUSE)
    LOG.write(f"{record.partition} {record.offset}\\n")
"""


def handled_lines(log: Path) -> list[tuple[int, int]]:
    """(partition, offset) per line the handler wrote; a line still being written is left out."""
    if not log.exists():
        return []
    *complete, _partial = log.read_text().split("\n")
    return [(int(p), int(o)) for p, o in (line.split() for line in complete)]


def prepare_kspout_run(
    stack: DevStack,
    config: TopicConfig,
    tmp_path: Path,
    *,
    pause: float,
    extra: str = "",
    batch_size: int = 25,
) -> tuple[list[str], dict[str, str], Path]:
    """argv, environment and handled-log path for `kspout run` with HANDLER_MODULE, which
    sleeps `pause` seconds per record (`extra`: more topic-file lines); run it with
    `cwd=tmp_path`."""
    (tmp_path / "slow_handler.py").write_text(HANDLER_MODULE)
    toml = topic_file(tmp_path / "topic.toml", stack, config, extra, batch_size=batch_size)
    log = tmp_path / "handled.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    env |= {"HANDLED_LOG": str(log), "HANDLER_PAUSE": str(pause)}
    argv = [str(kspout_command()), "run", "--config", str(toml), "--handler", "slow_handler:handle"]
    return argv, env, log


def wait_until_handled(proc: subprocess.Popen[bytes], log: Path, count: int) -> None:
    """Wait (at most 30 s) until the handler logged more than `count` records."""
    deadline = time.monotonic() + 30
    while len(handled_lines(log)) <= count:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no progress within 30 s"
        time.sleep(0.05)


@contextmanager
def spawned(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A process with stdout and stderr piped, killed at the end of the block if it still runs."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_until_caught_up(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> dict[str, Any]:
    """`kspout run ... --until-caught-up --json` to the end; its final report (exit 0 asserted)."""
    done = subprocess.run(
        [*argv, "--until-caught-up", "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    report: dict[str, Any] = json.loads(done.stdout)
    return report

"""The driver loop end to end: `Driver` with the in-process executor, and `kspout run` as a real
process, against the session's Kafka broker and ZooKeeper.

Every test has its own topic and spout id. Messages are produced to explicit partitions with the
value `p<partition>-o<offset>`, so what a handler saw can be checked against what Kafka holds.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from kazoo.client import KazooClient

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.contract import PartitionTask, TaskResult
from kspout.devstack import DevStack
from kspout.driver import Driver, Progress
from kspout.errors import DeadLetterWriteFailed, TopicMismatch
from kspout.executor.local import LocalExecutor
from kspout.kafka import DeadLetter, Record
from kspout.zk.registry import live_instances
from tests.integration.helpers import (
    PARTITIONS,
    delete_records,
    handled_lines,
    open_store,
    prepare_kspout_run,
    produce,
    run_until_caught_up,
    spawned,
    stored,
    topic_file,
    value_of,
    wait_until_handled,
    watermarks,
)

STORM_FIELDS = {"topology", "offset", "partition", "broker", "topic"}

At = tuple[int, int]  # (partition, offset)


def storm_record(
    config: TopicConfig, partition: int, offset: int, topic: str | None = None
) -> bytes:
    """A record exactly as storm-kafka's PartitionManager writes it (no kspout fields)."""
    record = {
        "topology": {"id": "wordcount-7-1700000000", "name": "wordcount"},
        "offset": offset,
        "partition": partition,
        "broker": {"host": "kafka1.example.com", "port": 9092},
        "topic": topic or config.topic,
    }
    return json.dumps(record).encode()


def partition_path(config: TopicConfig, partition: int) -> str:
    return f"{config.zk_spout_path}/partition_{partition}"


def read_topic(brokers: str, topic: str) -> list[Message]:
    """Every message of `topic`, read up to each partition's high watermark."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": f"check-{uuid.uuid4().hex}"})
    try:
        found = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if found is None or found.error is not None:
            return []
        ends = {}
        for p in found.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > 0:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        messages: list[Message] = []
        next_offset = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 20
        while any(next_offset[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"{topic}: read {next_offset} of {ends}"
            for msg in consumer.consume(500, 0.2):
                offset = msg.offset()
                assert msg.error() is None and offset is not None, msg.error()
                messages.append(msg)
                next_offset[msg.partition()] = offset + 1
        return messages
    finally:
        consumer.close()


def letter_headers(msg: Message) -> tuple[At, dict[str, bytes]]:
    """A dead letter's source (partition, offset) and its `kspout.*` headers, by short name."""
    found = msg.headers() or []
    raw = list(found.items()) if isinstance(found, dict) else found
    headers = {
        name.removeprefix("kspout."): value
        for name, value in raw
        if name.startswith("kspout.") and isinstance(value, bytes)
    }
    return (int(headers["source.partition"]), int(headers["source.offset"])), headers


class Recorder:
    """A handler that notes every call, and fails chosen offsets.

    `transient[at]` failures come first at that offset, then it succeeds; offsets in `poison`
    always fail; `check(record)`, when given, runs first and may raise like user code.
    `calls` counts every call, `done` the successful ones.
    """

    def __init__(
        self,
        transient: Mapping[At, int] | None = None,
        poison: Collection[At] = (),
        check: Callable[[Record], None] | None = None,
    ) -> None:
        self.transient = dict(transient or {})
        self.poison = set(poison)
        self.check = check
        self.calls: Counter[At] = Counter()
        self.done: Counter[At] = Counter()
        self.values: dict[At, bytes | None] = {}

    def __call__(self, record: Record) -> None:
        at = (record.partition, record.offset)
        self.calls[at] += 1
        self.values[at] = record.value
        if self.check is not None:
            self.check(record)
        if at in self.poison:
            raise RuntimeError(f"poison message at {at}")
        if self.calls[at] <= self.transient.get(at, 0):
            raise ConnectionError(f"transient failure {self.calls[at]} at {at}")
        self.done[at] += 1

    def seen(self, partition: int) -> list[int]:
        return sorted(o for p, o in self.calls if p == partition)


def run_driver(config: TopicConfig, handler: Callable[[Record], object], **kwargs: Any) -> Progress:
    with Driver(config, LocalExecutor(config, handler)) as driver:
        return driver.run(**kwargs)


def every_offset(ends: Mapping[int, int]) -> set[At]:
    """Every (partition, offset) below `ends[partition]`."""
    return {(p, o) for p, end in ends.items() for o in range(end)}


# -- 1. retries and dead letters ----------------------------------------------------------------


def test_every_offset_is_handled_and_poison_goes_to_the_dlq(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    zk: KazooClient,
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(750) for p in PARTITIONS})
    transient = {(0, 5): 1, (1, 100): 2, (2, 749): 3, (3, 0): 1, (3, 401): 2}
    poison = {(0, 10), (2, 300), (3, 749)}
    handler = Recorder(transient, poison)

    progress = run_driver(config, handler, until_caught_up=True)

    everything = every_offset(dict.fromkeys(PARTITIONS, 750))
    assert set(handler.calls) == everything  # every offset reached the handler
    assert set(handler.done) == everything - poison
    assert set(handler.done.values()) == {1}  # each success exactly once
    attempts = config.max_retries + 1
    for at, failures in transient.items():
        assert handler.calls[at] == failures + 1
    for at in poison:
        assert handler.calls[at] == attempts
    assert handler.calls.total() == 3000 + sum(transient.values()) + len(poison) * (attempts - 1)

    assert progress.total("retried") == sum(transient.values()) + len(poison) * config.max_retries
    assert progress.total("dead_lettered") == len(poison)
    assert progress.total("acked") == 3000 - len(poison)
    assert progress.total("skipped") == progress.total("lost") == 0
    assert progress.lag == 0

    for p in PARTITIONS:  # storm-kafka's record, at the high watermark
        record = json.loads(zk.get(partition_path(config, p))[0])
        assert set(record) >= STORM_FIELDS
        assert (record["offset"], record["partition"], record["topic"]) == (750, p, config.topic)
        assert set(record["topology"]) == {"id", "name"}
        assert record["topology"]["name"] == "run-test"
        assert set(record["broker"]) == {"host", "port"}
    assert stored(config) == dict.fromkeys(PARTITIONS, 750)

    letters = read_topic(stack.info.brokers, config.dlq_topic)
    assert len(letters) == len(poison)
    by_source = {}
    for msg in letters:
        at, headers = letter_headers(msg)
        by_source[at] = msg
        assert headers["source.topic"] == config.topic.encode()
        assert headers["attempts"] == str(attempts).encode()
        assert headers["error"] == f"RuntimeError: poison message at {at}".encode()
        assert headers["reason"] == b"exception (retries exhausted)"
        assert msg.value() == value_of(*at) == handler.values[at]
        assert msg.key() == b"k%d" % at[1]
    assert set(by_source) == poison


def test_committed_record_names_the_partition_leader(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    """storm-kafka writes the partition's leader as `broker`; tools that read the records (lag
    monitors) connect to it, so kspout's records should name it too."""
    config = make_config()
    produce(producer, config.topic, {0: range(5)})
    run_driver(config, Recorder(), until_caught_up=True)

    metadata = producer.list_topics(config.topic, timeout=10)
    leader = metadata.brokers[metadata.topics[config.topic].partitions[0].leader]
    record = json.loads(zk.get(partition_path(config, 0))[0])
    assert record["broker"] == {"host": leader.host, "port": leader.port}


# -- 2. restart ---------------------------------------------------------------------------------


def test_restart_resumes_at_the_committed_offsets(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=100)
    produce(producer, config.topic, {p: range(500) for p in PARTITIONS})
    first = Recorder()
    run_driver(config, first, max_batches=3)

    committed = stored(config)
    assert set(committed) == set(PARTITIONS)
    for p in PARTITIONS:
        assert 0 < committed[p] < 500  # stopped midway
        # Everything below the commit point was handled; nothing above it was committed.
        assert set(range(committed[p])) <= set(first.seen(p))

    produce(producer, config.topic, {p: range(500, 800) for p in PARTITIONS})
    second = Recorder()
    progress = run_driver(config, second, until_caught_up=True)

    for p in PARTITIONS:
        assert min(second.seen(p)) == committed[p]  # never below the first run's commit
        assert second.seen(p) == list(range(committed[p], 800))
    assert set(second.done.values()) == {1}
    assert stored(config) == dict.fromkeys(PARTITIONS, 800)
    assert [v.committed for v in progress.partitions] == [800] * 4


# -- 3. and 4. records written by storm-kafka ----------------------------------------------------


def test_resumes_from_a_storm_kafka_record(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(300), 1: range(100)})
    zk.create(partition_path(config, 0), storm_record(config, 0, 150), makepath=True)
    handler = Recorder()

    run_driver(config, handler, until_caught_up=True)

    assert handler.seen(0) == list(range(150, 300))  # nothing below Storm's commit point
    assert handler.seen(1) == list(range(100))  # no record: start = earliest
    record = json.loads(zk.get(partition_path(config, 0))[0])
    assert record["offset"] == 300 and record["topic"] == config.topic
    assert stored(config) == {0: 300, 1: 100, 2: 0, 3: 0}


def test_a_record_of_another_topic_stops_the_start(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(10) for p in PARTITIONS})
    path = partition_path(config, 2)
    foreign = storm_record(config, 2, 7, topic="clicks")
    zk.create(path, foreign, makepath=True)
    handler = Recorder()

    driver = Driver(config, LocalExecutor(config, handler))
    try:
        with pytest.raises(TopicMismatch) as caught:
            driver.start()
    finally:
        driver.close()

    message = str(caught.value)
    assert path in message and "'clicks'" in message and repr(config.topic) in message
    assert "spout_id" in message  # says what to change
    assert (caught.value.stored_topic, caught.value.topic) == ("clicks", config.topic)
    assert handler.calls.total() == 0
    assert zk.get(path)[0] == foreign  # the other topic's record is untouched


def test_a_failed_start_leaves_no_live_registration(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    """`with Driver(...)` whose start fails must not leave the instance registered: a registered
    instance makes `kspout offsets set` refuse to move the offsets ("spout is running")."""
    config = make_config()
    produce(producer, config.topic, {0: range(3)})
    zk.create(partition_path(config, 0), storm_record(config, 0, 1, topic="clicks"), makepath=True)

    with pytest.raises(TopicMismatch), Driver(config, LocalExecutor(config, Recorder())):
        pass

    with open_store(config) as observer:
        assert live_instances(observer.session) == []


# -- 5. out of range ------------------------------------------------------------------------------


@pytest.fixture
def truncated(make_config: Callable[..., TopicConfig], producer: Producer) -> tuple[int, int]:
    """Partition 0 holds 8,000 messages, and Kafka deleted those below 3,000 (DeleteRecords, as
    retention would), so its low watermark moved up; the spout's stored offset there is 0.
    Returns (low, high)."""
    config = make_config()
    produce(producer, config.topic, {0: range(8000)}, key=lambda p, o: None)
    delete_records(config.brokers, config.topic, {0: 3000})
    low, high = watermarks(config)[0]
    assert 0 < low == 3000 < high == 8000
    with open_store(config) as store:
        store.commit(0, 0, version=None)
    return low, high


def test_out_of_range_below_low_resumes_at_earliest(
    make_config: Callable[..., TopicConfig], truncated: tuple[int, int]
) -> None:
    low, high = truncated
    config = make_config(out_of_range="earliest", batch_size=2000)
    handler = Recorder()

    progress = run_driver(config, handler, until_caught_up=True)

    assert handler.seen(0) == list(range(low, high))
    assert progress.partitions[0].stats.lost == low
    ((partition, reset),) = progress.resets
    assert partition == 0
    assert (reset.low, reset.high, reset.old_commit, reset.new_start) == (low, high, 0, low)
    assert reset.lost == ((0, low),)
    assert stored(config)[0] == high


def test_out_of_range_below_low_jumps_to_latest(
    make_config: Callable[..., TopicConfig], truncated: tuple[int, int]
) -> None:
    _low, high = truncated
    config = make_config(out_of_range="latest")
    handler = Recorder()

    progress = run_driver(config, handler, until_caught_up=True)

    assert handler.seen(0) == []
    ((partition, reset),) = progress.resets
    assert partition == 0 and reset.new_start == high
    assert reset.lost == ((0, high),)  # the skipped range, exactly
    assert progress.partitions[0].stats.lost == high
    assert stored(config)[0] == high


def test_out_of_range_fail_stops_only_that_partition_until_an_operator_moves_it(
    make_config: Callable[..., TopicConfig], truncated: tuple[int, int], producer: Producer
) -> None:
    low, high = truncated
    config = make_config(out_of_range="fail", batch_size=2000)
    produce(producer, config.topic, {1: range(100), 2: range(100)})
    handler = Recorder()

    with Driver(config, LocalExecutor(config, handler)) as driver:
        progress = driver.run(until_caught_up=True)  # a stopped partition waits, not the run
        stopped = progress.partitions[0]
        assert stopped.status == "stopped"
        assert stopped.stopped == f"offset 0 is out of range; Kafka holds [{low}, {high})"
        assert handler.seen(0) == []
        # The other partitions ran and committed meanwhile.
        assert handler.seen(1) == handler.seen(2) == list(range(100))
        assert stored(config) == {0: 0, 1: 100, 2: 100, 3: 0}
        with open_store(config) as store:
            assert store.read(0).stopped == stopped.stopped  # type: ignore[union-attr]
            store.move(0, low)  # what `kspout offsets set --partition 0 --to earliest` does

        deadline = time.monotonic() + 20
        while driver.progress().partitions[0].stopped and time.monotonic() < deadline:
            driver.step()
            driver.commit()
            time.sleep(0.1)
        assert driver.progress().partitions[0].status == "running"
        driver.run(until_caught_up=True)

    assert handler.seen(0) == list(range(low, high))
    assert stored(config)[0] == high


def test_stored_offset_above_high_resets_to_earliest(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(out_of_range="earliest")
    produce(producer, config.topic, {0: range(50)})
    with open_store(config) as store:
        store.commit(0, 500, version=None)  # e.g. the topic was deleted and recreated
    handler = Recorder()

    progress = run_driver(config, handler, until_caught_up=True)

    assert handler.seen(0) == list(range(50))
    ((partition, reset),) = progress.resets
    assert (partition, reset.old_commit, reset.new_start, reset.lost) == (0, 500, 0, ())
    assert stored(config)[0] == 50


# -- 6. `kspout run` ------------------------------------------------------------------------------


def test_kspout_run_stops_on_sigint_and_commits_what_was_handled(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(250) for p in PARTITIONS})
    argv, env, log = prepare_kspout_run(stack, config, tmp_path, pause=0.005)

    with spawned(argv, tmp_path, env) as proc:
        wait_until_handled(proc, log, 150)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)  # it stops after the batch in flight
    assert proc.returncode == 0, err.decode()

    handled = handled_lines(log)
    assert len(handled) < 1000, "the run finished before the interrupt: make the handler slower"
    committed = stored(config)
    assert sum(committed.values()) > 0
    for p in PARTITIONS:
        mine = sorted(o for q, o in handled if q == p)
        # Nothing committed that was not handled, and everything handled was committed on exit.
        assert committed.get(p, 0) == len(mine)
        assert mine == list(range(len(mine)))

    env["HANDLER_PAUSE"] = "0"
    report = run_until_caught_up(argv, tmp_path, env, timeout=60)
    rows = {row["partition"]: row for row in report["partitions"]}
    assert sorted(rows) == list(PARTITIONS)
    for p in PARTITIONS:
        assert rows[p]["committed"] == rows[p]["high"] == 250
    assert report["lag"] == 0
    assert report["totals"]["acked"] == 1000 - sum(committed.values())
    assert stored(config) == dict.fromkeys(PARTITIONS, 250)
    # The second run resumed at the commit points: each offset was handled exactly once.
    assert sorted(handled_lines(log)) == sorted(every_offset(dict.fromkeys(PARTITIONS, 250)))


def test_kspout_run_commits_every_commit_interval_while_it_runs(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    """A spout killed outright (no chance to commit on exit) loses at most one commit interval
    of progress: what it stored is what its periodic commits wrote while it ran."""
    config = make_config()
    produce(producer, config.topic, {p: range(250) for p in PARTITIONS})
    argv, env, log = prepare_kspout_run(stack, config, tmp_path, pause=0.005)

    with spawned(argv, tmp_path, env) as proc:
        wait_until_handled(proc, log, 150)
        time.sleep(1.5)  # three commit intervals of work (not synchronisation)
        assert proc.poll() is None, proc.communicate()  # still running: it never exited cleanly
        proc.kill()
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    handled = handled_lines(log)
    committed = stored(config)
    assert sorted(committed) == list(PARTITIONS), f"nothing committed while running: {committed}"
    for p in PARTITIONS:
        mine = {o for q, o in handled if q == p}
        assert committed[p] > 0
        assert set(range(committed[p])) <= mine  # nothing committed that was not handled


# -- 7. records without a key ---------------------------------------------------------------------


def test_records_without_a_key_fail_and_end_on_the_dlq(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(max_retries=2)
    keyless = {(p, o) for p in PARTITIONS for o in (3, 60, 61)}

    def key(p: int, o: int) -> bytes | None:
        return None if (p, o) in keyless else b"k%d" % o

    produce(producer, config.topic, {p: range(100) for p in PARTITIONS}, key=key)

    def needs_a_key(record: Record) -> None:
        if record.key is None:
            raise ValueError("record has no key")

    handler = Recorder(check=needs_a_key)

    progress = run_driver(config, handler, until_caught_up=True)

    everything = every_offset(dict.fromkeys(PARTITIONS, 100))
    assert set(handler.done) == everything - keyless  # keyless records never succeeded...
    for at in keyless:
        assert handler.calls[at] == config.max_retries + 1  # ...they were retried to the budget
    assert progress.total("acked") == 400 - len(keyless)  # and never acked
    assert progress.total("dead_lettered") == len(keyless)
    assert stored(config) == dict.fromkeys(PARTITIONS, 100)

    letters = read_topic(stack.info.brokers, config.dlq_topic)
    sources = set()
    for msg in letters:
        at, headers = letter_headers(msg)
        sources.add(at)
        assert msg.key() is None and msg.value() == value_of(*at)
        assert headers["source.topic"] == config.topic.encode()
        assert headers["error"] == b"ValueError: record has no key"
        assert headers["reason"] == b"exception (retries exhausted)"
        assert headers["attempts"] == str(config.max_retries + 1).encode()
    assert len(letters) == len(keyless) and sources == keyless


# -- 8. the driver's lifecycle and loop -----------------------------------------------------------


def commit_points(progress: Progress) -> dict[int, int]:
    return {view.partition: view.stats.commit_point for view in progress.partitions}


def test_close_commits_what_the_steps_finished(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=100, commit_interval=3600)  # no periodic commit
    produce(producer, config.topic, {p: range(500) for p in PARTITIONS})

    with Driver(config, LocalExecutor(config, Recorder())) as driver:
        for _ in range(3):
            driver.step()
        # Only the claims wrote (the start offsets): only close() commits progress.
        assert stored(config) == dict.fromkeys(PARTITIONS, 0)

    points = commit_points(driver.progress())  # close() applied the batches still running
    assert sorted(points) == list(PARTITIONS)
    assert all(0 < point < 500 for point in points.values()), points
    assert stored(config) == points


def test_a_failed_dead_letter_write_is_written_again(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = make_config(max_retries=1)
    produce(producer, config.topic, {0: range(20)})
    poison = (0, 7)
    handler = Recorder(poison={poison})
    driver = Driver(config, LocalExecutor(config, handler))
    real_write = driver._dead_letters._writer.write
    writes: list[list[int]] = []

    def fail_once(letters: Sequence[DeadLetter]) -> None:
        writes.append([letter.offset for letter in letters])
        if len(writes) == 1:
            failures = [(config.topic, d.partition, d.offset, "broker down") for d in letters]
            raise DeadLetterWriteFailed(config.dlq_topic, failures)
        real_write(letters)

    monkeypatch.setattr(driver._dead_letters._writer, "write", fail_once)
    stop = threading.Event()
    deadline = threading.Timer(10, stop.set)  # a stalled partition would never catch up
    deadline.start()
    try:
        with driver:
            progress = driver.run(until_caught_up=True, stop=stop)
    finally:
        deadline.cancel()

    assert not stop.is_set(), "did not catch up within 10 s"
    assert writes == [[7], [7]]  # failed, then written again
    assert handler.calls[poison] == config.max_retries + 1  # the handler did not run again
    assert progress.total("dead_lettered") == 1
    assert stored(config)[0] == 20
    letters = read_topic(stack.info.brokers, config.dlq_topic)
    assert [letter_headers(msg)[0] for msg in letters] == [poison]  # exactly once
    assert letters[0].value() == value_of(*poison)


def test_a_running_driver_is_registered_and_offsets_set_refuses(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config(commit_interval=3600)
    produce(producer, config.topic, {0: range(10)})
    toml = topic_file(tmp_path / "topic.toml", stack, config)

    def set_all_to_earliest() -> Any:
        args = ["offsets", "set", "--config", str(toml), "--all", "--to", "earliest"]
        return CliRunner().invoke(main, args)

    with open_store(config) as observer:
        with Driver(config, LocalExecutor(config, Recorder())) as driver:
            driver.step()
            live = live_instances(observer.session)
            assert len(live) == 1 and live[0].startswith("run-test-"), live
            driver.step()
            assert live_instances(observer.session) == live

            refused = set_all_to_earliest()
            assert refused.exit_code == 1, refused.output
            assert "is running" in refused.stderr and live[0] in refused.stderr
            assert stored(config) == dict.fromkeys(PARTITIONS, 0)  # as claimed: nothing moved

        assert live_instances(observer.session) == []
    assert stored(config) == {0: 10, 1: 0, 2: 0, 3: 0}
    moved = set_all_to_earliest()  # stopped: the operator may move the offsets now
    assert moved.exit_code == 0, moved.output
    assert stored(config) == dict.fromkeys(PARTITIONS, 0)


class HoldingExecutor:
    """Runs each batch at once with a real `LocalExecutor` (real fetches, real handler), but
    completes its future only when the test calls `release()`, oldest first.

    `events` lists "submit" per batch the driver submitted.
    """

    def __init__(self, inner: LocalExecutor) -> None:
        self._inner = inner
        self._held: deque[tuple[Future[list[TaskResult]], Future[list[TaskResult]]]] = deque()
        self.events: list[str] = []

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        ran = self._inner.submit(batch, tasks)
        held: Future[list[TaskResult]] = Future()
        self._held.append((ran, held))
        self.events.append("submit")
        return held

    def release(self) -> None:
        ran, held = self._held.popleft()
        exc = ran.exception()
        if exc is None:
            held.set_result(ran.result())
        else:
            held.set_exception(exc)

    def release_all(self) -> None:
        while self._held:
            self.release()

    def cancel(self, batch: int) -> None:
        self.events.append(f"cancel {batch}")

    def stop_soon(self) -> None:
        self._inner.stop_soon()

    def channel_host(self) -> str | None:
        return None

    def attach(self, address: object) -> None:
        raise AssertionError("no channel was asked for")

    def close(self, *, cancel: bool = False) -> None:
        self.events.append("cancel" if cancel else "close")
        self._inner.close()


def test_max_batches_in_flight_bounds_the_batches_running(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=50, max_batches_in_flight=2, commit_interval=3600)
    produce(producer, config.topic, {p: range(500) for p in PARTITIONS})
    handler = Recorder()
    executor = HoldingExecutor(LocalExecutor(config, handler))

    with Driver(config, executor) as driver:
        try:
            assert driver.step() and driver.step()
            assert executor.events == ["submit", "submit"]  # two batches running, none done

            # A third step waits briefly for a batch to finish, then returns without a third.
            assert not driver.step()
            assert executor.events == ["submit", "submit"]

            executor.release()
            assert driver.step()
            assert executor.events == ["submit", "submit", "submit"]
        finally:
            executor.release_all()

    assert handler.calls.total() == 3 * 50 * len(PARTITIONS)  # the batches ran for real
    assert stored(config) == dict.fromkeys(PARTITIONS, 150)


def test_a_batch_running_past_message_timeout_times_out_while_it_runs(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(
        batch_size=50, max_batches_in_flight=1, message_timeout=0.2, commit_interval=3600
    )
    produce(producer, config.topic, {p: range(50) for p in PARTITIONS})
    executor = HoldingExecutor(LocalExecutor(config, Recorder()))

    with Driver(config, executor) as driver:
        try:
            assert driver.step()
            time.sleep(0.3)
            # The only slot is taken: the step expires the running batch's offsets instead.
            assert not driver.step()
            assert driver.progress().total("timed_out") == 50 * len(PARTITIONS)
            executor.release()  # the original finishes late: its acks still count
            driver.step()
            assert driver.progress().total("acked") == 50 * len(PARTITIONS)
        finally:
            executor.release_all()
    assert stored(config) == dict.fromkeys(PARTITIONS, 50)


def test_an_interrupt_abandons_batches_in_flight_and_commits_only_what_was_applied(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config(batch_size=50, max_batches_in_flight=2, commit_interval=3600)
    produce(producer, config.topic, {p: range(100) for p in PARTITIONS})
    executor = HoldingExecutor(LocalExecutor(config, Recorder()))
    interrupted: list[BaseException] = []

    def run_until_interrupted() -> None:
        try:
            with Driver(config, executor) as driver:
                assert driver.step() and driver.step()  # two batches in flight
                executor.release()  # the first finishes; the second never will
                raise KeyboardInterrupt  # the second Ctrl-C
        except KeyboardInterrupt as exc:
            interrupted.append(exc)

    worker = threading.Thread(target=run_until_interrupted, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "the driver waited for a batch that never finishes"
    assert interrupted and executor.events == ["submit", "submit", "cancel"]
    # The finished batch was applied and committed; the abandoned one runs again next time.
    assert stored(config) == dict.fromkeys(PARTITIONS, 50)
    executor.release_all()

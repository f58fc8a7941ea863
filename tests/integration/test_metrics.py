"""The driver's Prometheus endpoint, scraped over HTTP while real runs go on, and the commit
points mirrored to a Kafka consumer group, read back by a separate consumer.

Runs use the in-process executor against the session's Kafka broker and ZooKeeper.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from urllib.error import URLError

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from kspout.bolts import Bolt, Collector, Tuple
from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, create_topic
from kspout.devstack.ports import LOOPBACK, free_port
from kspout.driver import Driver, PartitionView, Progress
from kspout.driver.metrics import MetricsExporter
from kspout.errors import ConfigError
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from kspout.kafka.group_mirror import GroupMirror
from tests.integration.helpers import PARTITIONS, TopicFactory, produce, stored

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

POISON = (1, 5)  # raises every time: dead-lettered once its retries are spent
INVALID = (2, 7)  # marked INVALID by the bolt: dead-lettered at once
WAIT = 30.0  # seconds for anything asynchronous (dead letters, commits) to show


class Triage(Bolt):
    """Acks every record but the poison one (raises) and the invalid one."""

    terminal = True

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        record: Record = tuple_.record
        at = (record.partition, record.offset)
        if at == POISON:
            raise RuntimeError(f"poison message at {at}")
        if at == INVALID:
            collector.invalid(tuple_, "no id")
            return
        collector.ack(tuple_)


def scrape(url: str) -> Samples:
    """Every sample the endpoint serves, by name and labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def by_partition(samples: Samples, name: str, **labels: str) -> dict[int, float]:
    """One per-partition metric (with these extra labels), by partition."""
    return {
        int(dict(key)["partition"]): value
        for (found, key), value in samples.items()
        if found == name and labels.items() <= dict(key).items()
    }


# What each served figure must equal in the driver's own snapshot.
FIGURES: dict[str, Callable[[PartitionView], int | None]] = {
    "kspout_spout_lag": lambda v: v.lag,
    "kspout_earliest_time_offset": lambda v: v.low,
    "kspout_latest_time_offset": lambda v: v.high,
    "kspout_latest_emitted_offset": lambda v: v.stats.emitted_to,
    "kspout_latest_completed_offset": lambda v: v.stats.commit_point,
    "kspout_committed_offset": lambda v: v.committed,
    "kspout_messages_acked_total": lambda v: v.stats.acked,
    "kspout_messages_retried_total": lambda v: v.stats.retried,
    "kspout_messages_dead_lettered_total": lambda v: v.stats.dead_lettered,
    "kspout_dead_letters_pending": lambda v: v.stats.dead_letter_pending,
    "kspout_messages_in_flight": lambda v: v.stats.in_flight,
    "kspout_messages_waiting_retry": lambda v: v.stats.waiting,
}


def assert_serves(samples: Samples, progress: Progress) -> None:
    """The endpoint shows exactly the figures of `progress`, partition by partition."""
    for name, figure in FIGURES.items():
        expected = {v.partition: figure(v) for v in progress.partitions}
        assert by_partition(samples, name) == expected, name
    invalid = {v.partition: v.stats.invalid for v in progress.partitions}
    assert by_partition(samples, "kspout_messages_failed_total", reason="invalid") == invalid
    timed_out = {v.partition: v.stats.timed_out for v in progress.partitions}
    assert by_partition(samples, "kspout_messages_failed_total", reason="timeout") == timed_out
    ages = by_partition(samples, "kspout_commit_age_seconds")
    assert sorted(ages) == sorted(v.partition for v in progress.partitions)
    assert all(0 <= age < WAIT for age in ages.values()), ages


def view(progress: Progress, partition: int) -> PartitionView:
    [found] = [v for v in progress.partitions if v.partition == partition]
    return found


def port_is_free(port: int) -> bool:
    try:
        socket.create_server((LOOPBACK, port)).close()
    except OSError:
        return False
    return True


def test_the_endpoint_serves_the_driver_figures_while_it_runs_and_frees_its_port(
    make_config: Callable[..., TopicConfig], producer: Producer, zk: KazooClient
) -> None:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}/metrics"
    config = make_config(
        metrics={"host": LOOPBACK, "port": port},
        batch_size=5,
        max_retries=1,
        retry_backoff={"initial": 1.0, "multiplier": 1.0, "max": 1.0},  # poison waits 1 s
    )
    produce(producer, config.topic, {p: range(400) for p in PARTITIONS})

    def step_until(done: Callable[[Progress], bool]) -> Progress:
        """Step by hand (no race with the loop) until `done`; the run must still be going."""
        deadline = time.monotonic() + WAIT
        while not done(progress := driver.progress()):
            assert time.monotonic() < deadline, "never happened"
            driver.step()
            time.sleep(0.01)
        assert progress.lag > 0, "the run should still be going"
        return progress

    with Driver(config, LocalExecutor(config, Triage()), metrics_interval=0) as driver:
        # The poison message failed once and waits for its retry: it holds the commit point.
        held = step_until(lambda now: view(now, POISON[0]).stats.emitted_to > 20)
        samples = scrape(url)
        assert_serves(samples, held)
        assert by_partition(samples, "kspout_messages_waiting_retry")[POISON[0]] == 1
        assert by_partition(samples, "kspout_latest_completed_offset")[POISON[0]] == POISON[1]
        assert by_partition(samples, "kspout_latest_emitted_offset")[POISON[0]] > 20
        assert by_partition(samples, "kspout_messages_failed_total", reason="invalid")[2] == 1

        # Its retry failed too: both given-up messages are on the dead-letter topic.
        dead = step_until(lambda now: now.total("dead_lettered") == 2)
        samples = scrape(url)
        assert_serves(samples, dead)
        lettered = by_partition(samples, "kspout_messages_dead_lettered_total")
        assert (lettered[POISON[0]], lettered[INVALID[0]]) == (1, 1)
        assert by_partition(samples, "kspout_messages_retried_total")[POISON[0]] == 1
        assert sum(by_partition(samples, "kspout_messages_acked_total").values()) > 0

        final = driver.run(until_caught_up=True)
        samples = scrape(url)
        assert_serves(samples, driver.progress())
        assert final.lag == 0 and final.total("acked") == 4 * 400 - 2
        assert sum(by_partition(samples, "kspout_spout_lag").values()) == 0
        assert sum(by_partition(samples, "kspout_messages_acked_total").values()) == 1598
        assert by_partition(samples, "kspout_latest_completed_offset") == dict.fromkeys(
            PARTITIONS, 400
        )
        driver_labels = {("topic", config.topic), ("spout_id", config.spout_id)}
        submitted = samples[("kspout_batches_submitted_total", frozenset(driver_labels))]
        durations = samples[("kspout_batch_duration_seconds_count", frozenset(driver_labels))]
        assert submitted == durations == final.batches  # every batch ended and was timed
        [info] = [labels for name, labels in samples if name == "kspout_instance_info"]
        assert dict(info)["instance_id"] == final.instance
        node = f"{config.zk_spout_path}/instances/{final.instance}"
        assert json.loads(zk.get(node)[0])["metrics"] == url  # what `kspout status` reads

    with pytest.raises(URLError):
        scrape(url)
    assert port_is_free(port)


def test_scrapes_during_a_threaded_run_see_each_moment_whole(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    """The loop runs in its own thread (a slow handler); scrapes come from this one."""
    port = free_port()
    url = f"http://{LOOPBACK}:{port}/metrics"
    config = make_config(metrics={"host": LOOPBACK, "port": port}, batch_size=20)
    produce(producer, config.topic, {p: range(150) for p in PARTITIONS})
    stop = threading.Event()

    def slow(record: Record) -> None:
        time.sleep(0.002)

    with Driver(config, LocalExecutor(config, slow), metrics_interval=0.1) as driver:
        result: list[Progress] = []
        runner = threading.Thread(
            target=lambda: result.append(driver.run(until_caught_up=True, stop=stop))
        )
        runner.start()
        try:
            seen = []
            while runner.is_alive():
                samples = scrape(url)
                completed = by_partition(samples, "kspout_latest_completed_offset")
                emitted = by_partition(samples, "kspout_latest_emitted_offset")
                latest = by_partition(samples, "kspout_latest_time_offset")
                lag = by_partition(samples, "kspout_spout_lag")
                for p in completed:  # figures of one moment agree with each other
                    assert completed[p] <= emitted[p] <= latest[p]
                    assert lag[p] == latest[p] - completed[p]
                acked = sum(by_partition(samples, "kspout_messages_acked_total").values())
                assert not seen or acked >= seen[-1]
                seen.append(acked)
                time.sleep(0.05)
        finally:
            stop.set()
            runner.join(WAIT)
        assert len(set(seen) - {0.0, 600.0}) >= 2, f"too few scrapes while it ran: {seen}"
        assert_serves(scrape(url), driver.progress())
        assert result[0].total("acked") == 600


def test_port_zero_picks_a_free_port_and_a_taken_port_is_a_config_error() -> None:
    data = {"topic": "t", "spout_id": "s", "brokers": "b:9092", "zookeeper": "z:2181"}
    config = parse_config(data | {"metrics": {"host": LOOPBACK, "port": 0}})
    with MetricsExporter(config) as exporter:
        assert exporter.port is not None and exporter.port > 0
        assert exporter.url == f"http://{LOOPBACK}:{exporter.port}/metrics"
        exporter.batch_ended(0.3)
        samples = scrape(exporter.url)
        labels = frozenset({("topic", "t"), ("spout_id", "s")})
        assert samples[("kspout_batch_duration_seconds_count", labels)] == 1
        assert ("kspout_spout_lag", labels) not in samples  # no snapshot yet: no figures
        assert any(name.startswith("process_") for name, _ in samples)

        taken = parse_config(data | {"metrics": {"host": LOOPBACK, "port": exporter.port}})
        with pytest.raises(ConfigError, match="metrics: cannot serve on"):
            MetricsExporter(taken).start()
    assert port_is_free(exporter.port)


# -- the consumer-group mirror ------------------------------------------------------------------


def group_offsets(brokers: str, group: str, topic: str) -> dict[int, int]:
    """The offsets `group` committed for `topic`, as any Kafka client sees them (none: absent)."""
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": group})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in PARTITIONS], timeout=10)
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_the_consumer_group_follows_the_zookeeper_commit_points(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    group = f"lag-tools-{uuid.uuid4().hex[:8]}"
    config = make_config(consumer_group=group, batch_size=30)
    produce(producer, config.topic, {p: range(120) for p in PARTITIONS})
    brokers = stack.info.brokers

    with Driver(config, LocalExecutor(config, lambda record: None)) as driver:
        for _ in range(2):
            driver.step()
            driver.drain()
        time.sleep(0.3)  # the last commit's mirror is answered by now
        driver.commit()
        midway = stored(config)
        assert all(0 < offset < 120 for offset in midway.values()), midway
        wait_for(lambda: group_offsets(brokers, group, config.topic) == midway, "midway")
        driver.run(until_caught_up=True)

    assert stored(config) == dict.fromkeys(PARTITIONS, 120)
    assert group_offsets(brokers, group, config.topic) == dict.fromkeys(PARTITIONS, 120)


def test_without_consumer_group_no_group_gets_offsets(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(50) for p in PARTITIONS})
    with Driver(config, LocalExecutor(config, lambda record: None)) as driver:
        driver.run(until_caught_up=True)
    assert stored(config) == dict.fromkeys(PARTITIONS, 50)
    # The group id every kspout consumer carries is never committed to.
    assert group_offsets(stack.info.brokers, f"kspout-{config.spout_id}", config.topic) == {}


def test_a_failed_mirror_is_logged_and_sent_again(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    topic_factory: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The topic does not exist yet, so the broker refuses the commit; once it exists, the
    next round sends the same offsets again."""
    group = f"retry-{uuid.uuid4().hex[:8]}"
    config = make_config(topic=topic_factory("missing", create=False), consumer_group=group)
    caplog.set_level(logging.WARNING, logger="kspout.kafka.group_mirror")

    with GroupMirror(config) as mirror:

        def refused() -> bool:
            mirror.mirror({0: 3})
            return "could not commit" in caplog.text

        wait_for(refused, "the commit to a missing topic was never refused")
        assert mirror.confirmed == {}
        create_topic(stack.info.brokers, config.topic)

        def confirmed() -> bool:
            mirror.mirror({0: 3})
            return mirror.confirmed == {0: 3}

        wait_for(confirmed, "the commit was not sent again")
    assert group_offsets(stack.info.brokers, group, config.topic) == {0: 3}


def test_an_unreachable_group_coordinator_never_blocks_the_loop(
    make_config: Callable[..., TopicConfig],
) -> None:
    config = make_config(brokers=f"{LOOPBACK}:{free_port()}", consumer_group="nobody-answers")
    mirror = GroupMirror(config)
    mirror.start()
    began = time.monotonic()
    for _ in range(3):
        mirror.mirror({0: 10, 1: 20})
    assert time.monotonic() - began < 0.5
    mirror.close()  # waits for the coordinator a bounded time
    assert time.monotonic() - began < 15
    assert mirror.confirmed == {}

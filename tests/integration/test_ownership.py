"""Several drivers on one spout id against the session's ZooKeeper and Kafka broker: the
partitions are divided, moved by `kspout rebalance`, paused, moved under a live owner with
`offsets set --force`, and the partitions `CreatePartitions` adds while they run are picked up.

The drivers run in threads of this process (each with its own ZooKeeper session); the tests
that kill or stop an instance run `kspout run` processes (test_ownership_processes.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from click.testing import CliRunner, Result
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka.records import Record
from kspout.ownership.tree import read_ownership
from tests.conftest import TopicFactory
from tests.integration.helpers import PARTITIONS, highs, open_store, produce, stored, topic_file

At = tuple[int, int]


class Handled:
    """A handler shared by several drivers' threads: counts each (partition, offset)."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.counts: Counter[At] = Counter()
        self._lock = threading.Lock()

    def __call__(self, record: Record) -> None:
        time.sleep(self.pause)
        with self._lock:
            self.counts[(record.partition, record.offset)] += 1


@contextmanager
def running(
    config: TopicConfig, handler: Callable[[Record], None], count: int = 1
) -> Iterator[list[Driver]]:
    """`count` started drivers, each looping in its own thread until the block ends."""
    stop = threading.Event()
    with ExitStack() as stack:
        drivers = [
            stack.enter_context(Driver(config, LocalExecutor(config, handler)))
            for _ in range(count)
        ]
        threads = [threading.Thread(target=d.run, kwargs={"stop": stop}) for d in drivers]
        for thread in threads:
            thread.start()
        try:
            yield drivers
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)


def claims(config: TopicConfig) -> dict[int, str]:
    with open_store(config) as store:
        return read_ownership(store.session).claims


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy (AssertionError after `timeout`)."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.1)
    return result


def caught_up(config: TopicConfig) -> bool:
    return stored(config) == highs(config)


def cli(command: str, config_path: Any, *args: str) -> Result:
    """`kspout <command> --config <file> <args>`, in this process."""
    return CliRunner().invoke(main, [*command.split(), "--config", str(config_path), *args])


def test_two_drivers_divide_the_partitions_and_rebalance_move_moves_them_while_flowing(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Any
) -> None:
    config = make_config(batch_size=20)
    toml = topic_file(tmp_path / "topic.toml", stack, config)
    produce(producer, config.topic, {p: range(300) for p in PARTITIONS})
    handler = Handled(pause=0.002)
    with running(config, handler, count=2) as (a, b):
        ids = {a.progress().instance, b.progress().instance}

        def halves() -> dict[int, str] | None:
            found = claims(config)
            return found if Counter(found.values()) == dict.fromkeys(ids, 2) else None

        split = eventually(halves, what="two partitions each")
        mine_a = sorted(p for p, owner in split.items() if owner == a.progress().instance)
        before = dict(handler.counts)

        flowing = threading.Thread(
            target=produce, args=(producer, config.topic, {p: range(300, 600) for p in PARTITIONS})
        )
        flowing.start()
        moved = cli(
            "rebalance",
            toml,
            "--move",
            ",".join(map(str, mine_a)),
            "--to",
            b.progress().instance,
            "--json",
        )
        flowing.join()
        assert moved.exit_code == 0, moved.output
        rows = json.loads(moved.stdout)["partitions"]
        assert sorted(r["partition"] for r in rows) == mine_a
        assert {r["to"] for r in rows} == {b.progress().instance}
        assert claims(config) == dict.fromkeys(PARTITIONS, b.progress().instance)
        assert not a.progress().partitions  # a let them go

        eventually(lambda: caught_up(config), what="every offset committed")
        assert len(handler.counts) > len(before)  # messages kept flowing

    # Nothing lost; a release commits first, so few (if any) offsets ran twice.
    assert set(handler.counts) == {(p, o) for p in PARTITIONS for o in range(600)}
    twice = sum(n - 1 for n in handler.counts.values())
    assert twice <= 2 * config.batch_size * len(PARTITIONS), twice


def test_pause_resume_and_offsets_set_force_go_through_the_owner(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Any
) -> None:
    config = make_config()
    toml = topic_file(tmp_path / "topic.toml", stack, config)
    produce(producer, config.topic, {p: range(100) for p in PARTITIONS})
    handler = Handled()
    with running(config, handler) as (driver,):
        eventually(lambda: caught_up(config), what="the first 100 per partition")

        paused = cli("pause", toml, "--partition", "0", "--json")
        assert paused.exit_code == 0, paused.output
        (row,) = json.loads(paused.stdout)["partitions"]
        assert row["acked"] and row["owner"] == driver.progress().instance and row["offset"] == 100
        produce(producer, config.topic, {0: range(100, 150), 1: range(100, 150)})
        eventually(lambda: stored(config)[1] == 150, what="partition 1 flows")
        time.sleep(1.0)  # several commit intervals
        assert stored(config)[0] == 100 and (0, 100) not in handler.counts
        status = {v.partition: v.status for v in driver.progress().partitions}
        assert status[0] == "paused" and status[1] == "running"

        resumed = cli("resume", toml, "--partition", "0", "--json")
        answer = json.loads(resumed.stdout)
        assert answer["action"] == "resume"
        assert answer["partitions"] == [{"partition": 0, "changed": True, "paused": False}]
        eventually(lambda: stored(config)[0] == 150, what="partition 0 resumes")

        refused = cli("offsets set", toml, "--partition", "2", "--to", "50")
        assert refused.exit_code == 1 and "--force" in refused.stderr
        assert driver.progress().instance in refused.stderr
        forced = cli("offsets set", toml, "--partition", "2", "--to", "50", "--force", "--json")
        assert forced.exit_code == 0, forced.output
        assert json.loads(forced.stdout)["partitions"][0]["to"] == 50
        eventually(lambda: all(handler.counts[(2, o)] == 2 for o in range(50, 100)), what="replay")
        eventually(lambda: caught_up(config), what="caught up after the move")
        assert read_paused(config) == {}  # --force resumed what it paused

    assert all(handler.counts[(2, o)] == 1 for o in range(50))


def read_paused(config: TopicConfig) -> dict[int, Any]:
    with open_store(config) as store:
        return read_ownership(store.session).paused


def test_partitions_added_while_two_instances_run_are_owned_and_consumed(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    topic_factory: TopicFactory,
    producer: Producer,
) -> None:
    topic = topic_factory("growing", partitions=2)
    config = make_config(topic=topic, partition_refresh=0.5)
    produce(producer, topic, {0: range(20), 1: range(20)})
    handler = Handled()
    with running(config, handler, count=2) as (a, b):
        ids = {a.progress().instance, b.progress().instance}
        eventually(lambda: stored(config) == {0: 20, 1: 20}, what="the first two partitions")
        assert set(claims(config)) == {0, 1}

        admin = AdminClient({"bootstrap.servers": stack.info.brokers})
        admin.create_partitions([NewPartitions(topic, len(PARTITIONS))])[topic].result(30)
        # The broker grew the topic; a producer with fresh metadata writes to 2 and 3.
        assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 4
        fresh = Producer({"bootstrap.servers": stack.info.brokers})
        produce(fresh, topic, {p: range(20 if p < 2 else 0, 30) for p in PARTITIONS})

        # Only the leader lists the topic: the other instance learns of 2 and 3 from the
        # assignment in ZooKeeper, and must still be able to claim and fetch its new one.
        def spread() -> dict[int, str] | None:
            found = claims(config)
            return found if Counter(found.values()) == dict.fromkeys(ids, 2) else None

        eventually(spread, what="two partitions each, the new ones included")
        eventually(lambda: stored(config) == dict.fromkeys(PARTITIONS, 30), what="all consumed")
        runs = {v.partition for d in (a, b) for v in d.progress().partitions}
        assert runs == set(PARTITIONS)

    # Nothing lost on the new partitions or the old; a moved partition replays little, if any.
    assert set(handler.counts) == {(p, o) for p in PARTITIONS for o in range(30)}
    assert all(handler.counts[(p, o)] == 1 for p in (2, 3) for o in range(30))
    twice = sum(n - 1 for n in handler.counts.values())
    assert twice <= 2 * config.batch_size, twice

"""The nemesis's faults, each injected for real and checked as struck, and their schedule.

A `Strike` records one fault: what it hit, when it began and when its injection was over,
whether it really struck (the process died or stopped, the flag was taken), the partitions
it touched (for the time to recover), and what showed it. The kinds:

* `instance_kill`: SIGKILL a `kspout run` instance, start it again at once. Struck: it exited by
  SIGKILL. Touched: the partitions it claimed.
* `hang`: the next handler run sleeps past `message_timeout` (`job.py`'s flag). Struck: a run
  took the flag and slept. Touched: the partitions its instance claimed.
* `broker_kill`: SIGKILL a random Kafka node, start it again after `BROKER_DOWN` seconds. Struck:
  it died. Touched: the partitions it led.
* `leader_kill`: SIGKILL the leader of a random partition; once Kafka names another leader,
  start it again. Struck: it died and leadership moved. Touched: the partitions it led.
* `zookeeper_restart`: SIGKILL ZooKeeper and start it again at once (with its data), an outage
  shorter than the instances' session timeout. Touched: every partition (nothing commits).
* `redis_restart`: SIGKILL Redis and start it again from its append-only file. Struck: it died
  and came back holding at least the effects it held before. Touched: every partition.
* `zombie`: SIGSTOP an instance until its ZooKeeper session expired and its partitions were
  claimed by the others, then SIGCONT it. Struck: it was stopped (state T) and its partitions
  moved. Touched: the partitions it claimed.

Each broker fault waits, after the node is back, until every replica is in sync again, so the
next one never finds a partition short of `min.insync.replicas`.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient

from bench.nemesis.monitor import Monitor
from bench.nemesis.stack import Instance, Servers
from kspout.config import TopicConfig

KINDS = (
    "instance_kill",
    "hang",
    "broker_kill",
    "leader_kill",
    "zookeeper_restart",
    "redis_restart",
    "zombie",
)
BROKER_DOWN = 3.0  # seconds a killed broker stays down
HANG_PAST = 3.0  # seconds a hung handler sleeps past message_timeout
WAIT = 60.0  # seconds any step of a fault may take before it counts as not struck


@dataclass(frozen=True, slots=True)
class Planned:
    at: float  # seconds from the feed's start
    kind: str


@dataclass
class Strike:
    kind: str
    target: str
    began: float  # time.monotonic() when it struck
    over: float  # when the injection ended (restarted, continued, woke)
    struck: bool
    evidence: str
    partitions: list[int]  # those it touched


def schedule(seed: int, start: float, window: float, gap: tuple[float, float]) -> list[Planned]:
    """When each fault strikes, in seconds from the feed's start: from `start` on, a gap drawn
    from `gap` apart; every kind once first (shuffled), then kinds at random while the next
    one still falls within `window` seconds."""
    rng = random.Random(seed)
    kinds = list(KINDS)
    rng.shuffle(kinds)
    plan: list[Planned] = []
    at = start
    while kinds or at < window:
        plan.append(Planned(at, kinds.pop(0) if kinds else rng.choice(KINDS)))
        at += rng.uniform(*gap)
    return plan


def until(check: Callable[[], bool], seconds: float = WAIT, every: float = 0.1) -> bool:
    """Poll `check` until true (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


class Nemesis:
    """Strikes faults of each kind at the servers and instances it is given."""

    def __init__(
        self,
        config: TopicConfig,
        servers: Servers,
        instances: list[Instance],
        monitor: Monitor,
        hang_flag: Path,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.servers = servers
        self.instances = instances
        self.monitor = monitor
        self.hang_flag = hang_flag
        self.rng = rng

    def strike(self, kind: str) -> Strike:
        inject: Callable[[], Strike] = getattr(self, kind)
        return inject()

    # -- instances ---------------------------------------------------------------------------

    def instance_kill(self) -> Strike:
        victim = self.rng.choice(self.instances)
        pid = victim.pid
        _, held = self.monitor.held_by(pid)
        began = time.monotonic()
        code = victim.kill()
        victim.start()
        evidence = f"pid {pid} exit status {code}; it claimed partitions {held}"
        return Strike(
            "instance_kill", victim.name, began, time.monotonic(), code == -9, evidence, held
        )

    def hang(self) -> Strike:
        seconds = self.config.message_timeout + HANG_PAST
        began = time.monotonic()
        self.hang_flag.write_text(str(seconds))
        if not until(lambda: not self.hang_flag.exists()):
            self.hang_flag.unlink(missing_ok=True)
            return Strike("hang", "nobody", began, time.monotonic(), False, "flag not taken", [])
        taken = [p for p in self.hang_flag.parent.glob(self.hang_flag.name + ".*")]
        pid = int(taken[0].suffix[1:])
        taken[0].unlink()  # the next hang's taker is then the only one
        victim = next(i for i in self.instances if i.running and i.pid == pid)
        _, held = self.monitor.held_by(pid)
        log = victim.incarnations[-1]
        woken = log.read_text().count("\nwoke ")  # earlier hangs of this process
        woke = until(lambda: log.read_text().count("\nwoke ") > woken, seconds + WAIT)
        lines = log.read_text().splitlines()
        slept = [float(x.split()[2]) for x in lines if x.startswith(("hang ", "woke "))][-2:]
        took = slept[1] - slept[0] if woke and len(slept) == 2 else 0.0
        evidence = (
            f"pid {pid} slept {took:.1f} s (message_timeout {self.config.message_timeout:g} s)"
        )
        struck = took > self.config.message_timeout
        return Strike("hang", victim.name, began, time.monotonic(), struck, evidence, held)

    def zombie(self) -> Strike:
        victim = self.rng.choice([i for i in self.instances if i.running])
        id_, held = self.monitor.held_by(victim.pid)
        began = time.monotonic()
        victim.freeze()
        stopped = until(victim.stopped_by_signal, 5.0, every=0.01)

        def moved() -> bool:
            owners = self.monitor.latest.owners
            return all(owners.get(p) not in (None, id_) for p in held)

        gone = until(moved, self.config.zk_session_timeout + WAIT, every=0.05)
        moved_after = time.monotonic() - began
        victim.thaw()
        over = time.monotonic()
        evidence = (
            f"pid {victim.pid} stopped (state T: {stopped}) for {over - began:.1f} s; its "
            f"partitions {held} claimed by others after {moved_after:.1f} s: {gone}"
        )
        return Strike("zombie", victim.name, began, over, stopped and gone, evidence, held)

    # -- servers -----------------------------------------------------------------------------

    def broker_kill(self) -> Strike:
        node_id = self.rng.choice([n.node_id for n in self.servers.kafka.nodes])
        node = self.servers.node(node_id)
        led = self.led_by(node_id)
        began = time.monotonic()
        node.kill()
        died = not node.running
        time.sleep(BROKER_DOWN)
        node.start()
        over = time.monotonic()
        synced = until(self.in_sync)
        evidence = (
            f"SIGKILLed, down {over - began:.1f} s; it led partitions {led}; "
            f"replicas in sync again: {synced}"
        )
        return Strike("broker_kill", f"broker {node_id}", began, over, died, evidence, led)

    def leader_kill(self) -> Strike:
        partition = self.rng.choice(sorted(self.leaders()))
        node_id = self.leaders()[partition]
        node = self.servers.node(node_id)
        led = self.led_by(node_id)
        began = time.monotonic()
        node.kill()
        died = not node.running

        def moved() -> bool:
            with contextlib.suppress(KafkaException):  # the dead node was the controller
                now = self.leaders()
                return all(now[p] not in (node_id, -1) for p in led)
            return False

        failed_over = until(moved, every=0.25)
        over = time.monotonic()
        node.start()
        synced = until(self.in_sync)
        evidence = (
            f"leader of partition {partition}; it led {led}; new leaders after "
            f"{over - began:.1f} s: {failed_over}; replicas in sync again: {synced}"
        )
        target = f"broker {node_id} (leader of p{partition})"
        return Strike("leader_kill", target, began, over, died and failed_over, evidence, led)

    def zookeeper_restart(self) -> Strike:
        zookeeper = self.servers.stack.zookeeper
        began = time.monotonic()
        zookeeper.kill()
        died = not zookeeper.running
        zookeeper.start()
        over = time.monotonic()
        evidence = (
            f"SIGKILLed, answering again after {over - began:.1f} s (session timeout "
            f"{self.config.zk_session_timeout:g} s)"
        )
        every = sorted(self.monitor.latest.commits)
        return Strike("zookeeper_restart", "ZooKeeper", began, over, died, evidence, every)

    def redis_restart(self) -> Strike:
        server = self.servers.stack.redis
        key = f"{self.config.spout_id}:effects"
        before = int(redis.Redis.from_url(server.url).get(key) or 0)
        began = time.monotonic()
        server.kill()
        died = not server.running
        server.start()
        over = time.monotonic()
        after = int(redis.Redis.from_url(server.url).get(key) or 0)
        evidence = (
            f"SIGKILLed, back from its append-only file after {over - began:.1f} s; "
            f"effects {before} before the kill, {after} after"
        )
        every = sorted(self.monitor.latest.commits)
        struck = died and after >= before
        return Strike("redis_restart", "Redis", began, over, struck, evidence, every)

    # -- Kafka's view ------------------------------------------------------------------------

    def _describe(self) -> list[tuple[int, int, int, int]]:
        """`(partition, leader, in-sync replicas, replicas)` of the topic's partitions."""
        topic = self.config.topic
        # A client of its own each time: one kept from before a node died may wait on it.
        admin = AdminClient({"bootstrap.servers": self.servers.brokers, "log_level": 0})
        found = admin.describe_topics(TopicCollection([topic]), request_timeout=10)
        return [
            (p.id, -1 if p.leader is None else p.leader.id, len(p.isr), len(p.replicas))
            for p in found[topic].result(timeout=15).partitions
        ]

    def leaders(self) -> dict[int, int]:
        return {p: leader for p, leader, _, _ in self._describe()}

    def led_by(self, node_id: int) -> list[int]:
        return sorted(p for p, leader in self.leaders().items() if leader == node_id)

    def in_sync(self) -> bool:
        with contextlib.suppress(KafkaException):
            return all(isr == replicas for _, _, isr, replicas in self._describe())
        return False

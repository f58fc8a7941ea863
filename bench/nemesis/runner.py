"""One nemesis run, start to end: the servers, the topic, the instances, the feed and the
monitor; the faults on their schedule; the drain; the stop; the verdict."""

from __future__ import annotations

import random
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.nemesis.faults import Nemesis, Strike, schedule
from bench.nemesis.ledger import Feed, Ledger
from bench.nemesis.monitor import Monitor
from bench.nemesis.stack import Instance, Servers
from bench.nemesis.verdict import Verdict, at_highs, high_watermarks, judge, read_sinks
from kspout.config import TopicConfig, load_config
from kspout.devstack import create_topic
from kspout.devstack.processes import log_tail

SESSION = 6.0  # zk_session_timeout: a zombie is stopped past it; ZooKeeper's restart is shorter
MESSAGE_TIMEOUT = 4.0  # a hung handler sleeps past it
FIRST_FAULT = 8.0  # seconds into the feed: the instances have claimed their partitions
GAP = (8.0, 14.0)  # seconds between faults' planned starts


@dataclass(frozen=True, slots=True)
class Options:
    messages: int
    minutes: float
    instances: int
    seed: int
    brokers: int = 3
    partitions: int = 6
    drain: float = 180.0  # seconds the run may take to catch up once the feed and faults ended
    keep: str | None = None  # a folder for the servers' data and the logs, kept afterwards


COLUMNS = ("fault", "at_s", "target", "struck", "recovery_s", "redelivered", "replays")


@dataclass
class Report:
    verdict: Verdict
    strikes: list[Strike]
    seconds: dict[str, float]  # how long each phase took
    crashes: list[str]  # instances found dead that no fault killed

    def json(self) -> dict[str, object]:
        return {
            "ok": self.verdict.ok and not self.crashes,
            "checks": self.verdict.checks,
            "faults": [
                dict(
                    zip(
                        COLUMNS,
                        row,
                        strict=True,
                    )
                )
                for row in self.verdict.rows
            ],
            "evidence": [f"{s.kind}: {s.evidence}" for s in self.strikes],
            "crashes": self.crashes,
            "figures": self.verdict.figures,
            "seconds": self.seconds,
        }


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def topic_file(path: Path, servers: Servers, name: str) -> TopicConfig:
    """The instances' topic file (small batches, short timeouts: faults show within seconds)."""
    path.write_text(
        f"""\
topic = "{name}"
spout_id = "{name}"
topology_name = "nemesis"
zk_root = "/nemesis"
brokers = "{servers.brokers}"
zookeeper = "{servers.stack.info.zookeeper}"
dead_letter_topic = "{name}.dlq"
batch_size = 100
max_batches_in_flight = 2
max_retries = 2
retry_backoff = {{ initial = 0.05, multiplier = 2.0, max = 0.5 }}
infra_backoff = {{ initial = 0.2, multiplier = 2.0, max = 1.0 }}
commit_interval = 0.5
fetch_timeout = 5.0
message_timeout = {MESSAGE_TIMEOUT}
defer_delay = 0.5
zk_session_timeout = {SESSION}

[redis]
url = "{servers.stack.info.redis_url}"

[dedup]
id_source = "key"
lease = 10.0

[kafka]
log_level = 0
"""
    )
    return load_config(path)


def caught_up(config: TopicConfig, monitor: Monitor) -> bool:
    return at_highs(monitor.latest.commits, high_watermarks(config))


def run(options: Options) -> Report:
    seconds: dict[str, float] = {}
    crashes: list[str] = []
    with ExitStack() as stack:
        if options.keep is None:
            workdir = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="kspout-nemesis-"))
            )
        else:
            workdir = Path(options.keep)
            workdir.mkdir(parents=True)
        began = time.monotonic()
        servers = Servers(workdir, options.brokers)
        say(f"starting {options.brokers} Kafka brokers, ZooKeeper and Redis in {workdir}...")
        servers.start()
        stack.callback(servers.stop)
        seconds["servers"] = time.monotonic() - began

        name = f"nemesis-{uuid.uuid4().hex[:8]}"
        replication = options.brokers
        settings = {"min.insync.replicas": str(min(2, replication))}
        create_topic(
            servers.brokers, name, options.partitions, replication=replication, config=settings
        )
        create_topic(servers.brokers, f"{name}.dlq", 1, replication=replication, config=settings)
        config = topic_file(workdir / "topic.toml", servers, name)

        hang_flag = workdir / "hang"
        instances = [
            Instance(i, workdir / "topic.toml", hang_flag, workdir)
            for i in range(options.instances)
        ]
        for instance in instances:
            stack.callback(instance.close)
            instance.start()
        monitor = Monitor(config)
        monitor.start()
        stack.callback(monitor.stop)

        ledger = Ledger()
        window = options.minutes * 60
        feed = Feed(servers.brokers, name, options.messages, window, options.seed, ledger)
        plan = schedule(options.seed, FIRST_FAULT, window, GAP)
        say(
            f"{options.instances} instances of `kspout run` (in-process executor); "
            f"{options.messages} messages over {window:.0f} s; faults: "
            + ", ".join(f"{p.kind}@{p.at:.0f}s" for p in plan)
        )
        nemesis = Nemesis(
            config, servers, instances, monitor, hang_flag, random.Random(options.seed + 1)
        )
        feed.start()
        started = time.monotonic()
        strikes: list[Strike] = []
        for planned in plan:
            time.sleep(max(0.0, started + planned.at - time.monotonic()))
            crashes += restart_crashed(instances)
            strike = nemesis.strike(planned.kind)
            say(f"{strike.began - started:6.1f}s {strike.kind} {strike.target}: {strike.evidence}")
            strikes.append(strike)
        seconds["faults"] = time.monotonic() - started
        feed.finish()
        feed.join(max(0.0, started + window - time.monotonic()) + 120)
        seconds["feed"] = time.monotonic() - started

        drained = time.monotonic()
        while not caught_up(config, monitor):
            crashes += restart_crashed(instances)
            if time.monotonic() - drained > options.drain:
                say(f"not caught up {options.drain:g} s after the feed and the faults ended")
                break
            time.sleep(0.5)
        seconds["drain"] = time.monotonic() - drained
        crashes += restart_crashed(instances)
        for instance in instances:
            instance.stop()
        monitor.stop()
        sinks = read_sinks(config)
        logs = [log for i in instances for log in i.incarnations]
        verdict = judge(ledger, sinks, strikes, monitor.samples, logs, started)
        verdict.figures["commits_refused"] = sum(refusals(log.with_suffix(".err")) for log in logs)
        seconds["total"] = time.monotonic() - began
        return Report(verdict, strikes, {k: round(v, 1) for k, v in seconds.items()}, crashes)


def restart_crashed(instances: list[Instance]) -> list[str]:
    """Start again each instance that exited with no fault's doing; what was found."""
    found = []
    for instance in instances:
        if not instance.running:
            code = instance.process.returncode if instance.process else None
            err = log_tail(instance.incarnations[-1].with_suffix(".err"), 5)
            found.append(f"{instance.name} exited by itself (status {code}): {err}")
            say(found[-1])
            instance.start()
    return found


def refusals(path: Path) -> int:
    """Commits an instance's log says ZooKeeper refused (a zombie's, after it woke)."""
    try:
        return path.read_text(errors="replace").count("commit refused")
    except OSError:
        return 0

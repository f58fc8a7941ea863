"""The exactly-once chaos test: faults everywhere, and every id's effect applied exactly once.

On Spark `local[2]` and the embedded stack, tens of thousands of messages with unique ids run
through the dedup bolt (tests/chaos/jobs.py) while the test injects, besides the handler's own
faults (exceptions, slow messages that time out and finish or throw later, Python workers
killed mid-batch):

* its `redis-server` SIGKILLed (append-only file, `appendfsync everysec`) while the first
  driver runs, and started again once a batch has found it down (`faults.ProbedIdempotencyBolt`;
  Redis cannot count its own outage), `REDIS_OUTAGE` seconds later at the earliest;
* the first driver, a separate process, killed outright (SIGKILL) mid-run;
* a second driver that resumes from ZooKeeper's commit points and runs until caught up.

It runs twice: with the effect in Redis (applied with the DONE mark), and with the effect in
PostgreSQL through the fenced SQL sink (committed with the id's fence row), where a zombie's late
write must be refused by the database itself.

Verified: every id's effect was applied exactly once (its counter is 1), none is missing, and
ZooKeeper's commit points reached the high watermarks; the Redis kill struck a batch. The test
prints both lists. (What a SIGKILL of Redis loses, record by record, and a machine crash's
loss of the last second are in test_redis_kill.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import psycopg
import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.spout import KafkaSpout
from tests.chaos.faults import spool_strikes
from tests.chaos.jobs import DRIVER, applied_table, chaos_bolt, create_tables, postgres_sink
from tests.integration.helpers import FAST_BACKOFF, PARTITIONS, highs, stored

MESSAGES = 24_000
FAULTS = {"kill": 2, "slow": 2, "slow_raise": 2}  # placed at random offsets
RAISE_SHARE = 0.03  # of the remaining messages
REDIS_OUTAGE = 2.0  # seconds the killed redis-server stays down at least: batches run into it


def produce_chaos_stream(producer: Producer, topic: str, seed: int = 11) -> Counter[str]:
    """Messages with unique ids and scripted faults; returns how many of each fault."""
    rng = random.Random(seed)
    special = rng.sample(range(MESSAGES), sum(FAULTS.values()))
    planned = dict(zip(special, [f for f, n in FAULTS.items() for _ in range(n)], strict=True))
    faults: Counter[str] = Counter()
    for n in range(MESSAGES):
        fault = planned.get(n) or ("raise" if rng.random() < RAISE_SHARE else "none")
        faults[fault] += 1
        value = json.dumps({"id": f"m{n}", "fault": fault}).encode()
        while True:
            try:
                producer.produce(topic, value, f"m{n}".encode(), partition=n % len(PARTITIONS))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(30) == 0
    return faults


def write_config(path: Path, config: TopicConfig) -> Path:
    """The settings the chaos driver runs with, as a TOML file for the killed process."""
    backoff = FAST_BACKOFF
    path.write_text(
        f"""\
topic = "{config.topic}"
spout_id = "{config.spout_id}"
zk_root = "{config.zk_root}"
brokers = "{config.brokers}"
zookeeper = "{config.zookeeper}"
batch_size = {config.batch_size}
max_batches_in_flight = {config.max_batches_in_flight}
max_retries = {config.max_retries}
message_timeout = {config.message_timeout}
defer_delay = {config.defer_delay}
commit_interval = {config.commit_interval}

[retry_backoff]
initial = {backoff["initial"]}
multiplier = {backoff["multiplier"]}
max = {backoff["max"]}

[redis]
url = "{config.redis.url}"

[dedup]
id_source = "key"
lease = {config.dedup.lease}
"""
    )
    return path


class Ledger(Protocol):
    """Where the chaos handler's effects land: how often each id was applied."""

    def total(self) -> int:
        """How many ids were applied so far (0 while the store is unreachable)."""
        ...

    def counts(self) -> dict[str, int]: ...


class RedisLedger:
    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client = client
        self.key = key

    def total(self) -> int:
        try:
            return int(self.client.hlen(self.key))
        except redis.ConnectionError:
            return 0  # Redis is restarting

    def counts(self) -> dict[str, int]:
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.key).items()}


class PostgresLedger:
    def __init__(self, url: str, table: str) -> None:
        self.url = url
        self.table = table

    def total(self) -> int:
        with psycopg.connect(self.url) as conn:
            row = conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
        return int(row[0]) if row else 0

    def counts(self) -> dict[str, int]:
        with psycopg.connect(self.url) as conn:
            return dict(conn.execute(f"SELECT id, n FROM {self.table}").fetchall())


def wait_for(predicate: Callable[[], bool], what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while not predicate():
        assert proc.poll() is None, f"the driver exited before {what}"
        assert time.monotonic() < deadline, f"no progress: waited 180 s for {what}"
        time.sleep(0.2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("effects_in", ["redis", "postgres"])
def test_every_effect_applied_exactly_once_through_faults_kills_and_restarts(
    spark: SparkSession,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    effects_in: str,
) -> None:
    config = make_config(
        batch_size=2000,
        max_batches_in_flight=3,
        max_retries=6,
        message_timeout=5.0,
        defer_delay=0.5,
        commit_interval=0.5,
        redis={"url": stack.info.redis_url},
        dedup={"id_source": "key", "lease": 7.0},
    )
    faults = produce_chaos_stream(producer, config.topic)
    struck_key = f"{config.topic}:struck"
    postgres_url = request.getfixturevalue("postgres").url if effects_in == "postgres" else None
    ledger: Ledger
    if postgres_url is None:
        ledger = RedisLedger(redis_client, f"{config.topic}:applied")
    else:
        create_tables(postgres_sink(config, postgres_url))
        ledger = PostgresLedger(postgres_url, applied_table(config.spout_id))
    applied = ledger.total

    # 1. The first driver, a separate process with its own Spark, killed outright mid-run;
    #    Redis restarts (append-only file on) while it runs.
    config_file = write_config(tmp_path / "chaos.toml", config)
    spool = tmp_path / "redis-down.spool"
    command = [sys.executable, "-c", DRIVER, str(config_file), str(spool)]
    if postgres_url is not None:
        command.append(postgres_url)
    repo = Path(__file__).resolve().parents[2]
    driver = subprocess.Popen(
        command, cwd=repo, env=dict(os.environ), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "driver.log").open("wb"),
    )  # fmt: skip
    try:
        wait_for(lambda: applied() >= MESSAGES // 6, "a sixth was applied", driver)
        stack.redis.kill()  # SIGKILL, appendfsync everysec: no clean flush of the file
        killed = time.monotonic()
        # down till a batch has run into it (workers that a kill fault crashed may take longer
        # to come back than the outage lasts), and REDIS_OUTAGE seconds at least
        wait_for(lambda: spool_strikes(spool) >= 1, "a batch to find Redis down", driver)
        time.sleep(max(0.0, killed + REDIS_OUTAGE - time.monotonic()))
        stack.redis.start()
        restarted_at = applied()
        wait_for(lambda: applied() >= MESSAGES // 3, "a third was applied", driver)
        driver.send_signal(signal.SIGKILL)
        killed_at = applied()
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
    time.sleep(2)  # its Spark JVM and Python workers notice and exit; kill any straggler
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)
    assert killed_at < MESSAGES, "the first driver finished before it was killed"

    # 2. A second driver resumes from ZooKeeper and runs until every offset is finished.
    progress = KafkaSpout(config, spark).run(chaos_bolt(config, postgres_url), until_caught_up=True)

    counts = ledger.counts()
    struck = {k.decode(): int(v) for k, v in redis_client.hgetall(struck_key).items()}
    sink = {k.decode(): int(v) for k, v in redis_client.hgetall(f"{config.topic}:sink").items()}
    expected = {f"m{n}" for n in range(MESSAGES)}
    missing = expected - set(counts)
    twice = {i: c for i, c in counts.items() if c != 1}
    print(
        f"\neffects in {effects_in}: {MESSAGES} messages with unique ids; "
        f"faults planned {dict(faults)}; "
        f"faults that struck {struck}; redis-server SIGKILLed, and started again after "
        f"{restarted_at} applied; {spool_strikes(spool)} batch(es) found it down; "
        f"driver SIGKILLed after {killed_at} applied; second driver: "
        f"{progress.total('acked')} acked, {progress.total('duplicates')} duplicates, "
        f"{progress.total('deferred')} deferred, {progress.total('retried')} retried, "
        f"{progress.total('timed_out')} timed out, {progress.batch_errors} failed batches"
        + (f"; the SQL sink answered {sink or 'APPLIED only'}" if postgres_url else "")
    )
    print(
        f"verified: {len(counts)} ids applied, {len(missing)} missing, "
        f"{len(twice)} applied more than once; commit points {stored(config)} "
        f"= high watermarks {highs(config)}"
    )
    assert not missing, f"lost: {sorted(missing)[:10]}"
    assert not twice, f"applied more than once: {dict(list(twice.items())[:10])}"
    assert stored(config) == highs(config)
    assert spool_strikes(spool) >= 1, "no batch ran into the Redis outage"
    # The faults really happened: each on its message's first handler run (fewer only where
    # the Redis kill lost the last second's counts).
    for fault, planned in faults.items():
        if fault != "none":
            assert 1 <= struck.get(fault, 0) <= planned, fault

"""The chaos test's job: an exactly-once handler with scripted faults, run behind the dedup bolt.

Each message is JSON `{"id": ..., "fault": kind}` keyed by its id. The handler's only effect
counts the id once, so at the end every id must hold exactly 1. It goes to one of two places:

* Redis: `HINCRBY <topic>:applied <id> 1`, applied by the dedup bolt atomically with marking the
  id DONE;
* PostgreSQL: an upsert `n = n + 1` of the id's row in `applied_<spout id>`, through the fenced
  SQL sink (`dedup.postgres.PostgresSink`) in one transaction with the id's fence row. The sink's
  answers other than APPLIED are counted in `<topic>:sink` (a plain write), to show that zombies
  and replays after a commit really met the fence.

A fault strikes on the first run of its message's handler only, whatever attempt that is
(`HSETNX <topic>:struck-ids <id>`), so every message can finish, and every planned fault
strikes: a message whose first lease died with its worker or its driver before the handler
ran it still strikes on the attempt that runs it:

* `raise`: the handler raises (a plain EXCEPTION failure, retried).
* `slow`: sleeps past `message_timeout`, then succeeds: replays meet its live lease (DEFERRED)
  and, once it is done, find DONE (DUPLICATE).
* `slow_raise`: sleeps past `message_timeout`, then raises: the replay after it leases again.
* `kill`: kills its own Python worker mid-batch (SIGKILL): the task's leases are never settled
  and must be leased again once they end.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import psycopg
import redis

from dedup import Effects, IdempotencyBolt
from dedup.errors import FencedOut
from dedup.postgres import PostgresSink, SinkOutcome
from kspout.config import TopicConfig, load_config
from kspout.kafka import Record
from tests.chaos.faults import ProbedIdempotencyBolt


@cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@dataclass(frozen=True, slots=True)
class ChaosHandler:
    """Applies each message once, after the faults its message asks for, as a Redis effect or,
    with a `sink`, in PostgreSQL.

    Each fault that strikes is also counted in `<topic>:struck` (a plain write, not an effect),
    so the test can show the faults really happened; `<topic>:struck-ids` holds the ids whose
    fault struck.
    """

    topic: str
    redis_url: str
    slow_seconds: float
    sink: PostgresSink | None = None

    def __call__(self, record: Record, effects: Effects) -> None:
        message = json.loads(record.value or b"{}")
        fault = message["fault"]
        if fault != "none":
            client = _redis(self.redis_url)
            if client.hsetnx(f"{self.topic}:struck-ids", message["id"], 1):
                client.hincrby(f"{self.topic}:struck", fault, 1)
            else:
                fault = "none"  # it struck on an earlier run
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault in ("slow", "slow_raise"):
            time.sleep(self.slow_seconds)
        if fault in ("raise", "slow_raise"):
            raise RuntimeError(f"injected {fault} for {message['id']}")
        if self.sink is None:
            effects.hincrby(f"{self.topic}:applied", effects.id)
            return
        count = partial(count_applied, applied_table(self.sink.namespace), effects.id)
        try:
            outcome = self.sink.write(effects, count)
        except FencedOut:
            _redis(self.redis_url).hincrby(f"{self.topic}:sink", "fenced_out", 1)
            raise
        if outcome is not SinkOutcome.APPLIED:
            _redis(self.redis_url).hincrby(f"{self.topic}:sink", outcome.value, 1)


def applied_table(namespace: str) -> str:
    """The PostgreSQL table that counts each id's applications: `applied_<namespace>`."""
    return "applied_" + namespace.replace("-", "_")


def count_applied(table: str, id_: str, cur: psycopg.Cursor[Any]) -> None:
    """The effect in PostgreSQL: one more application of `id_`."""
    cur.execute(
        f"INSERT INTO {table} AS a (id, n) VALUES (%s, 1)"
        " ON CONFLICT (id) DO UPDATE SET n = a.n + 1",
        (id_,),
    )


def create_tables(sink: PostgresSink) -> None:
    """The sink's fence table and the table its effects count in."""
    sink.create_table()
    with psycopg.connect(sink.conninfo, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {applied_table(sink.namespace)} (id text PRIMARY KEY, n int NOT NULL)"
        )


def postgres_sink(config: TopicConfig, url: str) -> PostgresSink:
    """The sink for `config`'s dedup namespace (its spout id) on the server at `url`."""
    return PostgresSink(url, config.spout_id)


def chaos_bolt(
    config: TopicConfig, postgres_url: str | None = None, spool: Path | None = None
) -> IdempotencyBolt:
    """The dedup bolt around the chaos handler for `config`'s topic; with `postgres_url`, the
    effect goes to PostgreSQL through the fenced sink; with `spool`, each batch that finds
    Redis down appends a line to that file (`faults.ProbedIdempotencyBolt`)."""
    slow = config.message_timeout + 2
    sink = None if postgres_url is None else postgres_sink(config, postgres_url)
    handler = ChaosHandler(config.topic, config.redis.url, slow_seconds=slow, sink=sink)
    if spool is not None:
        return ProbedIdempotencyBolt(handler, config, spool)
    return IdempotencyBolt(handler, config)


def main(config_path: str, spool: str, postgres_url: str | None = None) -> None:
    """The driver process the test kills. Started as `python -c` (see `DRIVER`), not as
    `python -m`: classes of a `__main__` module would reach Spark's workers by value, cut
    off from this module's other functions."""
    from kspout.spark import spark_session
    from kspout.spout import KafkaSpout

    config = load_config(config_path)
    spark = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    bolt = chaos_bolt(config, postgres_url, Path(spool))
    KafkaSpout(config, spark).run(bolt, until_caught_up=True)


DRIVER = "import sys; from tests.chaos.jobs import main; main(*sys.argv[1:])"

"""The chaos test's job: an exactly-once handler with scripted faults, run behind the dedup bolt.

Each message is JSON `{"id": ..., "fault": kind}` keyed by its id. The handler's only effect is
`HINCRBY <topic>:applied <id> 1`, applied by the dedup bolt atomically with marking the id DONE,
so at the end every id must hold exactly 1. Faults strike on a message's first claim only
(`effects.attempt == 1`), so every message can finish:

* `raise`: the handler raises (a plain EXCEPTION failure, retried).
* `slow`: sleeps past `message_timeout`, then succeeds: replays meet its live lease (DEFERRED)
  and, once it is done, find DONE (DUPLICATE).
* `slow_raise`: sleeps past `message_timeout`, then raises: the replay after it claims again.
* `kill`: kills its own Python worker mid-batch (SIGKILL): the task's claims are never settled
  and must be claimed again once their leases end.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from functools import cache

import redis

from dedup import Effects, IdempotencyBolt
from kspout.config import TopicConfig, load_config
from kspout.kafka import Record


@cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@dataclass(frozen=True, slots=True)
class ChaosHandler:
    """Applies each message once, after the faults its message asks for.

    Each fault that strikes is also counted in `<topic>:struck` (a plain write, not an effect),
    so the test can show the faults really happened.
    """

    topic: str
    redis_url: str
    slow_seconds: float

    def __call__(self, record: Record, effects: Effects) -> None:
        message = json.loads(record.value or b"{}")
        fault = message["fault"] if effects.attempt == 1 else "none"
        if fault != "none":
            _redis(self.redis_url).hincrby(f"{self.topic}:struck", fault, 1)
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault in ("slow", "slow_raise"):
            time.sleep(self.slow_seconds)
        if fault in ("raise", "slow_raise"):
            raise RuntimeError(f"injected {fault} for {message['id']}")
        effects.hincrby(f"{self.topic}:applied", effects.id)


def chaos_bolt(config: TopicConfig) -> IdempotencyBolt:
    """The dedup bolt around the chaos handler for `config`'s topic."""
    slow = config.message_timeout + 2
    handler = ChaosHandler(config.topic, config.redis.url, slow_seconds=slow)
    return IdempotencyBolt(handler, config)


def main(config_path: str) -> None:
    """The driver process the test kills. Started as `python -c` (see `DRIVER`), not as
    `python -m`: classes of a `__main__` module would reach Spark's workers by value, cut
    off from this module's other functions."""
    from kspout.spark import spark_session
    from kspout.spout import KafkaSpout

    config = load_config(config_path)
    spark = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    KafkaSpout(config, spark).run(chaos_bolt(config), until_caught_up=True)


DRIVER = "import sys; from tests.chaos.jobs import main; main(sys.argv[1])"

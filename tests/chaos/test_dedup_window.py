"""An operator's move behind the dedup window: refused without `--force`, and rightly so.

The topic's `[dedup] ttl` is two seconds, so "the window" passes while the test waits. The
dedup bolt runs with its effects in Redis (the embedded stack's server); its DONE records
expire after the window, exactly as they would after a day in production. Then:

* `kspout offsets set --all --to earliest` is refused: it would replay messages finished
  before the window began, and names the partitions, the offsets and when they finished;
* with `--force` it moves, says what will apply again, and a run afterwards applies exactly
  those effects a second time: what the refusal protected against.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from click.testing import CliRunner
from confluent_kafka import Producer

from dedup import Effects, IdempotencyBolt
from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.executor.topology import Topology
from kspout.kafka import Record
from tests.integration.helpers import PARTITIONS, produce, stored, topic_file

TTL = 2.0  # seconds: the dedup window
LEASE = 2.0  # seconds; a record is kept LEASE + TTL after its last write, at most twice that
PER_PARTITION = 40


def run_dedup(config: TopicConfig, key: str) -> None:
    """The dedup bolt counting each id into `key`, until caught up, as `kspout run` runs it."""

    def apply(record: Record, effects: Effects) -> None:
        effects.hincrby(key, effects.id)

    topology = Topology.of(IdempotencyBolt(apply, config))
    window = topology.replay_window()
    assert window == TTL, "the spout knows the window from the dedup bolt"
    with Driver(config, LocalExecutor(config, topology), replay_window=window) as driver:
        driver.run(until_caught_up=True)


def test_an_operators_move_behind_the_dedup_window_is_refused_without_force(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    config = make_config(
        dedup={"id_source": "key", "ttl": TTL, "lease": LEASE},
        redis={"url": stack.info.redis_url},
    )
    produce(
        producer,
        config.topic,
        {p: range(PER_PARTITION) for p in PARTITIONS},
        key=lambda p, o: b"id-%d-%d" % (p, o),
    )
    key = f"applied:{config.topic}"
    run_dedup(config, key)
    ids = {f"id-{p}-{o}" for p in PARTITIONS for o in range(PER_PARTITION)}
    assert applied(redis_client, key) == dict.fromkeys(ids, 1)
    assert stored(config) == dict.fromkeys(PARTITIONS, PER_PARTITION)

    time.sleep(2 * (LEASE + TTL) + 0.5)  # the window passes; the DONE records expire after it
    path = topic_file(tmp_path / "topic.toml", stack, config)

    def kspout(*args: str) -> Any:
        return CliRunner().invoke(main, ["offsets", "set", "--config", str(path), *args])

    refused = kspout("--all", "--to", "earliest")
    assert refused.exit_code == 1, refused.output
    assert "--force" in refused.output and f"dedup window ({TTL:g}s)" in refused.output
    for p in PARTITIONS:
        assert f"partition {p}: offsets [0, {PER_PARTITION})" in refused.output
    assert len(re.findall(r"finished by \S+Z", refused.output)) == len(PARTITIONS)
    assert stored(config) == dict.fromkeys(PARTITIONS, PER_PARTITION), "nothing moved"

    forced = kspout("--all", "--to", "earliest", "--force", "--json")
    assert forced.exit_code == 0, forced.output
    rows = json.loads(forced.output)["partitions"]
    assert {row["partition"] for row in rows if row["applies_again"]} == set(PARTITIONS)
    assert stored(config) == dict.fromkeys(PARTITIONS, 0)

    # What --force said would apply again did: every effect, a second time.
    run_dedup(config, key)
    assert applied(redis_client, key) == dict.fromkeys(ids, 2)


def applied(client: redis.Redis, key: str) -> dict[str, int]:
    return {bytes(k).decode(): int(v) for k, v in client.hgetall(key).items()}

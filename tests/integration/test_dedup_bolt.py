"""The dedup bolt end to end with the in-process executor: real Kafka, ZooKeeper
and Redis. (The chaos test runs it on Spark with faults; these pin each behaviour down.)

Every test's handler counts each message it applies in a Redis hash, as an effect applied with
the record's DONE, so `applied()` shows exactly what took effect.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from confluent_kafka import Producer
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from dedup import Effects, IdempotencyBolt, LeaseStatus, Settlement, SettleStatus
from dedup.bolt import worker_store
from dedup.overlap import IDS_PER_CALL
from kspout.config import TopicConfig
from kspout.devstack import DevStack, RedisServer
from kspout.driver import Driver, Progress
from kspout.errors import ChainError
from kspout.executor.local import LocalExecutor
from kspout.executor.topology import Topology
from kspout.kafka import Record
from tests.integration.helpers import PARTITIONS, dead_letter_headers, highs, produce, stored


class Apply:
    """The handler: applies a message by counting its id; raises for ids in `failing` once."""

    def __init__(self, key: str, failing: set[str] | None = None) -> None:
        self.key = key
        self.failing = failing or set()

    def __call__(self, record: Record, effects: Effects) -> None:
        if effects.id in self.failing and effects.attempt == 1:
            raise RuntimeError(f"first attempt of {effects.id} fails")
        effects.hincrby(self.key, effects.id)


def run(config: TopicConfig, bolt: IdempotencyBolt, **kwargs: Any) -> Progress:
    with Driver(config, LocalExecutor(config, bolt)) as driver:
        return driver.run(until_caught_up=True, **kwargs)


def applied(client: redis.Redis, key: str) -> dict[str, int]:
    return {bytes(k).decode(): int(v) for k, v in client.hgetall(key).items()}


def keyed(p: int, o: int) -> bytes:
    return b"id-%d-%d" % (p, o)


def test_each_id_applies_once_and_a_replay_from_the_start_is_all_duplicates(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = dedup_config()
    produce(producer, config.topic, {p: range(100) for p in PARTITIONS}, key=keyed)
    key = f"{config.topic}:applied"
    failing = {"id-0-3", "id-2-50"}

    first = run(config, IdempotencyBolt(Apply(key, failing), config))

    ids = {keyed(p, o).decode() for p in PARTITIONS for o in range(100)}
    assert applied(redis_client, key) == dict.fromkeys(ids, 1)
    assert first.total("acked") == 400 and first.total("retried") == len(failing)
    assert stored(config) == highs(config)
    # What the handler raised under the bolt, with the handler's line.
    line = Apply.__call__.__code__.co_firstlineno + 2
    assert {(f.failure.kind, f.failure.place, f.records) for f in first.failures} == {
        ("RuntimeError", f"test_dedup_bolt.py:{line}", 1)
    }

    # Same namespace, a new spout id: the whole topic again, and nothing runs twice.
    again = config.model_copy(update={"spout_id": config.spout_id + "-again"})
    second = run(again, IdempotencyBolt(Apply(key), again, namespace=config.spout_id))
    assert second.total("duplicates") == 400 and second.total("acked") == 0
    assert applied(redis_client, key) == dict.fromkeys(ids, 1)


def test_a_message_without_an_id_is_dead_lettered_with_the_reason_and_counted(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    stack: DevStack,
) -> None:
    config = dedup_config()
    produce(
        producer,
        config.topic,
        {0: range(10)},
        key=lambda p, o: None if o in (2, 7) else keyed(p, o),
    )
    key = f"{config.topic}:applied"

    progress = run(config, IdempotencyBolt(Apply(key), config))

    assert progress.total("invalid") == 2 == progress.total("dead_lettered")
    assert progress.total("retried") == 0  # no retry can give a message an id
    assert sorted(applied(redis_client, key)) == sorted(
        keyed(0, o).decode() for o in range(10) if o not in (2, 7)
    )
    letters = dead_letter_headers(config, stack.info.brokers)
    assert sorted(int(h["kspout.source.offset"]) for h in letters) == [2, 7]
    for headers in letters:
        assert headers["kspout.reason"].startswith("invalid")
        assert "no message id" in headers["kspout.error"]
    assert stored(config)[0] == 10


@pytest.mark.parametrize(
    ("source", "key", "value", "headers"),
    [
        ("json:order", None, b'{"order": "A-17", "n": 1}', []),
        ("header:msg-id", b"ignored", b"x", [("msg-id", b"A-17")]),
    ],
)
def test_ids_come_from_a_json_field_or_a_header(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    source: str,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes]],
) -> None:
    config = dedup_config(dedup={"id_source": source})
    for _ in range(3):  # the same id three times: applied once, then duplicates
        producer.produce(config.topic, value, key, partition=1, headers=headers)
    assert producer.flush(10) == 0
    effect = f"{config.topic}:applied"

    progress = run(config, IdempotencyBolt(Apply(effect), config))

    assert applied(redis_client, effect) == {"A-17": 1}
    # The second copy in the same lease call is deferred, then found DONE like the third.
    assert progress.total("acked") == 1 and progress.total("duplicates") == 2


def test_a_live_lease_elsewhere_defers_without_spending_attempts_until_it_settles(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = dedup_config(max_retries=0, defer_delay=0.05)  # a spent attempt would dead-letter
    produce(producer, config.topic, {3: range(5)}, key=keyed)
    effect = f"{config.topic}:applied"
    bolt = IdempotencyBolt(Apply(effect), config)
    store = worker_store(config, bolt.namespace)
    [other] = store.lease(["id-3-2"], owner="another task")
    assert other.status is LeaseStatus.LEASED

    with Driver(config, LocalExecutor(config, bolt)) as driver:
        deadline = time.monotonic() + 10
        while driver.progress().total("deferred") < 3 and time.monotonic() < deadline:
            driver.step()
            time.sleep(0.01)
        # Everything else is done; id-3-2 keeps coming back deferred, never run, never failed.
        assert driver.progress().total("deferred") >= 3
        assert driver.progress().total("dead_lettered") == 0
        assert applied(redis_client, effect) == {keyed(3, o).decode(): 1 for o in (0, 1, 3, 4)}
        done = Settlement("id-3-2", other.token, True, None, [("HINCRBY", effect, "id-3-2", 1)])
        assert [r.status for r in store.settle([done])] == [SettleStatus.SETTLED]
        final = driver.run(until_caught_up=True)

    assert final.total("duplicates") == 1 and final.total("dead_lettered") == 0
    assert applied(redis_client, effect)["id-3-2"] == 1
    assert stored(config)[3] == 5


class ApplyAndAdd(Apply):
    """Apply, plus an INCRBY of 1 on `counter`, which is at the 64-bit limit."""

    def __init__(self, key: str, counter: str, ids: set[str]) -> None:
        super().__init__(key)
        self.counter = counter
        self.ids = ids

    def __call__(self, record: Record, effects: Effects) -> None:
        super().__call__(record, effects)
        if effects.id in self.ids:
            effects.incrby(self.counter, 1)


def test_what_redis_would_refuse_fails_that_message_alone_with_redis_reason(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    stack: DevStack,
) -> None:
    config = dedup_config(max_retries=1)
    produce(producer, config.topic, {2: range(6)}, key=keyed)
    key, counter = f"{config.topic}:applied", f"{config.topic}:counter"
    redis_client.set(counter, 2**63 - 1)
    bolt = IdempotencyBolt(ApplyAndAdd(key, counter, {"id-2-4"}), config)
    store = worker_store(config, bolt.namespace)
    seconds, micros = redis_client.time()
    bucket = (seconds * 1000 + micros // 1000) // store.bucket_ms  # where the first lease writes
    redis_client.hset(store.bucket_key(bucket), "id-2-1", "not a record")

    progress = run(config, bolt, max_batches=50)

    assert progress.total("acked") == 4 and progress.total("released") == 0
    assert progress.total("retried") == 2 and progress.total("dead_lettered") == 2
    assert applied(redis_client, key) == {keyed(2, o).decode(): 1 for o in (0, 2, 3, 5)}
    assert redis_client.get(counter) == b"%d" % (2**63 - 1)
    errors = {
        h["kspout.source.offset"]: h["kspout.error"]
        for h in dead_letter_headers(config, stack.info.brokers)
    }
    assert "Redis rejected the lease of 'id-2-1'" in errors["1"]
    assert "not an idempotency record" in errors["1"]
    assert "Redis rejected the settlement of 'id-2-4'" in errors["4"]
    assert "increment or decrement would overflow" in errors["4"]
    assert stored(config)[2] == 6


def test_a_batch_is_leased_and_settled_in_parts_of_ids_per_call(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    config = dedup_config(batch_size=300)
    produce(producer, config.topic, {p: range(600) for p in PARTITIONS}, key=keyed)
    bolt = IdempotencyBolt(Apply(f"{config.topic}:applied"), config)

    with Driver(config, LocalExecutor(config, bolt)) as driver:
        assert driver.step()  # the first batch also loads the scripts and sets up the epoch
        driver.drain()
        before = evalsha_calls(redis_client)
        assert driver.step()
        driver.drain()
        after = evalsha_calls(redis_client)
        assert driver.progress().total("acked") == 2 * 300 * len(PARTITIONS)

    # In process a batch is one task over every partition: a lease and a settle per part.
    parts = -(-300 * len(PARTITIONS) // IDS_PER_CALL)
    assert parts > 1
    assert after - before == 2 * parts


class RunsAndWaitsForNextLease(Apply):
    """Apply, counting every run of the handler outside the effects (`<key>:runs`), and at the
    first run wait until `ahead`, an id of the batch's next part, has a record."""

    def __init__(self, key: str, config: TopicConfig, ahead: str) -> None:
        super().__init__(key)
        self.config = config
        self.ahead = ahead
        self.saw_ahead: bool | None = None

    def __call__(self, record: Record, effects: Effects) -> None:
        client = redis.Redis.from_url(self.config.redis.url)
        client.hincrby(f"{self.key}:runs", effects.id, 1)
        if self.saw_ahead is None:
            store = worker_store(self.config, self.config.spout_id)
            deadline = time.monotonic() + 5
            while store.record(self.ahead) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            self.saw_ahead = store.record(self.ahead) is not None
        client.close()
        super().__call__(record, effects)


def test_the_next_part_is_leased_while_the_handler_runs_and_a_repeat_in_it_waits(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    # One partition, one batch of 700 messages in two parts (500 and 200); the second part
    # repeats the first 100 ids of the first (offsets 600 to 699 are ids 0 to 99 again).
    config = dedup_config(batch_size=700, defer_delay=0.05)
    produce(producer, config.topic, {0: range(700)}, key=lambda p, o: keyed(p, o % 600))
    key = f"{config.topic}:applied"
    handler = RunsAndWaitsForNextLease(key, config, ahead=keyed(0, 550).decode())
    assert IDS_PER_CALL == 500

    with Driver(config, LocalExecutor(config, IdempotencyBolt(handler, config))) as driver:
        assert driver.step()
        driver.drain()
        first = driver.progress()
        final = driver.run(until_caught_up=True)

    # The second part's lease was in Redis while the first part's handlers ran...
    assert handler.saw_ahead is True
    # ...and its repeats found the first part's live leases: deferred, then duplicates.
    assert first.total("deferred") == 100 and first.total("acked") == 600
    assert final.total("duplicates") == 100 and final.total("dead_lettered") == 0
    ids = {keyed(0, o).decode() for o in range(600)}
    assert applied(redis_client, key) == dict.fromkeys(ids, 1)
    assert applied(redis_client, f"{key}:runs") == dict.fromkeys(ids, 1)  # no handler ran twice
    assert stored(config)[0] == 700


def test_start_warns_when_redis_could_lose_records(
    dedup_config: Callable[..., TopicConfig], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    risky = RedisServer(tmp_path, appendonly=False)
    risky.start()
    try:
        config = dedup_config(redis={"url": risky.url})
        bolt = IdempotencyBolt(Apply("unused"), config)
        with caplog.at_level(logging.WARNING, logger="dedup.bolt"):
            bolt.start()
    finally:
        risky.stop()
    assert any("appendonly" in w for w in bolt.warnings)
    assert any("appendonly" in r.getMessage() for r in caplog.records)

    durable = dedup_config()
    checked = IdempotencyBolt(Apply("unused"), durable)
    checked.start()
    assert checked.warnings == []  # the stack's Redis runs with AOF and noeviction


def evalsha_calls(client: redis.Redis) -> int:
    stats = cast(dict[str, dict[str, int]], client.info("commandstats"))
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_with_zookeeper_auth_the_epoch_is_kept_under_the_same_digest_acl(
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
    zk: KazooClient,
) -> None:
    config = dedup_config(zookeeper_auth={"credential": "kspout:s3cret"})
    produce(producer, config.topic, {0: range(20)}, key=keyed)
    key = f"{config.topic}:applied"

    progress = run(config, IdempotencyBolt(Apply(key), config))

    assert progress.total("acked") == 20 and len(applied(redis_client, key)) == 20
    epoch = f"{config.zk_root}/dedup/{config.spout_id}/epoch"
    with pytest.raises(NoAuthError):
        zk.get(epoch)  # an anonymous client can neither read nor move the fencing epoch


def test_a_bolt_after_the_dedup_bolt_is_refused(dedup_config: Callable[..., TopicConfig]) -> None:
    config = dedup_config()
    with pytest.raises(ChainError, match="emits nothing"):
        Topology.of([IdempotencyBolt(Apply("unused"), config), lambda t: None])

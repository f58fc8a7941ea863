"""IdempotencyStore against a real redis-server and ZooKeeper: every record transition, fencing,
effects, one round trip per batch, concurrent claimers, Redis data loss and durability checks.

Tests that break Redis (FLUSHALL, restart without the append-only file, CONFIG SET) use their
own redis-server (`own_redis`), never the session stack's.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kazoo.client import KazooClient

from dedup import (
    EffectNotAllowed,
    EpochConflict,
    IdempotencyStore,
    IdRecord,
    IdRecordState,
    Lease,
    LeaseStatus,
    Settlement,
    SettleResult,
    SettleStatus,
    ZkEpoch,
    server_durability_warnings,
)
from dedup.batch import _lease
from dedup.scripts import ADVANCE_EPOCH, SETTLE
from dedup.store import COUNTER_BITS
from kspout.devstack import DevStack, RedisServer

pytestmark = pytest.mark.integration

LEASED, DUPLICATE, DEFERRED = LeaseStatus.LEASED, LeaseStatus.DUPLICATE, LeaseStatus.DEFERRED
SETTLED, STALE, LOST = (SettleResult(s) for s in SettleStatus if s is not SettleStatus.REJECTED)
REJECTED = SettleStatus.REJECTED
WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"
SHORT_LEASE_MS = 150  # leases that must run out within a test; sleeps are SHORT_LEASE_MS + 60 ms
LEASE_EXPIRED = (SHORT_LEASE_MS + 60) / 1000

StoreFactory = Callable[..., IdempotencyStore]


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server for this module only (AOF on), which tests may flush, restart or
    reconfigure."""
    server = RedisServer(tmp_path_factory.mktemp("dedup-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    own_redis.start()  # a no-op unless a test left it stopped after failing
    client = redis.Redis.from_url(own_redis.url)
    yield client
    client.close()


@pytest.fixture
def epoch_path() -> str:
    return f"/kspout-test/dedup/{uuid.uuid4().hex}/epoch"


@pytest.fixture
def store_factory(redis_client: redis.Redis, zk: KazooClient, epoch_path: str) -> StoreFactory:
    """Makes stores on one fresh namespace and ZooKeeper epoch path; keyword arguments override
    the client, lease, done TTL or namespace."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"

    def make(**overrides: Any) -> IdempotencyStore:
        settings: dict[str, Any] = {
            "client": redis_client,
            "namespace": namespace,
            "lease_ms": 10_000,
            "done_ttl_ms": 60_000,
            "epoch_source": ZkEpoch(zk, epoch_path),
        }
        settings.update(overrides)
        client = settings.pop("client")
        return IdempotencyStore(client, **settings)

    return make


@pytest.fixture
def store(store_factory: StoreFactory) -> IdempotencyStore:
    return store_factory()


def redis_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def kept_ms(store: IdempotencyStore, id_: str) -> int:
    """How long `id`'s record is kept from now: its bucket's expiry."""
    bucket = store.record_bucket(id_)
    assert bucket is not None
    return int(store._client.pttl(bucket))


def assert_kept_from_now(store: IdempotencyStore, id_: str, slack_ms: int = 1000) -> None:
    """`id`'s record is kept `keep_ms` from about now, and at most a bucket's width more."""
    assert store.keep_ms - slack_ms < kept_ms(store, id_) <= store.keep_ms + store.bucket_ms


# -- transitions -------------------------------------------------------------------------------


def test_absent_ids_are_leased_at_attempt_one_with_increasing_tokens(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    before = redis_now_ms(redis_client)
    leases = store.lease(["a", "b", "c"], "w1")

    assert [c.status for c in leases] == [LEASED] * 3
    assert [c.attempts for c in leases] == [1, 1, 1]
    tokens = [c.token for c in leases]
    assert len(set(tokens)) == 1  # one token per call; each lease of an id gets a higher one
    assert store.epoch is not None and tokens[0] >> COUNTER_BITS == store.epoch >= 1
    record = store.record("a")
    assert record is not None and record.state is IdRecordState.IN_FLIGHT
    assert (record.owner, record.token, record.attempts) == ("w1", tokens[0], 1)
    assert record.lease_deadline_ms is not None
    assert before + 10_000 <= record.lease_deadline_ms <= redis_now_ms(redis_client) + 10_000
    # the lease is in the record; the record lives a dedup window longer (bounded memory)
    assert store.keep_ms == 10_000 + 60_000
    assert_kept_from_now(store, "a")


def test_done_id_is_duplicate_until_its_record_expires(store_factory: StoreFactory) -> None:
    store = store_factory(lease_ms=SHORT_LEASE_MS, done_ttl_ms=300)
    [lease] = store.lease(["m"], "w1")

    assert store.settle([Settlement("m", lease.token, True, attempts=1)]) == [SETTLED]
    record = store.record("m")
    assert record is not None and record.state is IdRecordState.DONE
    assert_kept_from_now(store, "m", slack_ms=50)
    assert store.lease(["m"], "w2")[0].status is DUPLICATE
    assert store.lease(["m"], "w1")[0].status is DUPLICATE

    time.sleep((store.keep_ms + store.bucket_ms + 50) / 1000)
    assert store.record("m") is None
    again = store.lease(["m"], "w2")[0]
    assert (again.status, again.attempts) == (LEASED, 1)
    assert again.token > lease.token


def test_live_lease_of_another_owner_is_deferred_without_change(
    store: IdempotencyStore,
) -> None:
    store.lease(["m"], "w1")
    before = store.record("m")

    [deferred] = store.lease(["m"], "w2")

    assert deferred.status is DEFERRED
    assert 0 < deferred.retry_after_ms <= 10_000
    assert (deferred.token, deferred.attempts) == (0, 0)
    assert store.record("m") == before


def test_expired_lease_is_leased_again_with_a_higher_token_and_the_next_attempt(
    store_factory: StoreFactory,
) -> None:
    store = store_factory(lease_ms=SHORT_LEASE_MS)
    [first] = store.lease(["m"], "w1")
    assert store.lease(["m"], "w2")[0].status is DEFERRED

    time.sleep(LEASE_EXPIRED)
    [second] = store.lease(["m"], "w2")

    assert (second.status, second.attempts) == (LEASED, 2)
    assert second.token > first.token
    record = store.record("m")
    assert record is not None and (record.owner, record.token) == ("w2", second.token)


def test_failed_id_is_leased_again_with_the_next_attempt(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    [first] = store.lease(["m"], "w1")
    assert store.settle([Settlement("m", first.token, False, "ValueError: boom")]) == [SETTLED]
    record = store.record("m")
    assert record is not None
    assert (record.state, record.attempts, record.error) == (
        IdRecordState.FAILED,
        1,
        "ValueError: boom",
    )
    assert_kept_from_now(store, "m")

    [second] = store.lease(["m"], "w2")
    assert (second.status, second.attempts) == (LEASED, 2)
    assert second.token > first.token
    [third_failed] = store.settle([Settlement("m", second.token, False, None)])
    assert third_failed == SETTLED
    assert store.lease(["m"], "w1")[0].attempts == 3


def test_own_live_lease_is_renewed_with_a_fresh_token_at_the_same_attempt(
    store: IdempotencyStore,
) -> None:
    [first] = store.lease(["m"], "w1")
    [renewed] = store.lease(["m"], "w1")

    assert (renewed.status, renewed.attempts) == (LEASED, 1)
    assert renewed.token > first.token
    assert store.settle([Settlement("m", first.token, True)]) == [STALE]
    assert store.settle([Settlement("m", renewed.token, True)]) == [SETTLED]


def test_an_id_twice_in_one_lease_is_deferred_the_second_time(store: IdempotencyStore) -> None:
    first, second, other = store.lease(["m", "m", "n"], "w1")

    assert first.status is LEASED and other.status is LEASED
    assert second.status is DEFERRED
    assert store.settle([Settlement("m", first.token, True)]) == [SETTLED]
    assert store.lease(["m"], "w1")[0].status is DUPLICATE


def test_at_maxmemory_done_ids_still_answer_duplicate_and_new_ids_fail_unchanged(
    store_factory: StoreFactory, own_client: redis.Redis
) -> None:
    store = store_factory(client=own_client)
    [done] = store.lease(["done"], "w1")
    assert store.settle([Settlement("done", done.token, True)]) == [SETTLED]
    fence = own_client.hgetall(f"{{{store.namespace}}}:fence")
    try:
        own_client.config_set("maxmemory", 1)  # every write is refused (noeviction)
        assert store.lease(["done", "done"], "w2") == [Lease(DUPLICATE, 0, 0, 0)] * 2
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            store.lease(["done", "new"], "w2")
    finally:
        own_client.config_set("maxmemory", 0)

    assert store.record("new") is None
    assert own_client.hgetall(f"{{{store.namespace}}}:fence") == fence


def test_a_server_refusing_writes_fails_the_settle_call_not_each_message(
    store_factory: StoreFactory, own_client: redis.Redis
) -> None:
    """NOREPLICAS (like READONLY or MISCONF) is the infrastructure's refusal: the call fails,
    nothing changes, and no message is REJECTED (which would spend its attempt)."""
    store = store_factory(client=own_client)
    a, b = store.lease(["a", "b"], "w1")
    try:
        own_client.config_set("min-replicas-to-write", 1)  # no replica: every write refused
        with pytest.raises(redis.ResponseError, match="NOREPLICAS"):
            store.settle([Settlement("a", a.token, True), Settlement("b", b.token, True)])
    finally:
        own_client.config_set("min-replicas-to-write", 0)
    assert [store.record(i).state for i in ("a", "b")] == [IdRecordState.IN_FLIGHT] * 2  # type: ignore[union-attr]
    settled = [Settlement("a", a.token, True), Settlement("b", b.token, True)]
    assert store.settle(settled) == [SETTLED, SETTLED]


def test_one_id_in_two_partitions_of_one_server_is_leased_once(store: IdempotencyStore) -> None:
    """On one server the record key does not depend on the partition: the repeat is the same
    record, a duplicate in the batch, not a second lease that would defer itself."""
    leased = _lease(store, ["x", "x"], [0, 1], "w1", 1.0, time.sleep, time.monotonic)
    assert [id_ for id_, _ in leased] == ["x", "x"]
    first, repeat = (lease for _, lease in leased)
    assert first is not None and first.status is LEASED and repeat is None


def test_refused_settlements_change_nothing(store: IdempotencyStore) -> None:
    a, b = store.lease(["a", "b"], "w1")
    assert store.settle([Settlement("a", a.token, True)]) == [SETTLED]
    done = store.record("a")
    in_flight = store.record("b")
    in_flight_bucket = store.record_bucket("b")
    in_flight_ttl = kept_ms(store, "b")

    statuses = store.settle(
        [
            Settlement("a", a.token, False, "late failure"),  # already DONE
            Settlement("b", b.token + 1, True, None, (), b.attempts),  # a token it never had
            Settlement("b", b.token - 1, False, "zombie"),
            Settlement("never-leased", a.token, True),
        ]
    )

    assert statuses == [STALE, STALE, STALE, LOST]
    assert store.record("a") == done
    assert store.record("b") == in_flight
    # the settle wrote nothing: the lease's record stays where it was, with its expiry
    assert store.record_bucket("b") == in_flight_bucket
    assert in_flight_ttl - 1000 < kept_ms(store, "b") <= in_flight_ttl
    assert store.record("never-leased") is None


def test_a_failed_item_between_refused_ones_keeps_its_own_error(store: IdempotencyStore) -> None:
    a, b, c = store.lease(["a", "b", "c"], "w1")
    statuses = store.settle(
        [
            Settlement("a", a.token + 1, False, "error of a"),  # STALE: its error is skipped
            Settlement("b", b.token, False, "error of b"),
            Settlement("c", c.token, True),
        ]
    )
    assert statuses == [STALE, SETTLED, SETTLED]
    record = store.record("b")
    assert record is not None and record.error == "error of b"


def test_late_settle_after_the_lease_ran_out_succeeds_if_nobody_leased_since(
    store_factory: StoreFactory,
) -> None:
    store = store_factory(lease_ms=SHORT_LEASE_MS, done_ttl_ms=300)
    [lease] = store.lease(["m"], "w1")
    time.sleep(LEASE_EXPIRED)
    assert store.settle([Settlement("m", lease.token, True)]) == [SETTLED]
    assert store.lease(["m"], "w2")[0].status is DUPLICATE
    # kept from the late settle, not for what was left of the lease's expiry
    left_of_the_lease = store.keep_ms - LEASE_EXPIRED * 1000
    assert kept_ms(store, "m") > store.keep_ms - 50 > left_of_the_lease


def test_a_client_decoding_responses_works_too(
    stack: DevStack, store_factory: StoreFactory
) -> None:
    client = redis.Redis.from_url(stack.info.redis_url, decode_responses=True)
    try:
        store = store_factory(client=client)
        a, b = store.lease(["a", "b"], "w1")
        assert store.settle([Settlement("a", a.token, True), Settlement("b", 1, True)]) == [
            SETTLED,
            STALE,
        ]
        assert store.lease(["a"], "w2")[0].status is DUPLICATE
        record = store.record("b")
        assert record is not None and record.token == b.token
        assert store.still_holds("b", b.token)
    finally:
        client.close()


# -- effects and fencing -----------------------------------------------------------------------


def test_effects_apply_with_done_in_the_same_call(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    user = f"user-{uuid.uuid4().hex}"
    a, b = store.lease(["a", "b"], "w1")

    statuses = store.settle(
        [
            Settlement(
                "a",
                a.token,
                True,
                effects=[
                    ("HINCRBY", f"{user}:h", "count", 2),
                    ("INCRBY", f"{user}:n", 5),
                    ("SADD", f"{user}:s", "a", "x"),
                    ("SET", f"{user}:v", b"payload"),
                    ("hset", f"{user}:h", "last", "a"),
                ],
            ),
            Settlement("b", b.token, True),
        ]
    )

    assert statuses == [SETTLED, SETTLED]
    assert redis_client.hgetall(f"{user}:h") == {b"count": b"2", b"last": b"a"}
    assert redis_client.get(f"{user}:n") == b"5"
    assert redis_client.smembers(f"{user}:s") == {b"a", b"x"}
    assert redis_client.get(f"{user}:v") == b"payload"
    assert store.lease(["a", "b"], "w2")[0].status is DUPLICATE


def test_a_zombie_done_with_effects_after_a_new_lease_applies_nothing(
    store_factory: StoreFactory, redis_client: redis.Redis
) -> None:
    store = store_factory(lease_ms=SHORT_LEASE_MS)
    counter = f"user-{uuid.uuid4().hex}:count"
    [zombie] = store.lease(["m"], "w1")
    time.sleep(LEASE_EXPIRED)  # w1 hangs past its lease ...
    [current] = store.lease(["m"], "w2")  # ... and w2 takes the message over

    late = store.settle([Settlement("m", zombie.token, True, effects=[("INCRBY", counter, 1)])])

    assert late == [STALE]
    assert redis_client.get(counter) is None
    assert not store.still_holds("m", zombie.token)
    assert store.still_holds("m", current.token)
    assert store.settle(
        [Settlement("m", current.token, True, effects=[("INCRBY", counter, 1)])]
    ) == [SETTLED]
    assert redis_client.get(counter) == b"1"
    assert not store.still_holds("m", current.token)  # settled: no token holds a lease any more


def test_an_effect_redis_would_reject_settles_the_item_failed_and_applies_none(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    user = f"user-{uuid.uuid4().hex}"
    redis_client.hset(f"{user}:hash", "f", "1")
    redis_client.set(f"{user}:text", "abc")
    redis_client.hset(f"{user}:padded", "f", "007")  # Redis's HINCRBY refuses leading zeros
    a, b, c, d = store.lease(["a", "b", "c", "d"], "w1")

    results = store.settle(
        [
            Settlement(
                "a", a.token, True, effects=[("SET", f"{user}:x", 1), ("INCRBY", f"{user}:hash", 1)]
            ),
            Settlement("b", b.token, True, effects=[("INCRBY", f"{user}:text", 1)]),
            Settlement("c", c.token, True, effects=[("INCRBY", f"{user}:ok", 1)]),
            Settlement("d", d.token, True, effects=[("HINCRBY", f"{user}:padded", "f", 1)]),
        ]
    )

    assert [r.status for r in results] == [REJECTED, REJECTED, SETTLED.status, REJECTED]
    assert results[0].error == f"INCRBY on {user}:hash: {WRONGTYPE}"
    assert results[1].error == f"INCRBY on {user}:text: value is not an integer or out of range"
    assert results[3].error == f"HINCRBY on {user}:padded: hash value is not an integer"
    assert redis_client.get(f"{user}:x") is None
    assert redis_client.get(f"{user}:text") == b"abc"
    assert redis_client.get(f"{user}:ok") == b"1"
    record = store.record("a")
    assert record is not None and record.state is IdRecordState.FAILED
    assert record.error is not None and "WRONGTYPE" in record.error
    assert store.lease(["a"], "w1")[0].attempts == 2  # a failed attempt: it runs again


def state(store: IdempotencyStore, id: str) -> IdRecordState | None:
    """The state of `id`'s record (None: no record)."""
    record = store.record(id)
    return None if record is None else record.state


def test_increments_of_one_counter_are_applied_as_one_sum_when_every_item_settles(
    store_factory: StoreFactory, own_client: redis.Redis
) -> None:
    store = store_factory(client=own_client)
    user = f"user-{uuid.uuid4().hex}"
    ids = [f"w{i}" for i in range(30)]
    leases = store.lease(ids, "w1")
    items = [
        Settlement(id, lease.token, True, effects=[("HINCRBY", f"{user}:words", id[-1], i)])
        for i, (id, lease) in enumerate(zip(ids, leases, strict=True))
    ]
    last = ("SET", f"{user}:last", "n")  # another effect in the same call, not summed
    items.append(Settlement("n", store.lease(["n"], "w1")[0].token, True, effects=[last]))

    ran = redis_commands(own_client, lambda: store.settle(items))
    counts = own_client.hgetall(f"{user}:words")

    assert ran["hincrby"] == 10  # one per field: ten sums of three items each
    assert own_client.get(f"{user}:last") == b"n"
    assert counts == {
        str(digit).encode(): str(sum(i for i in range(30) if i % 10 == digit)).encode()
        for digit in range(10)
    }
    assert {state(store, id) for id in ids} == {IdRecordState.DONE}


def test_a_counter_per_id_in_one_hash_is_one_hmget_and_one_hset_with_redis_own_values(
    store_factory: StoreFactory, own_client: redis.Redis
) -> None:
    store = store_factory(client=own_client)
    applied = f"user-{uuid.uuid4().hex}:applied"
    big = 2**62  # past Lua's exact doubles: added with 64-bit arithmetic
    starts = {"w1": 41, "w2": -7, "w3": big, "w4": -big}  # the others have no field yet
    own_client.hset(applied, mapping=starts)
    ids = [f"w{i}" for i in range(20)]
    leases = store.lease(ids, "w")
    increments = {id: (i if i % 2 else -i) * 10**9 for i, id in enumerate(ids)}
    items = [
        Settlement(id, c.token, True, effects=[("HINCRBY", applied, id, increments[id])])
        for id, c in zip(ids, leases, strict=True)
    ]

    ran = redis_commands(own_client, lambda: store.settle(items))

    assert "hincrby" not in ran and ran["hset"] == 1
    assert own_client.hgetall(applied) == {
        id.encode(): str(starts.get(id, 0) + increments[id]).encode() for id in ids
    }
    assert {state(store, id) for id in ids} == {IdRecordState.DONE}


def test_a_counter_per_id_that_redis_would_refuse_rejects_that_item_alone(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    applied = f"user-{uuid.uuid4().hex}:applied"
    redis_client.hset(applied, mapping={"b": "007", "c": 2**63 - 1})
    ids = ["a", "b", "c", "d"]
    leases = store.lease(ids, "w1")

    results = store.settle(
        [
            Settlement(id, c.token, True, effects=[("HINCRBY", applied, id, 1)])
            for id, c in zip(ids, leases, strict=True)
        ]
    )

    assert [r.status for r in results] == [SETTLED.status, REJECTED, REJECTED, SETTLED.status]
    assert results[1].error == f"HINCRBY on {applied}: hash value is not an integer"
    assert results[2].error == f"HINCRBY on {applied}: increment or decrement would overflow"
    assert redis_client.hgetall(applied) == {
        b"a": b"1",
        b"b": b"007",
        b"c": str(2**63 - 1).encode(),
        b"d": b"1",
    }
    assert [state(store, id) for id in ids] == [
        IdRecordState.DONE,
        IdRecordState.FAILED,
        IdRecordState.FAILED,
        IdRecordState.DONE,
    ]


def test_a_counter_applies_only_the_increments_of_its_items_that_settled(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    counter = f"user-{uuid.uuid4().hex}:n"
    a, b, c = store.lease(["a", "b", "c"], "w1")
    assert store.settle([Settlement("b", b.token, True, effects=[("INCRBY", counter, 10)])]) == [
        SETTLED
    ]

    again = [
        Settlement(id, lease.token, True, effects=[("INCRBY", counter, n)])
        for id, lease, n in [("a", a, 1), ("b", b, 10), ("c", c, 100)]
    ]

    assert store.settle(again) == [SETTLED, STALE, SETTLED]  # b was settled already
    assert redis_client.get(counter) == b"111"


def test_a_sum_that_would_overflow_rejects_the_items_redis_refuses_one_by_one(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    user = f"user-{uuid.uuid4().hex}"
    redis_client.hset(f"{user}:h", "f", 2**63 - 3)
    ids = ["a", "b", "c", "d", "e"]
    leases = store.lease(ids, "w1")

    results = store.settle(
        [
            Settlement(id, lease.token, True, effects=[("HINCRBY", f"{user}:h", "f", 1)])
            for id, lease in zip(ids, leases, strict=True)
        ]
    )

    assert [r.status for r in results] == [SETTLED.status] * 2 + [REJECTED] * 3
    assert {r.error for r in results[2:]} == {
        f"HINCRBY on {user}:h: increment or decrement would overflow"
    }
    assert redis_client.hget(f"{user}:h", "f") == str(2**63 - 1).encode()
    assert [state(store, id) for id in ids[1:3]] == [IdRecordState.DONE, IdRecordState.FAILED]


def test_increments_are_not_summed_past_another_effect_on_their_key(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    key = f"user-{uuid.uuid4().hex}:k"
    a, b, c = store.lease(["a", "b", "c"], "w1")

    results = store.settle(
        [
            Settlement("a", a.token, True, effects=[("HINCRBY", key, "f", 1)]),
            Settlement("b", b.token, True, effects=[("SET", key, "text")]),
            Settlement("c", c.token, True, effects=[("HINCRBY", key, "f", 1)]),
        ]
    )

    assert [r.status for r in results] == [SETTLED.status, SETTLED.status, REJECTED]
    assert results[2].error == f"HINCRBY on {key}: {WRONGTYPE}"
    assert redis_client.get(key) == b"text"


@pytest.mark.parametrize(
    "effect",
    [
        ("DEL", "k"),
        ("EVAL", "return 1", 0),
        ("INCRBY", "k", "1"),
        ("INCRBY", "k", True),
        ("HINCRBY", "k", 1),
        ("HSET", "k", "f"),
        ("SET", "k", "v", "PX"),
        ("SET", "k", None),
        ("SADD", 5, "m"),
        "SET k v",
    ],
)
def test_effects_outside_the_allowlist_raise_before_anything_is_sent(
    store: IdempotencyStore, effect: Any
) -> None:
    [lease] = store.lease(["m"], "w1")
    before = store.record("m")

    with pytest.raises(EffectNotAllowed) as raised:
        store.settle([Settlement("m", lease.token, True, effects=[effect])])

    assert raised.value.id == "m"
    assert store.record("m") == before


def test_the_effects_script_refuses_an_unknown_command_before_writing(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    a, b = store.lease(["a", "b"], "w1")
    before = [store.record("a"), store.record("b")]
    script = redis_client.register_script(SETTLE.text)
    user = f"user-{uuid.uuid4().hex}"

    leases = f"{a.token:x}:1/1 {b.token:x}:1/1"

    with pytest.raises(redis.ResponseError, match="code X is not allowed"):
        script(
            keys=[f"{{{store.namespace}}}:fence", f"{user}:1", f"{user}:2"],
            args=[60_000, leases, "DD", "S1,X0,", 0, 0, 0, "a", "b", "v"],
        )

    assert [store.record("a"), store.record("b")] == before
    assert redis_client.get(f"{user}:1") is None


def test_effects_on_a_failed_item_are_refused(store: IdempotencyStore) -> None:
    [lease] = store.lease(["m"], "w1")
    with pytest.raises(EffectNotAllowed, match="only to DONE"):
        store.settle([Settlement("m", lease.token, False, "boom", [("INCRBY", "k", 1)])])


# -- all or nothing: a per-id failure rejects that id alone -------------------------------------


@pytest.mark.parametrize("before", ["new", "done"])  # the script reads the next id differently
def test_a_record_field_holding_something_else_rejects_that_id_alone_and_tokens_never_repeat(
    store: IdempotencyStore, redis_client: redis.Redis, before: str
) -> None:
    [done] = store.lease(["first"], "w0")
    if before == "done":
        store.settle([Settlement("first", done.token, True)])
    else:
        store.settle([Settlement("first", done.token, False, "to be leased again")])
    bucket = store.record_bucket("first")
    assert bucket is not None
    redis_client.hset(bucket, "bad", "hello")

    first, bad, after = store.lease(["first", "bad", "after"], "w1")
    later = store.lease(["x", "y"], "w2")

    assert first.status is (LEASED if before == "new" else DUPLICATE)
    assert (bad.status, bad.token) == (LeaseStatus.REJECTED, 0)
    assert bad.error == f"{bucket} bad: the field holds a value that is not an idempotency record"
    assert redis_client.hget(bucket, "bad") == b"hello"  # untouched
    assert after.status is LEASED and [c.status for c in later] == [LEASED] * 2
    assert first.status is DUPLICATE or first.token == after.token  # one token per call
    assert all(c.token > after.token for c in later)  # the next call's is higher
    for id_, lease in [("after", after), ("x", later[0])]:
        record = store.record(id_)
        assert record is not None and record.token == lease.token


@pytest.mark.parametrize("with_effects", [False, True])
def test_a_record_overwritten_with_something_else_is_stale_and_left_alone(
    store: IdempotencyStore, redis_client: redis.Redis, with_effects: bool
) -> None:
    counter = f"user-{uuid.uuid4().hex}:n"
    effects = [("INCRBY", counter, 1)] if with_effects else []
    # not the lease call whole ("d" stays out): a whole one settled by its proof reads no record
    # back, and a write into the store's hashes by anything but its scripts is not one it answers
    a, b, c, _ = store.lease(["a", "b", "c", "d"], "w1")
    bucket = store.record_bucket("b")
    assert bucket is not None
    redis_client.hset(bucket, "b", "someone else's")

    results = store.settle(
        [
            Settlement(id_, lease.token, True, None, effects)
            for id_, lease in zip("abc", (a, b, c), strict=True)
        ]
    )

    assert results == [SETTLED, STALE, SETTLED]
    assert redis_client.hget(bucket, "b") == b"someone else's"
    assert redis_client.get(counter) == (b"2" if with_effects else None)
    assert store.lease(["a", "c"], "w2") == [Lease(DUPLICATE, 0, 0, 0)] * 2


MAX = 2**63 - 1


@pytest.mark.parametrize(
    ("setup", "effects", "why"),
    [
        ({"n": MAX}, [("SADD", "s", "m"), ("INCRBY", "n", 1)], "INCRBY on {n}: increment or"),
        ({"n": -MAX - 1}, [("INCRBY", "n", -1)], "INCRBY on {n}: increment or decrement"),
        ({"n": 2**62}, [("INCRBY", "n", 2**62 - 1), ("INCRBY", "n", 1)], "would overflow"),
        ({"h": MAX}, [("HINCRBY", "h", "f", 1)], "HINCRBY on {h}: increment or decrement"),
        ({}, [("SADD", "n", "m"), ("INCRBY", "n", 1)], f"INCRBY on {{n}}: {WRONGTYPE}"),
        ({}, [("SET", "n", "x"), ("INCRBY", "n", 1)], "INCRBY on {n}: value is not an integer"),
        ({}, [("HSET", "h", "f", "x"), ("HINCRBY", "h", "f", 1)], "hash value is not an integer"),
        ({}, [("SET", "h", "1"), ("HSET", "h", "f", "v")], f"HSET on {{h}}: {WRONGTYPE}"),
    ],
)
def test_an_effect_that_would_fail_only_when_applied_rejects_its_item_before_any_write(
    store: IdempotencyStore,
    redis_client: redis.Redis,
    setup: dict[str, int],
    effects: list[tuple[str | int, ...]],
    why: str,
) -> None:
    user = f"user-{uuid.uuid4().hex}"
    keys = {name: f"{user}:{name}" for name in ("n", "h", "s", "ok")}
    for name, value in setup.items():
        if name == "h":
            redis_client.hset(keys["h"], "f", value)
        else:
            redis_client.set(keys[name], value)
    before = {name: redis_client.dump(key) for name, key in keys.items()}
    ok = ("INCRBY", keys["ok"], 1)
    bad = [(command, keys[str(key)], *args) for command, key, *args in effects]
    a, b, c = store.lease(["a", "b", "c"], "w1")

    results = store.settle(
        [
            Settlement("a", a.token, True, effects=[ok]),
            Settlement("b", b.token, True, effects=bad),
            Settlement("c", c.token, True, effects=[ok]),
        ]
    )

    assert [r.status for r in results] == [SETTLED.status, REJECTED, SETTLED.status]
    assert results[1].error is not None and why.format(**keys) in results[1].error
    assert redis_client.get(keys["ok"]) == b"2"
    assert {name: redis_client.dump(key) for name, key in keys.items() if name != "ok"} == {
        name: dump for name, dump in before.items() if name != "ok"
    }  # none of b's effects applied
    record = store.record("b")
    assert record is not None and record.state is IdRecordState.FAILED
    assert record.error == f"rejected effect: {results[1].error}"
    assert store.lease(["b"], "w2")[0].attempts == 2  # the message runs again


@pytest.mark.parametrize(
    ("start", "increments"),
    [(MAX - 1, [1]), (-MAX, [-1]), (None, [MAX, -MAX, -1, -MAX]), (-1, [10**10, -(10**10)])],
)
def test_increments_up_to_the_64_bit_limits_apply_as_redis_computes_them(
    store: IdempotencyStore, redis_client: redis.Redis, start: int | None, increments: list[int]
) -> None:
    key, field, mirror, full = (f"user-{uuid.uuid4().hex}:{n}" for n in ("n", "h", "m", "full"))
    if start is not None:
        redis_client.set(key, start)
        redis_client.hset(field, "f", start)
        redis_client.set(mirror, start)
    for increment in increments:
        redis_client.incrby(mirror, increment)  # what Redis itself makes of them
    redis_client.set(full, MAX)
    exact, over = store.lease(["exact", "over"], "w1")
    effects = [e for n in increments for e in (("INCRBY", key, n), ("HINCRBY", field, "f", n))]

    results = store.settle(
        [
            Settlement("exact", exact.token, True, effects=effects),
            Settlement("over", over.token, True, effects=[("INCRBY", full, 1)]),
        ]
    )

    assert [r.status for r in results] == [SETTLED.status, REJECTED]
    assert redis_client.get(key) == redis_client.hget(field, "f") == redis_client.get(mirror)


# -- bounded memory: every record expires ------------------------------------------------------


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    """True once `check()` is (polled every 50 ms), False if it still is not after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_every_record_state_expires_so_unsettled_leases_go_away(
    store_factory: StoreFactory, redis_client: redis.Redis
) -> None:
    # Long enough that a loaded machine still sees every key before the first expires.
    store = store_factory(lease_ms=3000, done_ttl_ms=4000)
    ids = [f"m{i}" for i in range(50)]
    leases = store.lease(ids, "w1")
    store.settle(
        [Settlement("m0", leases[0].token, True), Settlement("m1", leases[1].token, False)]
    )
    store.lease(["m1", "m2"], "w1")  # FAILED leased again; a lease renewed

    buckets = f"{{{store.namespace}}}:ids:*"
    keys = list(redis_client.scan_iter(match=buckets))
    assert sum(redis_client.hlen(key) for key in keys) == len(ids)
    assert all(0 < redis_client.pttl(key) <= store.keep_ms + store.bucket_ms for key in keys)
    assert eventually(lambda: next(redis_client.scan_iter(match=buckets), None) is None)


def test_an_expired_lease_is_leased_anew_and_its_old_holder_can_no_longer_settle(
    store_factory: StoreFactory, redis_client: redis.Redis
) -> None:
    store = store_factory(lease_ms=SHORT_LEASE_MS, done_ttl_ms=SHORT_LEASE_MS)
    counter = f"user-{uuid.uuid4().hex}:n"
    [old] = store.lease(["m"], "w1")
    assert eventually(lambda: store.record("m") is None)

    [new] = store.lease(["m"], "w2")

    assert (new.status, new.attempts) == (LEASED, 1) and new.token > old.token
    late = Settlement("m", old.token, True, effects=[("INCRBY", counter, 1)])
    assert store.settle([late]) == [STALE]
    assert redis_client.get(counter) is None


# -- one round trip per batch ------------------------------------------------------------------


def commands_sent(url: str, client: redis.Redis, work: Callable[[], None]) -> list[str]:
    """The commands `work()` sent through `client` (already connected) to the server at `url`,
    not those its scripts ran, as MONITOR on the server saw them."""
    marker = f"end-{uuid.uuid4().hex}"
    seen: list[str] = []
    watcher = redis.Redis.from_url(url)
    with watcher, watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
        work()
        client.echo(marker)
        while True:
            entry = monitor.next_command()
            if entry["client_type"] == "lua":
                continue
            if marker in entry["command"]:
                return seen
            seen.append(entry["command"].split()[0].upper())


def test_lease_and_settle_are_one_round_trip_per_batch(
    stack: DevStack, store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    ids = [f"m{i}" for i in range(200)]
    store.settle([Settlement("w", store.lease(["w"], "w1")[0].token, True)])  # loads scripts
    leases: list[Any] = []
    settled: list[Any] = []

    def work() -> None:
        leases.extend(store.lease(ids, "w1"))
        settled.extend(
            store.settle(
                [
                    Settlement(id, c.token, True, effects=[("INCRBY", f"{store.namespace}:n", 1)])
                    if i % 2
                    else Settlement(id, c.token, i % 3 == 0, "boom")
                    for i, (id, c) in enumerate(zip(ids, leases, strict=True))
                ]
            )
        )

    sent = commands_sent(stack.info.redis_url, redis_client, work)

    assert sent == ["EVALSHA", "EVALSHA"]
    assert [c.status for c in leases] == [LEASED] * len(ids)
    assert settled == [SETTLED] * len(ids)
    assert redis_client.get(f"{store.namespace}:n") == b"100"


def redis_commands(client: redis.Redis, work: Callable[[], object]) -> dict[str, int]:
    """How many times each command ran on the server, scripts' commands included, in `work()`."""
    client.config_resetstat()
    work()
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}


def test_leasing_new_ids_and_settling_them_costs_a_few_redis_commands_per_batch(
    store_factory: StoreFactory, own_client: redis.Redis
) -> None:
    store = store_factory(client=own_client)
    ids = [f"m{i}" for i in range(50)]
    store.lease(["warm"], "w1")  # fence made, scripts loaded
    leases: list[Lease] = []

    leased = redis_commands(own_client, lambda: leases.extend(store.lease(ids, "w1")))
    items = [
        Settlement(i, c.token, True, None, (), c.attempts) for i, c in zip(ids, leases, strict=True)
    ]
    settled = redis_commands(own_client, lambda: store.settle(items))

    # the lease reads the batch's records with one HMGET per bucket that exists, writes them with
    # one HSET and its proof with one SET; the settle, of every id of that lease in its order,
    # reads the fence and the proof, not the records, and marks them DONE with one SET
    assert leased["hmget"] <= 3 and leased.get("pexpireat", 0) <= 1
    assert leased["hset"] <= 2 and leased["set"] == 1
    assert settled["hmget"] == 1 and settled["get"] == 1 and settled["set"] == 1
    assert "hset" not in settled
    assert {store.record(i) for i in ids} == {
        IdRecord(IdRecordState.DONE, c.token, 1) for c in leases
    }
    # without the leases' attempts (0: unknown) the items settle alike, at the record's count
    more = store.lease(["x", "y"], "w1")
    unknown = [Settlement(i, c.token, True) for i, c in zip(["x", "y"], more, strict=True)]
    assert store.settle(unknown) == [SETTLED, SETTLED]
    assert store.record("y") == IdRecord(IdRecordState.DONE, more[1].token, 1)


@pytest.mark.parametrize("with_effects", [False, True])
def test_a_lease_call_settled_whole_is_marked_done_with_one_write_and_no_record_read(
    own_client: redis.Redis, store_factory: StoreFactory, with_effects: bool
) -> None:
    store = store_factory(client=own_client)
    ids = ["a", "b", "c"]
    leases = store.lease(ids, "w1")
    bucket = store.record_bucket("a")
    proof = proof_key(store, leases[0].token)
    assert 0 < own_client.pttl(proof) <= store.lease_ms  # it lives as long as the lease
    counter = f"user-{uuid.uuid4().hex}:n"
    effects = [("INCRBY", counter, 1)] if with_effects else []
    items = [
        Settlement(i, c.token, True, None, effects, 1) for i, c in zip(ids, leases, strict=True)
    ]
    results: list[SettleResult] = []

    settled = redis_commands(own_client, lambda: results.extend(store.settle(items)))

    assert results == [SETTLED] * 3
    assert own_client.get(counter) == (b"3" if with_effects else None)
    assert settled["set"] == 1 and "hset" not in settled  # the mark, no record rewritten
    assert settled["hmget"] == 1  # the fence's: the proof stands for the records, none is read
    assert own_client.exists(proof) == 0
    mark = store.mark_key(leases[0].token)
    assert own_client.pexpiretime(mark) == own_client.pexpiretime(bucket)  # expires with them
    assert {store.record(i) for i in ids} == {IdRecord(IdRecordState.DONE, leases[0].token, 1)}
    assert [c.status for c in store.lease(ids, "w2")] == [DUPLICATE] * 3
    assert store.settle(items) == [STALE] * 3  # settled already
    assert own_client.get(counter) == (b"3" if with_effects else None)


def proof_key(store: IdempotencyStore, token: int) -> str:
    """The key of the proof of the lease call of `token` (`dedup/lua/buckets.lua`)."""
    return f"{{{store.tag()}}}:lease:{token:x}"


def test_settling_part_of_a_lease_call_revokes_its_proof(store: IdempotencyStore) -> None:
    ids = ["a", "b", "c"]
    token = store.lease(ids, "w1")[0].token
    assert store._client.exists(proof_key(store, token)) == 1

    assert store.settle([Settlement("a", token, False, "boom")]) == [SETTLED]

    assert store._client.exists(proof_key(store, token)) == 0
    # all three again: "a" is settled, so the records are read and it alone is refused
    again = [Settlement(i, token, True, None, (), 1) for i in ids]
    assert store.settle(again) == [STALE, SETTLED, SETTLED]
    assert [store.record(i) for i in ids] == [
        IdRecord(IdRecordState.FAILED, token, 1, error="boom"),
        IdRecord(IdRecordState.DONE, token, 1),
        IdRecord(IdRecordState.DONE, token, 1),
    ]


def test_other_ids_under_a_lease_calls_token_are_checked_record_by_record(
    store: IdempotencyStore,
) -> None:
    token = store.lease(["a", "b"], "w1")[0].token

    settled = store.settle([Settlement(i, token, True, None, (), 1) for i in ["a", "c"]])

    assert settled == [SETTLED, LOST]  # "c" was never leased: its digest is not the proof's
    assert store.still_holds("b", token)  # untouched


def test_ids_holding_newlines_get_no_proof_so_no_other_split_of_them_settles(
    store: IdempotencyStore,
) -> None:
    token = store.lease(["x\ny", "z"], "w1")[0].token
    assert store._client.exists(proof_key(store, token)) == 0

    # joined by newlines, these two are the leased two: only their records can tell them apart
    other = [Settlement(i, token, True, None, (), 1) for i in ["x", "y\nz"]]
    assert store.settle(other) == [LOST, LOST]
    leased = [Settlement(i, token, True, None, (), 1) for i in ["x\ny", "z"]]
    assert store.settle(leased) == [SETTLED, SETTLED]


def test_a_lease_call_settled_in_parts_writes_each_record(store: IdempotencyStore) -> None:
    ids = ["a", "b", "c", "d"]
    token = store.lease(ids, "w1")[0].token

    first = store.settle([Settlement("a", token, True), Settlement("b", token, False, "boom")])
    rest = store.settle([Settlement("c", token, True), Settlement("d", token, True)])

    assert first == rest == [SETTLED, SETTLED]
    mark = store.mark_key(token)
    assert store._client.exists(mark) == 0  # no call settled every id: each record is written
    assert [store.record(i) for i in ids] == [
        IdRecord(IdRecordState.DONE, token, 1),
        IdRecord(IdRecordState.FAILED, token, 1, error="boom"),
        IdRecord(IdRecordState.DONE, token, 1),
        IdRecord(IdRecordState.DONE, token, 1),
    ]
    assert [c.status for c in store.lease(ids, "w2")] == [DUPLICATE, LEASED, DUPLICATE, DUPLICATE]


def test_items_of_two_lease_calls_interleaved_are_counted_each_to_its_own(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    """A middle item whose attempt count is unknown (0) must not count the next item of the
    first lease call toward its own: d, never settled, stays in flight; a and c are done."""
    counter = f"user-{uuid.uuid4().hex}:n"
    first = store.lease(["a", "c"], "w1")[0].token
    second = store.lease(["b", "d"], "w1")[0].token
    effect = [("INCRBY", counter, 1)]

    results = store.settle(
        [
            Settlement("a", first, True, effects=effect, attempts=1),
            Settlement("b", second, True, effects=effect, attempts=0),
            Settlement("c", first, True, effects=effect, attempts=1),
        ]
    )

    assert results == [SETTLED] * 3 and redis_client.get(counter) == b"3"
    assert [state(store, id) for id in "abcd"] == [IdRecordState.DONE] * 3 + [
        IdRecordState.IN_FLIGHT
    ]
    assert redis_client.exists(store.mark_key(second)) == 0


def test_a_bucket_ahead_of_redis_clock_stays_the_one_looked_up_and_written(
    store: IdempotencyStore, redis_client: redis.Redis
) -> None:
    """A failover to a server whose clock is behind: records in the bucket after this server's
    current one are still found, and new ones go there too."""
    [lease] = store.lease(["m"], "w1")
    assert store.settle([Settlement("m", lease.token, False, "boom")]) == [SETTLED]
    now = store.record_bucket("m")
    assert now is not None
    ahead = f"{now.rsplit(':', 1)[0]}:{int(now.rsplit(':', 1)[1]) + 1}"
    redis_client.rename(now, ahead)  # as if written by a server a bucket ahead

    [again] = store.lease(["m", "n"], "w1")[:1]

    assert (again.status, again.attempts) == (LEASED, 2)  # the FAILED record was found
    assert store.record_bucket("m") == store.record_bucket("n") == ahead


# -- fencing tokens across stores, threads and data loss ---------------------------------------


def test_tokens_strictly_increase_across_stores_of_one_namespace(
    store_factory: StoreFactory,
) -> None:
    first, second = store_factory(), store_factory()
    tokens: list[int] = []  # one per call: its ids share it
    for round in range(5):
        for store in (first, second, first):
            leases = store.lease([f"{round}-{id(store)}-{i}" for i in range(3)], "w")
            assert len({c.token for c in leases}) == 1
            tokens.append(leases[0].token)

    assert tokens == sorted(set(tokens))


def test_concurrent_claimers_get_exactly_one_lease_per_id(
    stack: DevStack, store_factory: StoreFactory
) -> None:
    workers = 4
    ids = [f"m{i}" for i in range(300)]
    start = threading.Barrier(workers)
    results: dict[int, list[Any]] = {}

    def run(worker: int) -> None:
        client = redis.Redis.from_url(stack.info.redis_url)
        store = store_factory(client=client)  # a fresh namespace: all race to set up the fence
        start.wait()
        try:
            results[worker] = [
                lease
                for lo in range(0, len(ids), 50)
                for lease in store.lease(ids[lo : lo + 50], f"w{worker}")
            ]
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    assert sorted(results) == list(range(workers))
    tokens = []
    for i in range(len(ids)):
        answers = [results[w][i] for w in range(workers)]
        leased = [a for a in answers if a.status is LEASED]
        assert len(leased) == 1, (ids[i], answers)
        assert all(a.status is DEFERRED for a in answers if a.status is not LEASED)
        tokens.append(leased[0].token)
    per_worker = [{c.token for c in results[w] if c.status is LEASED} for w in range(workers)]
    assert sum(map(len, per_worker)) == len(set().union(*per_worker))  # no call's token twice
    for worker in range(workers):
        own = [c.token for c in results[worker] if c.status is LEASED]
        assert own == sorted(own)


def test_flushall_moves_the_epoch_on_and_tokens_stay_above_all_earlier_ones(
    own_client: redis.Redis, store_factory: StoreFactory, zk: KazooClient, epoch_path: str
) -> None:
    store = store_factory(client=own_client)
    before = store.lease([f"m{i}" for i in range(10)], "w1")
    epoch = store.epoch
    assert epoch is not None and ZkEpoch(zk, epoch_path).current() == epoch

    own_client.flushall()
    after = store.lease([f"m{i}" for i in range(10)], "w1")

    assert [c.status for c in after] == [LEASED] * 10  # the records are gone
    assert store.epoch is not None and store.epoch > epoch
    assert ZkEpoch(zk, epoch_path).current() == store.epoch
    assert min(c.token for c in after) > max(c.token for c in before)


def test_a_restart_without_the_append_only_file_moves_the_epoch_on(
    own_redis: RedisServer, own_client: redis.Redis, store_factory: StoreFactory
) -> None:
    store = store_factory(client=own_client)
    [lease] = store.lease(["m"], "w1")
    store.settle([Settlement("m", lease.token, True)])
    epoch = store.epoch

    own_redis.stop()
    own_redis.start()  # AOF kept: records and fence survive
    assert store.lease(["m"], "w1")[0].status is DUPLICATE
    [kept] = store.lease(["n"], "w1")
    assert store.epoch == epoch and kept.token > lease.token

    own_redis.kill()
    shutil.rmtree(Path(own_redis.home) / "appendonlydir")
    own_redis.start()
    [lost] = store.lease(["m"], "w1")

    assert lost.status is LEASED  # the DONE record was lost: the message runs again
    assert store.epoch is not None and epoch is not None and store.epoch > epoch
    assert lost.token > kept.token


def test_a_store_behind_the_fence_adopts_its_epoch_without_a_bump(
    own_client: redis.Redis, store_factory: StoreFactory, zk: KazooClient, epoch_path: str
) -> None:
    stale, fresh = store_factory(client=own_client), store_factory(client=own_client)
    [old] = stale.lease(["a"], "w1")
    own_client.flushall()
    [new] = fresh.lease(["b"], "w2")  # detects the loss: epoch 2
    assert fresh.epoch == 2 and new.token > old.token

    [adopted] = stale.lease(["c"], "w1")  # still at epoch 1: adopts 2

    assert stale.epoch == 2 and ZkEpoch(zk, epoch_path).current() == 2
    assert adopted.token > new.token


def test_a_fence_at_a_lower_epoch_is_moved_to_a_fresh_one(
    own_client: redis.Redis, store_factory: StoreFactory, zk: KazooClient, epoch_path: str
) -> None:
    store = store_factory(client=own_client)
    [first] = store.lease(["a"], "w1")
    ZkEpoch(zk, epoch_path).bump(0)  # epoch 2 taken by a client that has not installed it yet
    advance = own_client.register_script(ADVANCE_EPOCH.text)
    fence = f"{{{store.namespace}}}:fence"
    assert advance(keys=[fence], args=[1, store.bucket_ms]) == 1  # never moves down
    own_client.hset(fence, mapping={"epoch": 0, "seq": 0})  # a fence older than this store

    [second] = store.lease(["b"], "w1")

    assert store.epoch == 3  # a fresh epoch, not the 2 someone else may still install
    assert second.token > first.token
    assert advance(keys=[fence], args=[2, store.bucket_ms]) == 3


def test_a_used_up_counter_moves_to_a_new_epoch(
    own_client: redis.Redis, store_factory: StoreFactory
) -> None:
    store = store_factory(client=own_client)
    store.lease(["a"], "w1")
    own_client.hset(f"{{{store.namespace}}}:fence", "seq", 2**COUNTER_BITS - 2)
    [last] = store.lease(["b"], "w1")
    assert last.token == (1 << COUNTER_BITS) + 2**COUNTER_BITS - 1

    [next_] = store.lease(["c"], "w1")

    assert store.epoch == 2 and next_.token == (2 << COUNTER_BITS) + 1


def test_a_fence_ahead_of_zookeeper_is_an_epoch_conflict(
    own_client: redis.Redis, store_factory: StoreFactory
) -> None:
    store = store_factory(client=own_client)
    store.lease(["a"], "w1")
    own_client.hset(f"{{{store.namespace}}}:fence", "epoch", 99)  # as if ZooKeeper lost data

    with pytest.raises(EpochConflict) as raised:
        store_factory(client=own_client).lease(["b"], "w1")

    assert (raised.value.fence_epoch, raised.value.source_epoch) == (99, 1)


# -- durability warnings -----------------------------------------------------------------------


def test_a_durable_server_gets_no_warnings(own_client: redis.Redis) -> None:
    assert server_durability_warnings(own_client) == []


def test_risky_server_settings_are_warned_about(own_client: redis.Redis) -> None:
    try:
        own_client.config_set("appendonly", "no")
        own_client.config_set("maxmemory-policy", "volatile-lru")
        warnings = server_durability_warnings(own_client)
    finally:
        own_client.config_set("appendonly", "yes")
        own_client.config_set("maxmemory-policy", "noeviction")

    assert len(warnings) == 2
    assert "appendonly yes" in warnings[0]
    assert "volatile-lru" in warnings[1] and "noeviction" in warnings[1]


def test_appendfsync_no_is_warned_about(own_client: redis.Redis) -> None:
    try:
        own_client.config_set("appendfsync", "no")
        warnings = server_durability_warnings(own_client)
    finally:
        own_client.config_set("appendfsync", "everysec")
    assert len(warnings) == 1 and "appendfsync everysec" in warnings[0]


def test_a_user_without_config_rights_gets_a_warning_to_check_by_hand(
    own_redis: RedisServer, own_client: redis.Redis
) -> None:
    user = f"u{uuid.uuid4().hex[:8]}"
    own_client.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"]
    )
    limited = redis.Redis(host="127.0.0.1", port=own_redis.port, username=user, password="pw")
    try:
        [warning] = server_durability_warnings(limited)
    finally:
        limited.close()
        own_client.acl_deluser(user)
    assert "CONFIG GET failed" in warning and "noeviction" in warning

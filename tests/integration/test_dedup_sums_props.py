"""Combined effects against applying each effect with its item, on the real Redis.

A settle call applies the increments several items make to one key (and field) as one sum
(dedup.effects.CallEffects.sums, settle.lua), the increments of distinct fields of one hash as
one HMGET and one HSET (CallEffects.groups), and lone SETs as one MSET, a key's lone SADDs or
HSETs as one command (CallEffects.merged). The model is the store itself without any of them:
the same items settled one per call, where nothing has two items to combine. Hypothesis draws
batches of items with zero to two effects (INCRBY, HINCRBY, SET, SADD, HSET over a few keys and
fields, and often one effect alone: a hash's counter, a SET, a SADD, an HSET; keys given as str
or as bytes), some settled already (STALE), FAILED or never leased (LOST), over starting values
that make Redis refuse them: a text, a number with a leading zero, a value near either end of
64 bits, a string where a set or hash belongs. Both sides start from the same values on keys of
their own; every item's result, Redis's reasons and every key's final value must agree.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient

from dedup import IdempotencyStore, Settlement, SettleResult, SettleStatus, ZkEpoch

MAX, MIN = 2**63 - 1, -(2**63)
STRINGS = ("k0", "k1")  # INCRBY and SET keys
FIELDS = ("f0", "f1", "f2", "f3")  # of the hash "h"
STARTS = [None, 0, 5, "text", "007", MAX - 2, MIN + 2]
WRITTEN = ("s", "h2")  # the set of the SADDs and the hash of the HSETs: absent, or a string

increments = st.one_of(st.integers(-3, 3), st.sampled_from([MAX, MIN, MAX // 2, MIN // 2]))
effects = st.one_of(
    st.tuples(st.just("INCRBY"), st.sampled_from(STRINGS), increments),
    # mostly the hash; on k0, an HINCRBY meets INCRBYs and SETs of the same key
    st.tuples(
        st.just("HINCRBY"), st.sampled_from(("h", "h", "k0")), st.sampled_from(FIELDS), increments
    ),
    st.tuples(st.just("SET"), st.sampled_from(STRINGS), st.sampled_from(("v", "w"))),
    # mostly their own key; on k1, a SADD or HSET meets SETs and INCRBYs
    st.tuples(st.just("SADD"), st.sampled_from(("s", "s", "k1")), st.sampled_from(("m0", "m1"))),
    st.tuples(
        st.just("HSET"), st.sampled_from(("h2", "h2", "k1")), st.sampled_from(FIELDS), st.just("v")
    ),
)
# an item with one effect: a counter of the hash (a sum, or a field group with the others), a
# SET, a SADD or an HSET (merged with the others of its kind)
lone = st.one_of(
    st.tuples(st.just("HINCRBY"), st.just("h"), st.sampled_from(FIELDS), increments),
    st.tuples(st.just("SET"), st.sampled_from(STRINGS), st.sampled_from(("v", "w"))),
    st.tuples(st.just("SADD"), st.just("s"), st.sampled_from(("m0", "m1", "m2"))),
    st.tuples(st.just("HSET"), st.just("h2"), st.sampled_from(FIELDS), st.sampled_from("vw")),
)
items = st.lists(
    st.tuples(
        st.one_of(st.lists(effects, max_size=2), lone.map(lambda effect: [effect])),
        # mostly leased and settled here; else settled already (STALE), FAILED (its effects
        # dropped) or never leased (LOST)
        st.sampled_from(("ok", "ok", "ok", "ok", "ok", "stale", "failed", "lost")),
    ),
    min_size=2,
    max_size=12,
)
starts = st.fixed_dictionaries(
    {
        **{name: st.sampled_from(STARTS) for name in (*STRINGS, *(f"h.{f}" for f in FIELDS))},
        **{name: st.sampled_from([None, None, "text"]) for name in WRITTEN},
    }
)


@pytest.fixture
def store(redis_client: redis.Redis, zk: KazooClient) -> IdempotencyStore:
    """A store on a fresh namespace; each example uses ids and keys of its own."""
    run = uuid.uuid4().hex[:12]
    epoch = ZkEpoch(zk, f"/kspout-test/dedup/{run}/epoch")
    return IdempotencyStore(
        redis_client, namespace=f"t-{run}", lease_ms=10_000, done_ttl_ms=60_000, epoch_source=epoch
    )


def place(client: redis.Redis, prefix: str, start: dict[str, Any]) -> None:
    for name, value in start.items():
        if value is None:
            continue
        if name.startswith("h."):
            client.hset(f"{prefix}:h", name[2:], value)
        else:
            client.set(f"{prefix}:{name}", value)


def on(prefix: str, effect: tuple[Any, ...], as_bytes: bool) -> tuple[Any, ...]:
    """The effect on the example's own key, given as str or as bytes (one key to Redis)."""
    command, key, *args = effect
    name = f"{prefix}:{key}"
    return (command, name.encode() if as_bytes else name, *args)


def state(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key's type and value."""
    read = {b"hash": client.hgetall, b"set": client.smembers, b"string": client.get}
    found: dict[str, Any] = {}
    for key in (*STRINGS, "h", *WRITTEN):
        kind = client.type(f"{prefix}:{key}")
        found[key] = (kind, read[kind](f"{prefix}:{key}") if kind != b"none" else None)
    return found


def settle(
    store: IdempotencyStore,
    prefix: str,
    drawn: list[tuple[list[tuple[Any, ...]], str]],
    one_per_call: bool,
) -> list[SettleResult]:
    ids = [f"{prefix}-{i}" for i in range(len(drawn))]
    leases = store.lease(ids, "w1")
    batch = []
    for i, (id, lease, (item_effects, how)) in enumerate(zip(ids, leases, drawn, strict=True)):
        if how == "stale":
            assert store.settle([Settlement(id, lease.token, True)]) == [
                SettleResult(SettleStatus.SETTLED)
            ]
        if how == "failed":
            batch.append(Settlement(id, lease.token, False, "boom"))
            continue
        effects = [on(prefix, e, as_bytes=i % 2 == 1) for e in item_effects]
        lost = f"{id}-never-leased"
        batch.append(Settlement(lost if how == "lost" else id, lease.token, True, None, effects))
    if one_per_call:
        return [store.settle([item])[0] for item in batch]
    return store.settle(batch)


@pytest.mark.timeout(240)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=items, start=starts)
@example(  # summed, +3 and -3 would pass where Redis refuses the +3 alone: one sign per sum
    drawn=[([("INCRBY", "k0", 3)], "ok"), ([("INCRBY", "k0", -3)], "ok")],
    start={"k0": MAX - 2, "k1": None, "h.f0": None, "h.f1": None},
)
@example(  # merged: the SADDs of a key holding a string are refused, each item's as its own
    drawn=[([("SADD", "s", "m0")], "ok"), ([("SADD", "s", "m1")], "ok")],
    start={"s": "text"},
)
@example(  # merged: an MSET of one key twice leaves the later item's value
    drawn=[([("SET", "k0", "v")], "ok"), ([("SET", "k0", "w")], "ok")],
    start={},
)
def test_a_batch_with_effects_combined_leaves_what_settling_each_item_alone_does(
    store: IdempotencyStore, redis_client: redis.Redis, drawn: Any, start: dict[str, Any]
) -> None:
    run = uuid.uuid4().hex[:8]
    combined, alone = f"all-{run}", f"one-{run}"
    for prefix in (combined, alone):
        place(redis_client, prefix, start)

    got = settle(store, combined, drawn, one_per_call=False)
    want = settle(store, alone, drawn, one_per_call=True)

    assert [r.status for r in got] == [r.status for r in want]
    assert [r.error and r.error.replace(combined, alone) for r in got] == [r.error for r in want]
    assert state(redis_client, combined) == state(redis_client, alone)

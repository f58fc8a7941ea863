"""Sums of increments against applying each increment with its item, on the real Redis.

A settle call applies the increments several items make to one key (and field) as one sum
(dedup.effects.Increments.sums, settle.lua), and the increments of distinct fields of one hash as
one HMGET and one HSET (dedup.effects.Increments.groups). The model is the store itself without
either: the same items settled one per call, where no sum or group has two items. Hypothesis draws
batches of items with zero to two effects (INCRBY, HINCRBY, SET over a few keys and fields, and
often a hash's counter alone), some settled already (STALE), over starting values that make Redis
refuse increments: a text, a number with a leading zero, a value near either end of 64 bits. Both
sides start from the same values on keys of their own; every item's result, Redis's reasons and
every key's final value must agree.
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

increments = st.one_of(st.integers(-3, 3), st.sampled_from([MAX, MIN, MAX // 2, MIN // 2]))
effects = st.one_of(
    st.tuples(st.just("INCRBY"), st.sampled_from(STRINGS), increments),
    # mostly the hash; on k0, an HINCRBY meets INCRBYs and SETs of the same key
    st.tuples(
        st.just("HINCRBY"), st.sampled_from(("h", "h", "k0")), st.sampled_from(FIELDS), increments
    ),
    st.tuples(st.just("SET"), st.sampled_from(STRINGS), st.just("v")),
)
# an item whose only effect is a counter of the hash: a sum, or a field group with the others
counter = st.tuples(st.just("HINCRBY"), st.just("h"), st.sampled_from(FIELDS), increments)
items = st.lists(
    st.tuples(
        st.one_of(st.lists(effects, max_size=2), counter.map(lambda effect: [effect])),
        st.integers(0, 5).map(lambda n: n == 0),  # already settled: STALE
    ),
    min_size=2,
    max_size=12,
)
starts = st.fixed_dictionaries(
    {name: st.sampled_from(STARTS) for name in (*STRINGS, *(f"h.{f}" for f in FIELDS))}
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


def on(prefix: str, effect: tuple[Any, ...]) -> tuple[Any, ...]:
    command, key, *args = effect
    return (command, f"{prefix}:{key}", *args)


def state(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """Every key's type and value."""
    found: dict[str, Any] = {}
    for key in (*STRINGS, "h"):
        kind = client.type(f"{prefix}:{key}")
        value = client.hgetall if kind == b"hash" else client.get
        found[key] = (kind, value(f"{prefix}:{key}") if kind != b"none" else None)
    return found


def settle(
    store: IdempotencyStore,
    prefix: str,
    drawn: list[tuple[list[tuple[Any, ...]], bool]],
    one_per_call: bool,
) -> list[SettleResult]:
    ids = [f"{prefix}-{i}" for i in range(len(drawn))]
    leases = store.lease(ids, "w1")
    batch = []
    for id, lease, (item_effects, stale) in zip(ids, leases, drawn, strict=True):
        if stale:
            assert store.settle([Settlement(id, lease.token, True)]) == [
                SettleResult(SettleStatus.SETTLED)
            ]
        batch.append(
            Settlement(id, lease.token, True, effects=[on(prefix, e) for e in item_effects])
        )
    if one_per_call:
        return [store.settle([item])[0] for item in batch]
    return store.settle(batch)


@pytest.mark.timeout(240)
@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=items, start=starts)
@example(  # summed, +3 and -3 would pass where Redis refuses the +3 alone: one sign per sum
    drawn=[([("INCRBY", "k0", 3)], False), ([("INCRBY", "k0", -3)], False)],
    start={"k0": MAX - 2, "k1": None, "h.f0": None, "h.f1": None},
)
def test_a_batch_with_summed_sums_leaves_what_settling_each_item_alone_does(
    store: IdempotencyStore, redis_client: redis.Redis, drawn: Any, start: dict[str, Any]
) -> None:
    run = uuid.uuid4().hex[:8]
    summed, alone = f"sum-{run}", f"one-{run}"
    for prefix in (summed, alone):
        place(redis_client, prefix, start)

    got = settle(store, summed, drawn, one_per_call=False)
    want = settle(store, alone, drawn, one_per_call=True)

    assert [r.status for r in got] == [r.status for r in want]
    assert [r.error and r.error.replace(summed, alone) for r in got] == [r.error for r in want]
    assert state(redis_client, summed) == state(redis_client, alone)

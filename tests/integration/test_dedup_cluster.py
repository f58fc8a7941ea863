"""The dedup store and bolt on a real Redis Cluster: local `redis-server --cluster-enabled yes`
masters (1 and 3) made by `RedisClusterServers`, epochs in the stack's ZooKeeper.

Records are sharded per Kafka partition (one hash tag each), every script call touches one
slot, each shard has its own fence counter, and effects must carry their record's hash tag.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from kazoo.client import KazooClient
from redis.cluster import RedisCluster
from redis.crc import key_slot

from dedup import (
    EffectNotAllowed,
    Effects,
    IdempotencyBolt,
    IdempotencyStore,
    IdRecordState,
    LeaseStatus,
    Settlement,
    SettleStatus,
    ZkEpoch,
)
from dedup.records import Effect
from dedup.shards import shard_map_key
from dedup.store import COUNTER_BITS
from kspout.config import TopicConfig
from kspout.devstack.components import RedisClusterServers
from kspout.kafka import Record
from tests.integration.helpers import PARTITIONS, produce
from tests.integration.test_dedup_bolt import keyed, run

pytestmark = pytest.mark.integration

LEASED, DUPLICATE, DEFERRED = LeaseStatus.LEASED, LeaseStatus.DUPLICATE, LeaseStatus.DEFERRED
SETTLED, STALE = SettleStatus.SETTLED, SettleStatus.STALE
SHORT_LEASE_MS = 150
LEASE_EXPIRED = (SHORT_LEASE_MS + 60) / 1000


def start_cluster(tmp_path_factory: pytest.TempPathFactory, masters: int) -> RedisClusterServers:
    servers = RedisClusterServers(tmp_path_factory.mktemp(f"redis-cluster-{masters}"), masters)
    servers.start()
    return servers


@pytest.fixture(scope="module")
def three_masters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = start_cluster(tmp_path_factory, 3)
    yield servers
    servers.stop()


@pytest.fixture(scope="module")
def one_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = start_cluster(tmp_path_factory, 1)
    yield servers
    servers.stop()


@pytest.fixture(params=["one_master", "three_masters"])
def cluster(request: pytest.FixtureRequest) -> RedisClusterServers:
    """Each test that takes it runs on a 1-master and on a 3-master cluster."""
    servers: RedisClusterServers = request.getfixturevalue(request.param)
    return servers


@pytest.fixture
def client(cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    cluster.start()  # a no-op unless a test left a node stopped after failing
    made = RedisCluster.from_url(cluster.url)
    yield made
    made.close()


StoreFactory = Callable[..., IdempotencyStore]


@pytest.fixture
def store_factory(zk: KazooClient) -> StoreFactory:
    """Stores on one fresh namespace and epoch path: `make(client, **overrides)`."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    path = f"/kspout-test/dedup/{namespace}/epoch"

    def make(client: RedisCluster, **overrides: Any) -> IdempotencyStore:
        settings: dict[str, Any] = {
            "namespace": namespace,
            "lease_ms": 10_000,
            "done_ttl_ms": 60_000,
            "epoch_source": ZkEpoch(zk, path),
        }
        settings.update(overrides)
        return IdempotencyStore(client, **settings)

    return make


@pytest.fixture
def store(store_factory: StoreFactory, client: RedisCluster) -> IdempotencyStore:
    return store_factory(client)


@pytest.fixture
def three_client(three_masters: RedisClusterServers) -> Iterator[RedisCluster]:
    made = RedisCluster.from_url(three_masters.url)
    yield made
    made.close()


def node_of(client: RedisCluster, key: str) -> int:
    """The port of the master serving `key`."""
    port: int = client.get_node_from_key(key).port  # type: ignore[no-untyped-call]
    return port


# -- the record lifecycle, per partition -------------------------------------------------------


def test_lease_settle_duplicate_deferred_and_stale_settles_hold_per_partition(
    store: IdempotencyStore,
) -> None:
    ids = [f"m{i}" for i in range(12)]
    partitions = [i % 6 for i in range(12)]

    leases = store.lease(ids, "w1", partitions)
    assert [c.status for c in leases] == [LEASED] * 12
    assert [c.status for c in store.lease(ids, "w2", partitions)] == [DEFERRED] * 12

    done = [
        Settlement(i, c.token, True, None, (), c.attempts) for i, c in zip(ids, leases, strict=True)
    ]
    assert [r.status for r in store.settle(done[:6], partitions[:6])] == [SETTLED] * 6
    assert [r.status for r in store.settle(done[:6], partitions[:6])] == [STALE] * 6

    replay = store.lease(ids, "w3", partitions)
    assert [c.status for c in replay] == [DUPLICATE] * 6 + [DEFERRED] * 6
    record = store.record("m0", 0)
    assert record is not None and (record.state, record.token) == (
        IdRecordState.DONE,
        leases[0].token,
    )
    assert store.record("m0", 1) is None  # another partition: another record


def test_an_id_in_two_partitions_is_two_records(store: IdempotencyStore) -> None:
    a, b = store.lease(["same", "same"], "w1", [0, 1])

    assert (a.status, b.status) == (LEASED, LEASED)  # not DEFERRED: two shards


def test_an_expired_lease_is_leased_again_with_a_higher_token_and_the_zombie_is_refused(
    store_factory: StoreFactory, client: RedisCluster
) -> None:
    store = store_factory(client, lease_ms=SHORT_LEASE_MS)
    counter = store.effect_key("n", 3)
    [zombie] = store.lease(["m"], "w1", 3)
    time.sleep(LEASE_EXPIRED)
    [current] = store.lease(["m"], "w2", 3)

    assert (current.status, current.attempts) == (LEASED, 2) and current.token > zombie.token
    late = Settlement("m", zombie.token, True, None, [("INCRBY", counter, 1)], zombie.attempts)
    assert [r.status for r in store.settle([late], 3)] == [STALE]
    assert client.get(counter) is None
    now = Settlement("m", current.token, True, None, [("INCRBY", counter, 1)], current.attempts)
    assert [r.status for r in store.settle([now], 3)] == [SETTLED]
    assert client.get(counter) == b"1"


def test_tokens_strictly_increase_per_shard_across_stores(
    store_factory: StoreFactory, client: RedisCluster
) -> None:
    first, second = store_factory(client), store_factory(client)
    tokens: dict[int, list[int]] = {p: [] for p in range(4)}
    for round in range(4):
        for store in (first, second):
            ids = [f"{round}-{id(store)}-{p}" for p in range(4)]
            for p, lease in enumerate(store.lease(ids, "w", list(range(4)))):
                tokens[p].append(lease.token)

    for shard in tokens.values():
        assert shard == sorted(set(shard))


# -- sharding: slots, masters, fences -----------------------------------------------------------


def test_partitions_spread_over_the_masters_each_with_its_own_fence(
    three_masters: RedisClusterServers, three_client: RedisCluster, store_factory: StoreFactory
) -> None:
    client, store = three_client, store_factory(three_client)
    partitions = list(range(12))
    store.lease([f"m{p}" for p in partitions], "w1", partitions)
    store.lease([f"n{p}" for p in partitions[:4]], "w1", partitions[:4])

    per_master = Counter(node_of(client, store.effect_key("m", p)) for p in partitions)
    assert per_master == {node.port: 4 for node in three_masters.nodes}  # tags chosen by slot
    for p in partitions:  # a shard's fence lives with its records: one slot
        fence = f"{{{store.tag(p)}}}:fence"
        bucket = store.record_bucket(f"m{p}", p)
        assert bucket is not None and key_slot(fence.encode()) == key_slot(bucket.encode())
        epoch, seq = (int(v or 0) for v in client.hmget(fence, "epoch", "seq"))
        assert seq == (2 if p < 4 else 1)  # this shard's leases only: no shared counter
        record = store.record(f"m{p}", p)
        assert record is not None and record.token == (epoch << COUNTER_BITS) + 1


def test_a_partitions_tag_is_kept_in_the_shard_map_and_never_chosen_again(
    three_masters: RedisClusterServers, three_client: RedisCluster, store_factory: StoreFactory
) -> None:
    first = store_factory(three_client)
    tags = [first.tag(p) for p in range(6)]
    chosen_before = f"{first.namespace}:p7:chosen-before"  # e.g. on the cluster before a reshard
    three_client.hset(shard_map_key(first.namespace), "7", chosen_before)
    with RedisCluster.from_url(three_masters.url) as other:  # another process's store
        later = store_factory(other)
        [lease] = later.lease(["m"], "w", 7)

        assert [later.tag(p) for p in range(6)] == tags
        assert lease.status is LEASED
        bucket = later.record_bucket("m", 7)
        assert bucket is not None and bucket.startswith(f"{{{chosen_before}}}:ids:")


def test_a_batch_spanning_partitions_is_one_round_trip_per_master(
    three_client: RedisCluster, store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_factory(three_client)
    partitions = list(range(12))
    store.lease([f"m{p}" for p in partitions], "w0", partitions)  # fences made, scripts loaded
    masters = {node_of(three_client, store.effect_key("m", p)) for p in partitions}
    sent: list[int] = []
    send = redis.connection.Connection.send_packed_command

    def counted(connection: redis.connection.Connection, *args: Any, **kwargs: Any) -> None:
        sent.append(connection.port)
        send(connection, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    leases = store.lease([f"x{p}" for p in partitions], "w1", partitions)
    settled = store.settle(
        [Settlement(f"x{p}", c.token, True, None, (), 1) for p, c in enumerate(leases)],
        partitions,
    )

    assert [r.status for r in settled] == [SETTLED] * 12
    assert sorted(sent) == sorted([*masters, *masters])  # lease, settle: one write per master


# -- effects -----------------------------------------------------------------------------------


def test_effects_with_the_records_tag_apply_atomically_with_done(
    store: IdempotencyStore, client: RedisCluster
) -> None:
    ids = [f"m{p}" for p in range(4)]
    leases = store.lease(ids, "w1", [0, 1, 2, 3])
    items = [
        Settlement(id_, c.token, True, None, [("HINCRBY", store.effect_key("h", p), id_, 1)], 1)
        for p, (id_, c) in enumerate(zip(ids, leases, strict=True))
    ]

    assert [r.status for r in store.settle(items, [0, 1, 2, 3])] == [SETTLED] * 4
    for p, id_ in enumerate(ids):
        assert client.hgetall(store.effect_key("h", p)) == {id_.encode(): b"1"}
    assert [c.status for c in store.lease(ids, "w2", [0, 1, 2, 3])] == [DUPLICATE] * 4


def test_each_shards_lone_sets_are_one_mset_and_its_sadds_of_a_key_one_sadd(
    store: IdempotencyStore, client: RedisCluster
) -> None:
    partitions = [p for p in range(3) for _ in range(4)]  # per partition: two SETs, two SADDs
    ids = [f"m{i}" for i in range(len(partitions))]
    leases = store.lease(ids, "w1", partitions)

    def effect(i: int, p: int) -> Effect:
        if i % 4 < 2:
            return ("SET", store.effect_key(f"r:{ids[i]}", p), f"v{i}")
        return ("SADD", store.effect_key("seen", p), ids[i])

    items = [
        Settlement(ids[i], c.token, True, None, [effect(i, p)], 1)
        for i, (p, c) in enumerate(zip(partitions, leases, strict=True))
    ]
    before = calls(client, "mset", "sadd")

    assert [r.status for r in store.settle(items, partitions)] == [SETTLED] * len(ids)
    for i, p in enumerate(partitions):
        if i % 4 < 2:
            assert client.get(store.effect_key(f"r:{ids[i]}", p)) == f"v{i}".encode()
    for p in range(3):
        assert client.smembers(store.effect_key("seen", p)) == {
            b"m%d" % (4 * p + k) for k in (2, 3)
        }
    # in the shard's slot, so Redis took them merged: one MSET and one SADD per shard
    assert calls(client, "mset", "sadd") == {name: n + 3 for name, n in before.items()}


def calls(client: RedisCluster, *commands: str) -> dict[str, int]:
    """How many times the cluster's masters ran each of `commands` (INFO commandstats)."""
    found = dict.fromkeys(commands, 0)
    for node in client.get_primaries():  # type: ignore[no-untyped-call]
        stats = node.redis_connection.info("commandstats")
        for name in commands:
            found[name] += stats.get(f"cmdstat_{name}", {}).get("calls", 0)
    return found


@pytest.mark.parametrize("key", ["h", "{other}:h", "{%s:p1}:h"])
def test_an_effect_key_without_its_records_tag_is_refused_naming_the_rule(
    store: IdempotencyStore, client: RedisCluster, key: str
) -> None:
    [lease] = store.lease(["m"], "w1", 0)
    before = store.record("m", 0)
    wrong = key % store.namespace if "%s" in key else key

    with pytest.raises(EffectNotAllowed) as raised:
        store.settle([Settlement("m", lease.token, True, None, [("INCRBY", wrong, 1)], 1)], 0)

    assert "must carry its record's hash tag" in str(raised.value)
    assert f"{{{store.tag(0)}}}" in str(raised.value)
    assert store.record("m", 0) == before
    assert client.get(wrong) is None


def test_the_handlers_effects_object_names_keys_in_its_records_slot(
    store: IdempotencyStore,
) -> None:
    [lease] = store.lease(["m"], "w1", 5)
    effects = Effects(store, "m", lease.token, lease.attempts, 5)

    effects.incrby(effects.key("n"))
    with pytest.raises(EffectNotAllowed, match="hash tag"):
        effects.incrby("n")

    assert effects.commands == [("INCRBY", f"{{{store.tag(5)}}}:n", 1)]


# -- the bolt ----------------------------------------------------------------------------------


class CountInSlot:
    """The handler: counts each message in its partition's hash, a key in its record's slot."""

    def __call__(self, record: Record, effects: Effects) -> None:
        effects.hincrby(effects.key("applied"), effects.id)


def test_the_bolt_applies_each_message_once_on_a_cluster(
    cluster: RedisClusterServers,
    dedup_config: Callable[..., TopicConfig],
    producer: Producer,
    client: RedisCluster,
) -> None:
    config = dedup_config(redis={"url": cluster.url, "cluster": True})
    produce(producer, config.topic, {p: range(50) for p in PARTITIONS}, key=keyed)

    first = run(config, IdempotencyBolt(CountInSlot(), config))
    again = config.model_copy(update={"spout_id": config.spout_id + "-again"})
    second = run(again, IdempotencyBolt(CountInSlot(), again, namespace=config.spout_id))

    assert first.total("acked") == 50 * len(PARTITIONS)
    assert second.total("duplicates") == 50 * len(PARTITIONS)
    for p in PARTITIONS:
        tag = client.hget(shard_map_key(config.spout_id), str(p))  # the partition's, by slot
        assert tag is not None
        counts = client.hgetall(f"{{{tag.decode()}}}:applied")
        assert counts == {keyed(p, o): b"1" for o in range(50)}


# -- a master killed -----------------------------------------------------------------------------


def test_a_killed_master_refuses_its_partitions_until_back_and_loses_nothing(
    tmp_path_factory: pytest.TempPathFactory,
    store_factory: StoreFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = start_cluster(tmp_path_factory, 3)
    client = RedisCluster.from_url(servers.url)
    try:
        store = store_factory(client)
        partitions = list(range(6))

        def items(ids: list[str], leases: list[Any]) -> list[Settlement]:
            return [
                Settlement(i, c.token, True, None, [("INCRBY", store.effect_key(i, p), 1)], 1)
                for p, (i, c) in enumerate(zip(ids, leases, strict=True))
            ]

        done = [f"done{p}" for p in partitions]
        store.settle(items(done, store.lease(done, "w1", partitions)), partitions)
        open_ids = [f"open{p}" for p in partitions]
        open_leases = store.lease(open_ids, "w1", partitions)  # in flight when the master dies
        victim = next(
            n for n in servers.nodes if n.port == node_of(client, store.effect_key("x", 0))
        )

        reloads: list[bool] = []
        reload = client.nodes_manager.initialize
        monkeypatch.setattr(
            client.nodes_manager, "initialize", lambda: reloads.append(True) or reload()
        )

        victim.kill()
        with pytest.raises(redis.RedisError):
            store.lease(["late"], "w2", 0)  # an error, never a guess
        assert reloads  # and the slot map was read again: a failover may have moved the slots
        monkeypatch.undo()
        servers.start()  # back from its append-only file

        assert [c.status for c in store.lease(done, "w2", partitions)] == [DUPLICATE] * 6
        settled = store.settle(items(open_ids, open_leases), partitions)
        assert [r.status for r in settled] == [SETTLED] * 6  # the leases survived too
        for p, i in enumerate(done + open_ids):
            assert client.get(store.effect_key(i, p % 6)) == b"1"
    finally:
        client.close()
        servers.stop()

"""Waiting for replicas (`[dedup] wait_replicas`, `wait_aof`) against a real primary and a real
`redis-server --replicaof` it, which tests freeze (SIGSTOP) to make acknowledgements fall short.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from kazoo.client import KazooClient

from dedup import (
    IdempotencyBolt,
    IdempotencyStore,
    IdRecord,
    IdRecordState,
    LeaseStatus,
    NotDurable,
    Settlement,
    SettleStatus,
    WaitAofUnsupported,
    ZkEpoch,
)
from kspout.config import TopicConfig
from kspout.devstack import RedisServer
from kspout.devstack.ports import LOOPBACK
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from tests.integration.helpers import FAST_BACKOFF, highs, produce, stored
from tests.integration.test_dedup_bolt import Apply, applied, keyed

pytestmark = pytest.mark.integration

WAIT_MS = 300  # a frozen replica makes each wait last this long


class ReplicaServer(RedisServer):
    """A `redis-server --replicaof` the primary; ready once its link to the primary is up."""

    name = "redis-replica"

    def __init__(self, workdir: Path, primary: RedisServer) -> None:
        super().__init__(workdir)
        self.primary = primary

    def _command(self) -> list[str]:
        return [*super()._command(), "--replicaof", LOOPBACK, str(self.primary.port)]

    def _ready(self) -> bool:
        client = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1.0)
        try:
            return client.info("replication").get("master_link_status") == "up"
        except redis.RedisError:
            return False
        finally:
            client.close()


@pytest.fixture(scope="module")
def primary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("dedup-primary"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def replica(
    primary: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    server = ReplicaServer(tmp_path_factory.mktemp("dedup-replica"), primary)
    server.start()
    yield server
    server.stop()


@contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """SIGSTOP `server` (it keeps its connections but answers nothing), SIGCONT it after."""
    pid = server.pid
    assert pid is not None
    stat = Path(f"/proc/{pid}/stat")
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":  # the signal is asynchronous
            assert time.monotonic() < deadline, f"{server.name} did not stop"
            time.sleep(0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.fixture
def clients(
    primary: RedisServer, replica: RedisServer
) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    """Clients of the primary and of the replica."""
    pair = redis.Redis.from_url(primary.url), redis.Redis.from_url(replica.url)
    yield pair
    for client in pair:
        client.close()


@pytest.fixture
def make_store(clients: tuple[redis.Redis, redis.Redis], zk: KazooClient) -> Callable[..., Any]:
    """Stores on the primary (or `client`), on one fresh namespace; keyword arguments override
    settings."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    epoch = ZkEpoch(zk, f"/kspout-test/dedup/{namespace}/epoch")

    def make(**overrides: Any) -> IdempotencyStore:
        settings: dict[str, Any] = {"lease_ms": 10_000, "done_ttl_ms": 60_000}
        settings.update(overrides)
        client = settings.pop("client", clients[0])
        return IdempotencyStore(client, namespace=namespace, epoch_source=epoch, **settings)

    return make


def test_settlements_wait_until_the_replica_has_them(
    make_store: Callable[..., IdempotencyStore], clients: tuple[redis.Redis, redis.Redis]
) -> None:
    on_primary, on_replica = clients
    store = make_store(wait_replicas=1, wait_timeout_ms=10_000)
    counter = f"user-{uuid.uuid4().hex}:n"
    ids = [f"m{i}" for i in range(20)]
    leases = store.lease(ids, "w1")
    on_primary.script_flush()  # the settle script is loaded again, still in one pipeline

    results = store.settle(
        [
            Settlement(id_, lease.token, True, effects=[("INCRBY", counter, 1)])
            for id_, lease in zip(ids, leases, strict=True)
        ]
    )

    assert [r.status for r in results] == [SettleStatus.SETTLED] * len(ids)
    # read at once from the replica: WAIT returned only after it had every write
    assert on_replica.get(counter) == b"20"
    on_the_replica = make_store(client=on_replica)  # reads only
    assert {on_the_replica.record(id_) for id_ in ids} == {
        IdRecord(IdRecordState.DONE, leases[0].token, 1)
    }
    assert [c.status for c in store.lease(ids, "w2")] == [LeaseStatus.DUPLICATE] * len(ids)


def test_a_settlement_the_replica_did_not_acknowledge_is_not_durable_and_replays_wait(
    make_store: Callable[..., IdempotencyStore],
    clients: tuple[redis.Redis, redis.Redis],
    replica: RedisServer,
) -> None:
    on_primary, on_replica = clients
    store = make_store(wait_replicas=1, wait_timeout_ms=WAIT_MS)
    ids = ["a", "b"]
    leases = store.lease(ids, "w1")
    items = [Settlement(id_, c.token, True) for id_, c in zip(ids, leases, strict=True)]

    with frozen(replica):
        with pytest.raises(NotDurable) as raised:
            store.settle(items)
        replays = store.lease(ids, "w2")

    assert (raised.value.command, raised.value.wanted, raised.value.acked) == ("WAIT", (1,), (0,))
    assert [r.status for r in raised.value.results] == [SettleStatus.SETTLED] * 2
    record = store.record("a")
    assert record is not None and record.state is IdRecordState.DONE  # on the primary
    # DONE on the primary alone: replays wait instead of being acked as duplicates
    assert [(c.status, c.retry_after_ms) for c in replays] == [(LeaseStatus.DEFERRED, WAIT_MS)] * 2
    assert [c.status for c in store.lease(ids, "w3")] == [LeaseStatus.DUPLICATE] * 2
    bucket = store.record_bucket("b")
    assert bucket is not None and on_replica.hget(bucket, "b") == on_primary.hget(bucket, "b")


def test_at_maxmemory_a_lease_that_wrote_nothing_proves_nothing_so_replays_wait(
    make_store: Callable[..., IdempotencyStore], clients: tuple[redis.Redis, redis.Redis]
) -> None:
    on_primary, _ = clients
    store = make_store(wait_replicas=1, wait_timeout_ms=10_000)
    [lease] = store.lease(["m"], "w1")
    store.settle([Settlement("m", lease.token, True)])
    try:
        on_primary.config_set("maxmemory", 1)  # every write is refused (noeviction)
        [replay] = store.lease(["m"], "w2")  # answered from reads: no write for WAIT to cover
    finally:
        on_primary.config_set("maxmemory", 0)

    assert replay.status is LeaseStatus.DEFERRED
    assert store.lease(["m"], "w2")[0].status is LeaseStatus.DUPLICATE


def test_wait_aof_runs_where_the_server_has_waitaof_and_is_refused_where_not(
    make_store: Callable[..., IdempotencyStore], clients: tuple[redis.Redis, redis.Redis]
) -> None:
    version = tuple(int(part) for part in clients[0].info("server")["redis_version"].split("."))
    store = make_store(wait_replicas=1, wait_timeout_ms=10_000, wait_aof=True)

    if version >= (7, 2):
        [lease] = store.lease(["m"], "w1")
        assert store.settle([Settlement("m", lease.token, True)])[0].status is SettleStatus.SETTLED
    else:
        with pytest.raises(WaitAofUnsupported, match="unknown command"):
            store.lease(["m"], "w1")
        # refused before any record was written
        assert clients[0].keys(f"{{{store.namespace}}}:ids:*") == []


def test_the_bolt_acks_nothing_the_replica_did_not_acknowledge(
    make_config: Callable[..., TopicConfig],
    primary: RedisServer,
    replica: RedisServer,
    producer: Producer,
    clients: tuple[redis.Redis, redis.Redis],
) -> None:
    on_primary, _ = clients
    config = make_config(
        dedup={"id_source": "key", "lease": 30.0, "wait_replicas": 1, "wait_timeout": 0.2},
        redis={"url": primary.url},
        infra_backoff=FAST_BACKOFF,
        defer_delay=0.05,
    )
    produce(producer, config.topic, {0: range(10)}, key=keyed)
    effect = f"{config.topic}:applied"
    ids = {keyed(0, o).decode(): 1 for o in range(10)}
    bolt = IdempotencyBolt(Apply(effect), config)

    with Driver(config, LocalExecutor(config, bolt)) as driver:
        with frozen(replica):
            deadline = time.monotonic() + 30
            while driver.progress().total("deferred") < 10 and time.monotonic() < deadline:
                driver.step()
            frozen_progress = driver.progress()
        final = driver.run(until_caught_up=True)

    # frozen: run once, settled on the primary, released (no attempt spent), then deferred
    assert frozen_progress.total("released") == 10
    assert frozen_progress.total("deferred") >= 10
    assert frozen_progress.total("acked") == frozen_progress.total("duplicates") == 0
    assert frozen_progress.total("retried") == 0
    # thawed: the replays find the DONE records, now on the replica too, and ack as duplicates
    assert final.total("duplicates") == 10 and final.total("acked") == 0
    assert applied(on_primary, effect) == ids
    assert stored(config)[0] == highs(config)[0] == 10

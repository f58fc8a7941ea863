"""`IdempotencyBolt`: exactly-once effects for a handler, across replays, crashes and timeouts.

It wraps the handler that applies a message's side effects and runs first in its stage. Per
part of a task's batch (`dedup.overlap.IDS_PER_CALL` ids) it makes one lease call and one
settlement call, written to Redis so that Redis leases the next part and settles the last one
while the handler runs this one.

* DONE before: the message is acked as a DUPLICATE; the handler does not run.
* In flight in another task with a live lease (a timeout replay while the original still
  runs): DEFERRED, offered again after `defer_delay` without spending an attempt.
* Leased: the handler runs with an `Effects` buffer. If it returns, its Redis effects are
  applied and the record marked DONE in one Lua call, only if this lease's fencing token still
  holds the record. If it raises, the record is marked FAILED and the message fails with
  EXCEPTION, to be retried; if what it raised is `KafkaUnavailable` (a Kafka it writes to is
  down: `KafkaOutput.flush`), the message is released instead, no attempt spent; if it raised
  `KafkaRefused` (Kafka refused the principal that write: a revoked ACL), it is released and
  the bolt raises the refusal once the batch is settled, which stops the run; and so it is
  released if it raised `FencedOut` and Redis still took its lease as current (Redis lost the newer
  lease with its last writes, and a replay's lease will outrun the sink's token).
* No id: the message goes to the dead-letter topic (INVALID), counted.
* REJECTED (the id's record key, or one of its effects, is something Redis would refuse:
  another type, a non-integer, an overflow): the message fails with EXCEPTION and Redis's
  reason, alone; the rest of the batch goes on. Not INVALID: the fault is in Redis's data,
  which an operator can repair while retries back off, and the dead letter names it if not.
* With `[dedup] wait_replicas`/`wait_aof`, a settlement the replicas did not acknowledge in time
  releases the messages it ran (no attempt spent, the partition backs off like for any Redis
  fault): their DONE records may not survive a failover. A replay that finds one DONE is
  acked as a DUPLICATE once the replicas have it (DEFERRED until then); one that finds it
  lost runs again.

So a task that dies without a word leaves a lease that expires and is leased again (nothing
lost); an original that times out and throws later settles FAILED, and the next replay leases
and runs it (nothing stuck); a zombie whose lease was taken over finds its settlement refused
(nothing applied twice).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import redis
from kazoo.client import KazooClient
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from dedup.effects import check_effect
from dedup.epoch import ZkEpoch
from dedup.errors import FencedOut, NotDurable
from dedup.ids import IdReader, id_reader
from dedup.overlap import overlapped
from dedup.records import Effect, LeaseRun, LeaseStatus, Settlement, SettleResult, SettleStatus
from dedup.server_checks import require_wait_aof, server_durability_warnings
from dedup.store import IdempotencyStore, Sent
from dedup.wire import Client
from kspout.bolts import Bolt, Collector, TaskContext, Tuple
from kspout.channel.beacon import thread_beacon
from kspout.config import TopicConfig
from kspout.errors import (
    KafkaRefused,
    KafkaUnavailable,
    RedisLoginRefused,
    RedisTlsRefused,
    RedisUnavailable,
)
from kspout.kafka import Record
from kspout.outcomes import describe_error
from kspout.worker_clients import WorkerClients

log = logging.getLogger(__name__)


def _tls_refused(exc: BaseException) -> bool:
    """A failed TLS handshake: redis-py raises ConnectionError from ssl's error, or words it
    with ssl's own reason (`[SSL: ...]`)."""
    causes = (exc, exc.__cause__, exc.__context__)
    return "[SSL" in str(exc) or any(isinstance(c, ssl.SSLError) for c in causes)


class Effects:
    """One leased message's side effects, applied atomically with marking it DONE.

    Add Redis writes (`hincrby`, `incrby`, `sadd`, `set`, `hset`); they happen only if the
    handler returns and this lease still holds the message. On a Redis Cluster every key must
    carry the message's hash tag, `{<namespace>:p<partition>}`, to be in its record's slot:
    name keys with `key(name)`, which works on one server too. For effects in PostgreSQL, pass
    this object to `dedup.postgres.PostgresSink.write`, which commits them with the `token`
    fenced in the same transaction; `still_owner()` is no fence.
    """

    __slots__ = ("_store", "attempt", "commands", "id", "partition", "token")

    def __init__(
        self, store: IdempotencyStore, id: str, token: int, attempt: int, partition: int = 0
    ) -> None:
        self._store = store
        self.id = id
        self.token = token  # the fencing token: strictly increasing per lease
        self.attempt = attempt  # 1 for the first lease of this id
        self.partition = partition  # the message's Kafka partition: its record's shard
        self.commands: list[Effect] = []

    def key(self, name: str) -> str:
        """`name` under this message's hash tag (`{<namespace>}:<name>` on one server,
        `{<namespace>:p<partition>}:<name>` on a cluster): a key effects may write."""
        return self._store.effect_key(name, self.partition)

    def add(self, *command: str | bytes | int | float) -> None:
        """Any allowed write, e.g. `add("HINCRBY", key, field, 1)`; checked at once."""
        store, partition = self._store, self.partition
        check_effect(self.id, command, store.effect_tag(partition), store.tag(partition))
        self.commands.append(command)

    def hincrby(self, key: str, field: str, amount: int = 1) -> None:
        self.add("HINCRBY", key, field, amount)

    def incrby(self, key: str, amount: int = 1) -> None:
        self.add("INCRBY", key, amount)

    def sadd(self, key: str, *members: str | bytes | int) -> None:
        self.add("SADD", key, *members)

    def set(self, key: str, value: str | bytes | int | float) -> None:
        self.add("SET", key, value)

    def hset(self, key: str, field: str, value: str | bytes | int | float) -> None:
        self.add("HSET", key, field, value)

    def still_owner(self) -> bool:
        """True if this lease held the message when Redis answered, and no more than that.

        Not a fence: the lease can run out and a newer lease take the message over right after
        the answer, so a write that follows a True can still land as a zombie's. Effects outside
        Redis need a sink that checks the token in the same transaction as the write
        (`dedup.postgres.PostgresSink`)."""
        return self._store.still_holds(self.id, self.token, self.partition)


EffectHandler = Callable[[Record, Effects], object]

# Seconds a connection to Redis may take: an address that drops packets (a firewall, a host
# that is gone) is then an error in seconds, not after the OS's TCP timeout of minutes.
REDIS_CONNECT_TIMEOUT = 10.0


def _new_redis(config: TopicConfig) -> Client:
    settings = config.redis_args() | {"socket_connect_timeout": REDIS_CONNECT_TIMEOUT}
    if config.redis.cluster:
        return RedisCluster.from_url(**settings)
    return redis.Redis.from_url(**settings)


_redis = WorkerClients(_new_redis)


def redis_client(config: TopicConfig) -> Client:
    """This worker's client for the topic's `[redis]` (`cluster = true`: a Redis Cluster's)."""
    return _redis.get(config)


def primaries(client: Client) -> list[redis.Redis]:
    """A client per server that takes writes: the cluster's masters, or the one server."""
    if isinstance(client, RedisCluster):
        nodes = client.get_primaries()  # type: ignore[no-untyped-call]
        return [client.get_redis_connection(node) for node in nodes]
    return [client]


def _new_zookeeper(config: TopicConfig) -> KazooClient:
    """A started ZooKeeper client for the config's ensemble and credentials (with
    `[zookeeper_auth]`, the epoch znode gets the same digest ACL as the offsets)."""
    client = KazooClient(**config.kazoo_args(), timeout=10.0)
    client.start(timeout=15.0)
    return client


_zookeepers = WorkerClients(_new_zookeeper)


def _new_store(config: TopicConfig, namespace: str) -> IdempotencyStore:
    return IdempotencyStore(
        redis_client(config),
        namespace=namespace,
        lease_ms=int(config.dedup.lease * 1000),
        done_ttl_ms=int(config.dedup.ttl * 1000),
        epoch_source=ZkEpoch(_zookeepers.get(config), f"{config.zk_root}/dedup/{namespace}/epoch"),
        wait_replicas=config.dedup.wait_replicas,
        wait_timeout_ms=max(1, int(config.dedup.wait_timeout * 1000)),
        wait_aof=config.dedup.wait_aof,
    )


_stores = WorkerClients(_new_store)


def worker_store(config: TopicConfig, namespace: str) -> IdempotencyStore:
    """This Python worker's store for the namespace (clients are made here, not shipped)."""
    return _stores.get(config, namespace)


@dataclass(slots=True)
class _Ran:
    """A part's tuples that ran, their settlements, and what their handlers raised (by index)."""

    tuples: list[Tuple]
    settlements: list[Settlement]
    raised: dict[int, Exception]


class IdempotencyBolt(Bolt):
    """Runs `handler(record, effects)` at most once to completion per message id.

    The handler is the user code: the bolt emits nothing, so it ends its chain (a bolt after
    it would never run; `Topology.of` refuses that chain).
    """

    terminal = True
    must_be_first = True  # after a fan-out, sibling tuples share the root's id

    def __init__(
        self, handler: EffectHandler, config: TopicConfig, *, namespace: str | None = None
    ) -> None:
        self.handler = handler
        self.config = config
        self.namespace = namespace or config.spout_id
        self.warnings: list[str] = []
        self._read_id: IdReader = id_reader(config.dedup.id_source)

    def replay_window(self) -> float:
        """DONE records live `[dedup] ttl`: a replay of older messages would apply them again."""
        return self.config.dedup.ttl

    def start(self) -> None:
        """On the driver: warn when a Redis server (each master of a cluster) could lose
        acknowledged records; refuse `wait_aof` on a server without WAITAOF; `RedisUnavailable`
        when Redis does not answer, `RedisLoginRefused` or `RedisTlsRefused` when it refuses
        this client."""
        self.warnings = []
        try:
            for server in primaries(redis_client(self.config)):
                if self.config.dedup.wait_aof:
                    require_wait_aof(server)
                self.warnings += server_durability_warnings(server)
        except redis.AuthenticationError as exc:
            user = self.config.redis.username or "default"
            raise RedisLoginRefused(self.config.redis.url, user, str(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
            url = self.config.redis.url
            if _tls_refused(exc):
                raise RedisTlsRefused(url, str(exc)) from None
            raise RedisUnavailable(url, self.config.origin("redis.url"), str(exc)) from None
        for warning in dict.fromkeys(self.warnings):
            log.warning("dedup Redis %s: %s", self.config.redis.url, warning)

    def prepare(self, context: TaskContext) -> None:
        self._store = worker_store(self.config, self.namespace)
        host = socket.gethostname()
        self._owner = f"{host}:{os.getpid()}:{context.batch}:{uuid.uuid4().hex[:12]}"

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        self.execute_batch([tuple_], collector)

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        """Lease the batch's ids, run the handler on the leased ones, settle them; in parts, the
        next part's lease and the last one's settlement in Redis while the handler runs
        (`dedup.overlap`)."""
        ids: list[str] = []
        known: list[Tuple] = []
        for tuple_ in tuples:
            id_, why = self._read_id(tuple_.record)
            if id_ is None:
                collector.invalid(tuple_, why)
            else:
                ids.append(id_)
                known.append(tuple_)
        partitions = [tuple_.record.partition for tuple_ in known]
        refusals: list[KafkaRefused] = []
        overlapped(
            self._store,
            ids,
            partitions,
            self._owner,
            partial(self._run_part, known, ids, collector),
            partial(self._answer, collector, refusals),
        )
        if refusals:
            raise refusals[0]  # a right the principal lost: the task is released, the run stops

    def _run_part(
        self,
        known: list[Tuple],
        ids: list[str],
        collector: Collector,
        start: int,
        runs: list[LeaseRun],
    ) -> tuple[list[Settlement], list[int], _Ran]:
        """Answer a part's ids that did not lease, run the handler on those that did: their
        settlements, partitions, and the tuples that ran with what their handlers raised."""
        ran = _Ran([], [], {})
        for run in runs:
            first = start + run.start
            answered = zip(
                known[first : first + run.length], ids[first : first + run.length], strict=True
            )
            if run.status is LeaseStatus.DUPLICATE:
                for tuple_, _ in answered:
                    collector.duplicate(tuple_)
            elif run.status is LeaseStatus.DEFERRED:
                for tuple_, _ in answered:
                    collector.defer(tuple_)
            elif run.status is LeaseStatus.REJECTED:
                for (tuple_, id_), why in zip(answered, run.errors, strict=True):
                    collector.fail(tuple_, f"Redis rejected the lease of {id_!r}: {why}")
            else:
                for tuple_, id_ in answered:
                    settlement, exc = self._run(tuple_.record, id_, run.token, run.attempts)
                    if exc is not None:
                        ran.raised[len(ran.tuples)] = exc
                    ran.settlements.append(settlement)
                    ran.tuples.append(tuple_)
        thread_beacon().current = None  # what follows is Redis's time, not the last message's
        return ran.settlements, [t.record.partition for t in ran.tuples], ran

    def _answer(
        self,
        collector: Collector,
        refusals: list[KafkaRefused],
        sent: Sent[list[SettleResult]],
        ran: _Ran,
    ) -> None:
        """Answer each tuple of a part that ran, by how its settlement ended."""
        try:
            results = sent.result()
        except NotDurable as exc:
            for tuple_ in ran.tuples:
                collector.release(tuple_, str(exc))
            return
        raised = ran.raised
        for i, (tuple_, item, (status, error)) in enumerate(
            zip(ran.tuples, ran.settlements, results, strict=True)
        ):
            if status is SettleStatus.SETTLED:
                if item.done:
                    collector.ack(tuple_)
                elif isinstance(raised.get(i), KafkaUnavailable | KafkaRefused):
                    # FAILED in Redis, so a replay leases it; no attempt spent
                    collector.release(tuple_, item.error or "Kafka unavailable")
                elif isinstance(raised.get(i), FencedOut):
                    # The sink holds a higher token, yet Redis took this lease as current: Redis
                    # lost the lease that wrote (its last writes, in a machine crash) and handed
                    # out a lower token again. No fault of the message: a replay leases it anew.
                    collector.release(tuple_, f"{item.error}; Redis had lost that newer claim")
                else:
                    collector.fail(tuple_, raised.get(i) or item.error or "failed")
            elif status is SettleStatus.STALE:
                collector.defer(tuple_)  # another lease holds it now: it settles the message
            elif status is SettleStatus.LOST:
                collector.fail(tuple_, f"idempotency record of {item.id!r} vanished from Redis")
            else:
                collector.fail(tuple_, f"Redis rejected the settlement of {item.id!r}: {error}")
        refusals += (what for what in raised.values() if isinstance(what, KafkaRefused))

    def _run(
        self, record: Record, id_: str, token: int, attempt: int
    ) -> tuple[Settlement, Exception | None]:
        """Run the handler on one leased message: how it ended, to settle, and what it raised
        (a `KafkaUnavailable`, an outage of a Kafka it writes to, is not its fault)."""
        effects = Effects(self._store, id_, token, attempt, record.partition)
        thread_beacon().current = record
        try:
            self.handler(record, effects)
        except Exception as exc:
            return Settlement(id_, token, False, describe_error(exc), (), attempt), exc
        return Settlement(id_, token, True, None, effects.commands, attempt), None

    def __getstate__(self) -> dict[str, object]:
        """Only the settings travel to executors; clients are made there."""
        return {
            "handler": self.handler,
            "config": self.config,
            "namespace": self.namespace,
            "warnings": self.warnings,
        }

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._read_id = id_reader(self.config.dedup.id_source)

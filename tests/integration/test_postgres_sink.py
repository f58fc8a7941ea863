"""The fenced SQL sink against a real PostgreSQL server, with tokens from real leases in Redis.

Each test has its own fence table and effects table. The effect of a message is an upsert that
counts how often it was applied (`n`) and keeps the token of the lease that applied it last, so
the tests see exactly what committed. A zombie here is a lease whose lease ran out and was taken
over by a newer lease of the same id (real tokens: the newer one is higher).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest
import redis
from confluent_kafka import Producer
from kazoo.client import KazooClient

from dedup import (
    Effects,
    IdempotencyBolt,
    IdempotencyStore,
    IdRecordState,
    Lease,
    LeaseStatus,
    Settlement,
    SettleStatus,
    ZkEpoch,
)
from dedup.bolt import worker_store
from dedup.errors import FencedOut, FenceTableMissing
from dedup.postgres import PostgresSink, SinkOutcome
from kspout.config import TopicConfig
from kspout.devstack import DevStack, PostgresServer
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from tests.integration.helpers import produce

pytestmark = pytest.mark.integration

APPLIED, ALREADY_APPLIED = SinkOutcome.APPLIED, SinkOutcome.ALREADY_APPLIED
SHORT_LEASE_MS = 200  # leases the tests wait out (by polling the lease, never by a fixed sleep)
WAIT = 20.0  # seconds a condition may take before the test fails with what it waited for


class Tables:
    """This test's fence table and effects table, and what they hold."""

    def __init__(self, url: str) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.url = url
        self.fence = f"fence_{suffix}"
        self.effects = f"effects_{suffix}"
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {self.effects} (id text PRIMARY KEY, token bigint, n int)")

    def effect(self, id: str, token: int) -> Callable[[psycopg.Cursor[Any]], None]:
        """The message's effect: count one application of `id` by the lease with `token`."""

        def apply(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                f"INSERT INTO {self.effects} AS e (id, token, n) VALUES (%s, %s, 1)"
                " ON CONFLICT (id) DO UPDATE SET token = excluded.token, n = e.n + 1",
                (id, token),
            )

        return apply

    def applied(self) -> dict[str, tuple[int, int]]:
        """`{id: (token of the lease that applied it, times applied)}`."""
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(f"SELECT id, token, n FROM {self.effects}").fetchall()
        return {id: (token, n) for id, token, n in rows}

    def fence_rows(self) -> dict[str, int]:
        with psycopg.connect(self.url) as conn:
            rows = conn.execute(f"SELECT id, token FROM {self.fence}").fetchall()
        return dict(rows)

    def waiting_writers(self) -> int:
        """Sessions blocked on a lock in a statement on this test's fence table."""
        with psycopg.connect(self.url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f"%{self.fence}%",),
            ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def tables(postgres: PostgresServer) -> Tables:
    return Tables(postgres.url)


@pytest.fixture
def namespace() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sink(postgres: PostgresServer, tables: Tables, namespace: str) -> Iterator[PostgresSink]:
    made = PostgresSink(postgres.url, namespace, table=tables.fence)
    made.create_table()
    yield made
    made.close()


@pytest.fixture
def store(redis_client: redis.Redis, zk: KazooClient, namespace: str) -> IdempotencyStore:
    """Leases in the stack's Redis, with leases short enough to run out within a test."""
    epoch = ZkEpoch(zk, f"/kspout-test/dedup/{namespace}/epoch")
    return IdempotencyStore(
        redis_client,
        namespace=namespace,
        lease_ms=SHORT_LEASE_MS,
        done_ttl_ms=60_000,
        epoch_source=epoch,
    )


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"waited {WAIT:.0f} s for {what}"
        time.sleep(0.01)


def lease_once_lease_ends(store: IdempotencyStore, id: str, owner: str) -> Lease:
    """Lease `id` for `owner` as soon as the current holder's lease has run out."""
    leases: list[Lease] = []

    def leased() -> bool:
        leases[:] = store.lease([id], owner)
        return leases[0].status is LeaseStatus.LEASED

    wait_for(leased, f"the lease on {id!r} to run out")
    return leases[0]


def zombie_and_newer(store: IdempotencyStore, id: str) -> tuple[Lease, Lease]:
    """Two leases of `id`: the first one's lease ran out and the second took the message over."""
    [zombie] = store.lease([id], "zombie")
    assert zombie.status is LeaseStatus.LEASED
    newer = lease_once_lease_ends(store, id, "newer")
    assert newer.token > zombie.token
    return zombie, newer


def settle(store: IdempotencyStore, item: Settlement) -> SettleStatus:
    [result] = store.settle([item])
    return result.status


def effects(store: IdempotencyStore, id: str, lease: Lease) -> Effects:
    return Effects(store, id, lease.token, lease.attempts)


def test_a_zombie_that_writes_after_the_newer_owner_is_refused_by_the_database(
    sink: PostgresSink, tables: Tables, store: IdempotencyStore
) -> None:
    zombie, newer = zombie_and_newer(store, "m1")

    assert sink.write(effects(store, "m1", newer), tables.effect("m1", newer.token)) is APPLIED
    with pytest.raises(FencedOut) as refused:
        sink.write(effects(store, "m1", zombie), tables.effect("m1", zombie.token))

    assert (refused.value.token, refused.value.fence_token) == (zombie.token, newer.token)
    assert tables.applied() == {"m1": (newer.token, 1)}
    assert tables.fence_rows() == {"m1": newer.token}


def test_a_zombie_that_writes_first_leaves_the_newer_owner_nothing_to_apply(
    sink: PostgresSink, tables: Tables, store: IdempotencyStore
) -> None:
    zombie, newer = zombie_and_newer(store, "m1")

    assert sink.write(effects(store, "m1", zombie), tables.effect("m1", zombie.token)) is APPLIED
    outcome = sink.write(effects(store, "m1", newer), tables.effect("m1", newer.token))

    assert outcome is ALREADY_APPLIED
    assert tables.applied() == {"m1": (zombie.token, 1)}
    # The newer owner settles the message DONE in Redis; the zombie's settlement is refused.
    assert settle(store, Settlement("m1", newer.token, True)) is SettleStatus.SETTLED
    assert settle(store, Settlement("m1", zombie.token, True)) is SettleStatus.STALE


@pytest.mark.parametrize("first", ["zombie", "newer"])
@pytest.mark.parametrize("first_ends", ["commits", "raises"])
def test_concurrent_writers_of_one_id_wait_for_each_other_and_apply_once(
    sink: PostgresSink,
    tables: Tables,
    store: IdempotencyStore,
    first: str,
    first_ends: str,
) -> None:
    """The first writer's transaction is open (its fence row inserted, its effects running)
    when the second one writes: the second waits on the fence row, then sees how the first
    ended. A commit leaves the second nothing to apply (or fences it out, if it is the zombie);
    a rollback lets the second apply, whichever token it has."""
    zombie, newer = zombie_and_newer(store, "m1")
    one, two = (zombie, newer) if first == "zombie" else (newer, zombie)
    release = threading.Event()
    inside = threading.Event()

    def first_effects(cur: psycopg.Cursor[Any]) -> None:
        tables.effect("m1", one.token)(cur)
        inside.set()
        release.wait(WAIT)
        if first_ends == "raises":
            raise RuntimeError("the first writer's effects fail")

    one_done = write_in_thread(sink, effects(store, "m1", one), first_effects)
    wait_for(inside.is_set, "the first writer to be inside its transaction")
    two_done = write_in_thread(sink, effects(store, "m1", two), tables.effect("m1", two.token))
    wait_for(lambda: tables.waiting_writers() == 1, "the second writer to wait on the first")
    release.set()
    one_result, two_result = outcome(one_done), outcome(two_done)

    if first_ends == "commits":
        assert one_result is APPLIED
        assert two_result is (ALREADY_APPLIED if two is newer else FencedOut)
        assert tables.applied() == {"m1": (one.token, 1)}
    else:
        assert one_result is RuntimeError and two_result is APPLIED
        assert tables.applied() == {"m1": (two.token, 1)}


def write_in_thread(
    sink: PostgresSink, lease: Effects, apply: Callable[[psycopg.Cursor[Any]], None]
) -> Future[SinkOutcome]:
    """`sink.write` in a thread of its own (so on a connection of its own)."""
    future: Future[SinkOutcome] = Future()

    def run() -> None:
        try:
            future.set_result(sink.write(lease, apply))
        except BaseException as exc:
            future.set_exception(exc)
        finally:
            sink.close()

    threading.Thread(target=run, daemon=True).start()
    return future


def outcome(future: Future[SinkOutcome]) -> SinkOutcome | type[BaseException]:
    """The write's outcome, or the class of what it raised."""
    error = future.exception(WAIT)
    return future.result() if error is None else type(error)


def test_effects_that_raise_roll_back_the_fence_row_too(
    sink: PostgresSink, tables: Tables, store: IdempotencyStore
) -> None:
    [lease] = store.lease(["m1"], "w1")

    def half_then_fail(cur: psycopg.Cursor[Any]) -> None:
        tables.effect("m1", lease.token)(cur)
        raise RuntimeError("the second half of the effects fails")

    with pytest.raises(RuntimeError, match="second half"):
        sink.write(effects(store, "m1", lease), half_then_fail)
    assert tables.fence_rows() == {} and tables.applied() == {}

    # The message fails and runs again: its effects apply then, once.
    assert settle(store, Settlement("m1", lease.token, False, "failed")) is SettleStatus.SETTLED
    [retry] = store.lease(["m1"], "w2")
    assert sink.write(effects(store, "m1", retry), tables.effect("m1", retry.token)) is APPLIED
    assert tables.applied() == {"m1": (retry.token, 1)}


def test_a_crash_between_the_commit_and_the_redis_settlement_applies_once(
    sink: PostgresSink, tables: Tables, store: IdempotencyStore
) -> None:
    [first] = store.lease(["m1"], "w1")
    assert sink.write(effects(store, "m1", first), tables.effect("m1", first.token)) is APPLIED
    # w1 dies here: its lease is never settled. Once its lease ends, the replay leases again.
    again = lease_once_lease_ends(store, "m1", "w2")
    assert again.attempts == 2

    outcome = sink.write(effects(store, "m1", again), tables.effect("m1", again.token))

    assert outcome is ALREADY_APPLIED
    assert settle(store, Settlement("m1", again.token, True)) is SettleStatus.SETTLED
    assert store.lease(["m1"], "w3")[0].status is LeaseStatus.DUPLICATE
    assert tables.applied() == {"m1": (first.token, 1)}


def test_a_missing_fence_table_says_how_to_create_it(
    postgres: PostgresServer, tables: Tables, store: IdempotencyStore, namespace: str
) -> None:
    [lease] = store.lease(["m1"], "w1")
    sink = PostgresSink(postgres.url, namespace, table=f"missing_{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(FenceTableMissing, match=r"create_table\(\)"):
            sink.write(effects(store, "m1", lease), tables.effect("m1", lease.token))
    finally:
        sink.close()
    assert tables.applied() == {}


# -- in the dedup bolt -------------------------------------------------------------------------


class SinkHandler:
    """The bolt's handler: the effect goes to PostgreSQL through the sink. On the first run of
    `zombie_id` it first plays the newer owner: it waits until its own lease has run out, leases
    the message, writes the effect and settles it DONE, so that its own write comes late."""

    def __init__(self, sink: PostgresSink, tables: Tables, zombie_id: str) -> None:
        self.sink = sink
        self.tables = tables
        self.zombie_id = zombie_id
        self.store: IdempotencyStore | None = None
        self.fenced_out: list[FencedOut] = []

    def __call__(self, record: Record, effects: Effects) -> None:
        if effects.id == self.zombie_id and effects.attempt == 1:
            assert self.store is not None
            newer = lease_once_lease_ends(self.store, effects.id, "newer owner")
            self.sink.write(
                Effects(self.store, effects.id, newer.token, newer.attempts),
                self.tables.effect(effects.id, newer.token),
            )
            self.store.settle([Settlement(effects.id, newer.token, True)])
        try:
            self.sink.write(effects, self.tables.effect(effects.id, effects.token))
        except FencedOut as exc:
            self.fenced_out.append(exc)
            raise


def test_in_the_bolt_a_fenced_out_zombie_is_not_acked_and_the_newer_owner_settles(
    make_config: Callable[..., TopicConfig],
    stack: DevStack,
    producer: Producer,
    sink: PostgresSink,
    tables: Tables,
    namespace: str,
) -> None:
    config = make_config(
        redis={"url": stack.info.redis_url},
        dedup={"id_source": "key", "lease": SHORT_LEASE_MS / 1000},
        defer_delay=0.05,
        max_retries=0,  # a spent attempt would dead-letter the message
    )
    produce(producer, config.topic, {0: range(10)}, key=lambda p, o: b"id-%d" % o)
    handler = SinkHandler(sink, tables, zombie_id="id-4")
    bolt = IdempotencyBolt(handler, config, namespace=namespace)
    store = handler.store = worker_store(config, namespace)

    with Driver(config, LocalExecutor(config, bolt)) as driver:
        progress = driver.run(until_caught_up=True)

    [refused] = handler.fenced_out
    applied = tables.applied()
    assert applied["id-4"] == (refused.fence_token, 1)  # the newer owner's write, once
    assert {id: n for id, (_, n) in applied.items()} == {f"id-{o}": 1 for o in range(10)}
    # The zombie's message was neither acked nor failed: deferred, then found DONE.
    assert progress.total("acked") == 9 and progress.total("duplicates") == 1
    assert progress.total("retried") == 0 and progress.total("dead_lettered") == 0
    record = store.record("id-4")
    assert record is not None and record.state is IdRecordState.DONE
    assert record.token == refused.fence_token


def test_writes_run_at_read_committed_whatever_the_session_default(
    postgres: PostgresServer, tables: Tables, store: IdempotencyStore, namespace: str
) -> None:
    """At REPEATABLE READ or SERIALIZABLE the fence's follow-up SELECT would miss the row a
    concurrent writer committed (and the insert would fail with a serialization error)."""
    serializable = f"{postgres.url}?options=-c%20default_transaction_isolation%3Dserializable"
    sink = PostgresSink(serializable, namespace, table=tables.fence)
    sink.create_table()
    [lease] = store.lease(["m1"], "w1")
    seen: list[str] = []

    def apply(cur: psycopg.Cursor[Any]) -> None:
        row = cur.execute("SHOW transaction_isolation").fetchone()
        assert row is not None
        seen.append(row[0])

    try:
        assert sink.write(effects(store, "m1", lease), apply) is APPLIED
    finally:
        sink.close()
    assert seen == ["read committed"]

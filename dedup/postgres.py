"""`PostgresSink`: a message's effects in PostgreSQL, committed at most once, fenced by token.

`Effects.still_owner()` only says that a lease was current when Redis answered; a write that
follows it can land after a newer lease took the message over. This sink makes PostgreSQL itself
the fence: the message's effects commit in one transaction together with a row of the fence
table, and that row decides.

The invariant: **a message's effects commit at most once in PostgreSQL.** The fence table holds
one row per message id (and dedup namespace) with the fencing token of the lease that committed
its effects. `write(lease, apply)` runs, in one READ COMMITTED transaction:

1. `INSERT INTO fence (namespace, id, token) VALUES (...) ON CONFLICT DO NOTHING RETURNING`;
2. the row went in: `apply(cursor)` runs the message's effects; COMMIT makes row and effects
   visible together (APPLIED); if `apply` raises, both roll back and the message can run again;
3. a row was there: nothing is applied, and its token tells who committed:
   * a higher token: a newer lease took the message over and already committed; this writer is
     a zombie (its lease ran out while it ran). `FencedOut` is raised, not returned, so a zombie
     cannot carry on as if it had written: out of the handler it makes the bolt settle FAILED
     with a stale token, which Redis refuses (STALE: the message is deferred, not acked), and
     the newer owner settles it. If Redis accepts it instead, Redis lost the newer lease with
     its last writes (`appendfsync everysec` on a machine crash) and handed out a lower token
     again: the bolt releases the message (no attempt spent), and a replay's newer lease finds
     the effects ALREADY_APPLIED (tests/chaos/test_redis_kill.py);
   * a lower or equal token: an earlier lease committed the effects (a zombie that wrote first,
     a handler that raised after the commit, a commit whose reply was lost, a Redis settlement
     that never happened because its task died). The answer is ALREADY_APPLIED: the handler
     returns, and the bolt settles the message DONE without applying it again.

Why this statement, at READ COMMITTED: `INSERT ... ON CONFLICT DO NOTHING` checks against the
newest committed rows, not the statement's snapshot, and waits for a concurrent transaction that
inserted the same key: if that one commits, this one finds the conflict; if it rolls back (its
effects raised), this insert goes in. So two writers of one id never both apply, and a writer
whose rival rolled back is not refused. The follow-up `SELECT` of the row's token takes a new
snapshot (READ COMMITTED takes one per statement), so it sees the row the insert waited for; at
REPEATABLE READ it would not (and the insert would fail with a serialization error), so the
sink sets READ COMMITTED on its transactions whatever the server's default. Not `DO UPDATE ...
WHERE fence.token < excluded.token`: that lets a newer lease replace an earlier lease's row and
apply the effects a second time. Not `SELECT ... FOR UPDATE` first: it locks nothing while the
row is missing, so two writers both see none and one fails on the unique key.

The rule for handlers: **all PostgreSQL effects of a message go through one `write` call**, on
the cursor it passes, in that transaction (never commit there). A second `write` under the same
lease applies nothing (ALREADY_APPLIED). Redis effects added to `Effects` still apply with DONE.

Fence rows are kept: a row deleted while its message can still be replayed lets that message
apply again (like a DONE record expiring in Redis). `written_at` tells which rows are older than
any replay can reach. Tokens are stored as `bigint`, which holds epochs up to 2**23.

Connections are made in the process that writes (a Spark worker), one per thread and conninfo,
on the first `write`; the sink itself holds only settings, so it travels to executors inside the
handler. Requires psycopg 3 (`pip install 'kspout[sql]'`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from functools import cache
from typing import Any, Protocol

import psycopg
import psycopg.conninfo
from psycopg import sql

from dedup.errors import FencedOut, FenceRowMissing, FenceTableMissing, PostgresUnavailable
from kspout.worker_clients import WorkerClients

FENCE_TABLE = "kspout_fence"


class SinkOutcome(enum.Enum):
    APPLIED = "applied"  # this write committed the message's effects with its fence row
    ALREADY_APPLIED = "already_applied"  # a lease with a token <= this one committed them


def connect(conninfo: str) -> psycopg.Connection[Any]:
    """An autocommit connection to `conninfo`; `PostgresUnavailable` when none can be made."""
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.OperationalError as exc:
        parts = psycopg.conninfo.conninfo_to_dict(conninfo)
        server = f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}"
        server += f"/{parts['dbname']}" if "dbname" in parts else ""
        cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PostgresUnavailable(server, cause) from None


class Leased(Protocol):
    """What a write is fenced by: `dedup.Effects` is one."""

    @property
    def id(self) -> str: ...

    @property
    def token(self) -> int: ...


Apply = Callable[[psycopg.Cursor[Any]], object]  # runs the effects on the sink's cursor


class PostgresSink:
    """Writes a message's effects to PostgreSQL at most once, fenced by the lease's token.

    `namespace` is the dedup bolt's (the topic's `spout_id` unless the bolt was given another):
    tokens are only comparable within one. No I/O in the constructor.
    """

    def __init__(self, conninfo: str, namespace: str, *, table: str = FENCE_TABLE) -> None:
        if not namespace:
            raise ValueError("namespace must be non-empty (the dedup bolt's namespace)")
        self.conninfo = conninfo
        self.namespace = namespace
        self.table = table

    def create_table(self) -> None:
        """Create the fence table if it does not exist; run it once, before the job starts."""
        with connect(self.conninfo) as conn:
            conn.execute(_queries(self.table).create)

    def write(self, lease: Leased, apply: Apply) -> SinkOutcome:
        """Run `apply(cursor)` and record the fence row in one transaction, unless the message's
        effects were committed already; `FencedOut` if a newer lease committed them."""
        conn = _connections.get(self.conninfo)
        with conn.transaction(), conn.cursor() as cur:
            written = self._fence(cur, lease)
            if written is None:
                apply(cur)
                return SinkOutcome.APPLIED
        if written > lease.token:
            raise FencedOut(lease.id, lease.token, written)
        return SinkOutcome.ALREADY_APPLIED

    def _fence(self, cur: psycopg.Cursor[Any], lease: Leased) -> int | None:
        """None if this lease's fence row went in; else the token of the row already there."""
        queries = _queries(self.table)
        try:
            cur.execute(queries.insert, (self.namespace, lease.id, lease.token))
            if cur.fetchone() is not None:
                return None
            cur.execute(queries.select, (self.namespace, lease.id))
            row = cur.fetchone()
        except psycopg.errors.UndefinedTable as exc:
            raise FenceTableMissing(self.table) from exc
        if row is None:
            raise FenceRowMissing(self.table, lease.id)
        return int(row[0])

    def close(self) -> None:
        """Close this thread's connection for this sink's conninfo, if it has one."""
        connection = _connections.pop(self.conninfo)
        if connection is not None:
            connection.close()


class _Queries:
    def __init__(self, table: str) -> None:
        name = sql.Identifier(*table.split("."))
        self.create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " namespace text NOT NULL,"
            " id text NOT NULL,"
            " token bigint NOT NULL,"  # the fencing token of the lease that committed
            " written_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (namespace, id))"
        ).format(name)
        self.insert = sql.SQL(
            "INSERT INTO {} (namespace, id, token) VALUES (%s, %s, %s)"
            " ON CONFLICT (namespace, id) DO NOTHING RETURNING token"
        ).format(name)
        self.select = sql.SQL("SELECT token FROM {} WHERE namespace = %s AND id = %s").format(name)


@cache
def _queries(table: str) -> _Queries:
    return _Queries(table)


def _connect(conninfo: str) -> psycopg.Connection[Any]:
    # autocommit: each `transaction()` block is the only transaction, with its own BEGIN
    conn = connect(conninfo)
    conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    return conn


# This thread's open connection to a conninfo (a new one if the last one broke).
_connections = WorkerClients(_connect, usable=lambda conn: not conn.closed, per_thread=True)

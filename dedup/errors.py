"""Every error the dedup package raises, under one root, grouped by the caller's next move.

* `RetryLater`: nothing is wrong with the setup or the data; the same work may succeed when it
  is offered again (a replay, the query's next batch, a server back up).
* `FixSetup`: the caller's code, the configuration, the server or a producer must change; the
  same call fails the same way until then.
* `GiveUp`: a newer lease already holds the work (fenced out), or state the guarantees rest on
  is broken; never retried: the work is another's, or an operator repairs the state first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kspout.errors import RetryLater as KspoutRetryLater

if TYPE_CHECKING:
    from dedup.records import SettleResult

Position = tuple[str, int, int]  # a row's (topic, partition, offset)


class DedupError(Exception):
    """Root of every error raised by the dedup package."""


class RetryLater(DedupError):
    """The work was not done, for a reason that may pass: offer it again later."""


class FixSetup(DedupError):
    """The code, configuration, server or producer must change before this can succeed."""


class GiveUp(DedupError):
    """Never retried: a newer lease holds the work, or the dedup state needs an operator."""


# -- retry later -----------------------------------------------------------------------------------


class NotDurable(RetryLater):
    """Fewer replicas (or append-only files) than asked acknowledged a settlement within the
    timeout. Its writes are on the primary but may be lost in a failover, so the caller must
    not ack its messages: offering them again is safe (a DONE record that survives makes the
    replay a DUPLICATE; one that was lost lets it run again). `results` are the settle's
    per-item results as the primary saw them."""

    def __init__(
        self,
        command: str,
        wanted: tuple[int, ...],
        acked: tuple[int, ...],
        results: list[SettleResult],
    ) -> None:
        self.command = command  # WAIT (replicas) or WAITAOF (local fsync, replicas' fsync)
        self.wanted = wanted
        self.acked = acked
        self.results = results
        what = "replicas" if command == "WAIT" else "local fsync, replicas"
        super().__init__(
            f"{command} ({what}): {_counts(acked)} of {_counts(wanted)} acknowledged the "
            "settlement in time, so a failover may lose it; its messages are offered again"
        )


def _counts(counts: tuple[int, ...]) -> str:
    return ", ".join(map(str, counts))


class BatchNotApplied(RetryLater):
    """Some rows of the batch were not applied: the batch must run again (raised out of
    `foreachBatch`, it fails the query's batch; Spark runs it again from the checkpoint)."""


class HandlerFailed(BatchNotApplied):
    """The handler raised on a row: its id is FAILED and runs again with the batch."""

    def __init__(self, id: str, position: Position, error: str, failed: int) -> None:
        self.id = id
        self.position = position  # (topic, partition, offset)
        self.failed = failed  # rows of the call whose handler raised
        super().__init__(
            f"the handler raised on {_where(position)} (id {id!r}): {error}"
            + (f" (and on {failed - 1} more rows)" if failed > 1 else "")
            + "; the batch runs again: those rows run again, the others are duplicates"
        )


class SettlementRefused(BatchNotApplied):
    """Redis did not confirm a row as DONE: another lease took it over, its record vanished,
    or Redis rejected its record or effects (`reason`)."""

    def __init__(self, id: str, position: Position, reason: str) -> None:
        self.id = id
        self.position = position
        self.reason = reason
        super().__init__(
            f"{_where(position)} (id {id!r}) was not settled: {reason}; the batch runs again"
        )


class InFlightElsewhere(BatchNotApplied):
    """A row stayed leased by another live owner for two leases (a clock or lease setting
    is off: a holder that died loses its lease within one): the batch runs again later."""

    def __init__(self, id: str, waited: float) -> None:
        self.id = id
        self.waited = waited
        super().__init__(
            f"id {id!r} stayed in flight elsewhere for {waited:g}s, two [dedup] leases; the "
            "batch runs again"
        )


class PostgresUnavailable(RetryLater, KspoutRetryLater):
    """No connection to PostgreSQL could be made (the server is down or unreachable, or it
    refused the login). Names the server, never the conninfo, which may hold a password."""

    def __init__(self, server: str, cause: str) -> None:
        self.server = server
        self.cause = cause
        super().__init__(
            f"cannot connect to PostgreSQL at {server} ({cause}): check that the server runs and "
            "this host can reach it, and the conninfo given to PostgresSink (host, port, dbname, "
            "user, password)"
        )


# -- fix the setup ---------------------------------------------------------------------------------


class EffectNotAllowed(FixSetup, ValueError):
    """A settle item carries an effect outside the allowlist or with malformed arguments: fix the
    caller; nothing was sent to Redis."""

    def __init__(self, id: str, effect: object, reason: str) -> None:
        self.id = id
        self.effect = effect
        self.reason = reason
        super().__init__(f"message {id!r}: effect {effect!r} is not allowed: {reason}")


class WaitAofUnsupported(FixSetup):
    """`wait_aof` is on but the Redis server has no WAITAOF (it came with Redis 7.2): upgrade
    the server, or set `[dedup] wait_aof = false` to wait for replicas only (WAIT)."""

    def __init__(self, server: str) -> None:
        self.server = server
        super().__init__(
            f"[dedup] wait_aof needs WAITAOF (Redis >= 7.2); the server runs Redis {server}: "
            "upgrade it, or set wait_aof = false"
        )


class MissingMessageId(FixSetup):
    """A row has no message id per `[dedup] id_source`: fix the producer, or key by offset."""

    def __init__(self, position: Position, why: str) -> None:
        self.position = position
        self.why = why
        super().__init__(
            f"{_where(position)}: {why}; such a message can never be applied: fix its producer, "
            'or key the batch by offset (ExactlyOnce(..., key="offset"))'
        )


class FenceTableMissing(FixSetup):
    """The fence table does not exist: call `PostgresSink.create_table()` once, before the job."""

    def __init__(self, table: str) -> None:
        self.table = table
        super().__init__(
            f"the fence table {table!r} does not exist; create it once before the job runs with "
            "PostgresSink(...).create_table()"
        )


# -- give up ---------------------------------------------------------------------------------------


class EpochConflict(GiveUp):
    """The fencing epochs in Redis and in the epoch source disagree in a way that could repeat a
    token: never retried. Either the source lost data or two stores share a namespace with
    different epoch sources; move the source's epoch to at least `fence_epoch` and restart."""

    def __init__(self, namespace: str, fence_epoch: int, source_epoch: int, detail: str) -> None:
        self.namespace = namespace
        self.fence_epoch = fence_epoch
        self.source_epoch = source_epoch
        super().__init__(
            f"namespace {namespace!r}: Redis fence is at epoch {fence_epoch}, the epoch source "
            f"at {source_epoch}: {detail}"
        )


class EpochCorrupt(GiveUp):
    """The epoch znode holds something other than a non-negative integer: never retried; an
    operator must repair `path` (set it to an integer at least as high as any epoch in use)."""

    def __init__(self, path: str, data: bytes) -> None:
        self.path = path
        self.data = data
        super().__init__(f"epoch znode {path} holds {data!r}, not a non-negative integer")


class FencedOut(GiveUp):
    """A newer lease of the message already committed its effects: this writer is a zombie and
    wrote nothing. Let it propagate out of the handler (the newer owner settles the message);
    never retry the write."""

    def __init__(self, id: str, token: int, fence_token: int) -> None:
        self.id = id
        self.token = token
        self.fence_token = fence_token
        super().__init__(
            f"message {id!r}: the lease with token {token} is fenced out: token {fence_token} "
            "already committed its effects (this lease ran out while it ran)"
        )


class FenceRowMissing(GiveUp):
    """The fence row that made this insert conflict was gone a statement later: something
    deletes rows of the fence table while their messages can still be replayed."""

    def __init__(self, table: str, id: str) -> None:
        self.table = table
        self.id = id
        super().__init__(
            f"the fence row of message {id!r} in {table!r} vanished during a write: delete fence "
            "rows only once no replay can reach their messages"
        )


def _where(position: Position) -> str:
    topic, partition, offset = position
    return f"{topic}[{partition}]@{offset}"

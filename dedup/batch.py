"""Exactly-once effects from a Structured Streaming query's `foreachBatch`.

A query over `spark.readStream.format("kspout")` is at least once: a batch that fails, or whose
query dies before Spark's commit log records it, runs again from the checkpoint. Its effects
become exactly-once when each row's effects apply at most once, keyed by something that stays
the same on every replay:

* `key="id"`: the message id, per the topic file's `[dedup] id_source` (`dedup.ids`), so a
  replay, and a message produced twice, applies once (within `[dedup] ttl`);
* `key="offset"`: the Kafka record, `(topic, partition, offset)`, for messages without an id:
  a replay applies once; a message produced twice applies twice.

    from dedup.batch import ExactlyOnce

    def apply(row, effects):        # row: a Row of the batch; effects: dedup.Effects
        effects.hincrby("revenue", row.country, row.cents)

    df.writeStream.foreachBatch(ExactlyOnce(apply, config)).option("checkpointLocation", ...)

The rows stay on the executors: per Spark partition, `ROWS_PER_CALL` rows at a time, their ids are
leased in one Redis round trip, `apply` runs on the leased ones, and they settle in one more,
the Redis effects atomically with DONE (effects in PostgreSQL: `dedup.postgres.PostgresSink`,
given `effects`). A row whose id is DONE is skipped (a duplicate). A row leased elsewhere (a
task of an earlier attempt of the batch, still running) is waited for: it ends DONE, or its
lease runs out and it is leased here. The batch fails, and Spark runs it again, when `apply`
raised (`HandlerFailed`: that row runs again, the others are duplicates), when a settlement
was not confirmed (`SettlementRefused`), and when a row has no id (`MissingMessageId`).

The records live in the namespace `IdempotencyBolt` uses (the topic file's `spout_id` unless
given), so a topic moved from `KafkaSpout.run` with the dedup bolt to a streaming query keeps
its dedup window for `key="id"`. Offset ids have their own form, `~kafka:<topic>/<partition>/
<offset>`, which no message id takes (`dedup.ids`: a text starting with `~` gets a second one,
other kinds start with `~x`, or `~` and a digit or `-`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Literal

from dedup.bolt import Effects, worker_store
from dedup.errors import (
    HandlerFailed,
    InFlightElsewhere,
    MissingMessageId,
    Position,
    SettlementRefused,
)
from dedup.ids import id_reader
from dedup.records import Lease, LeaseStatus, Settlement, SettleStatus
from dedup.store import IdempotencyStore
from kspout.config import TopicConfig
from kspout.kafka import Record
from kspout.outcomes import describe_error

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

log = logging.getLogger(__name__)

Key = Literal["id", "offset"]
RowHandler = Callable[["Row", Effects], object]

ROWS_PER_CALL = 1000  # rows per lease and per settlement: two Redis round trips per 1,000 rows
POLL = 0.5  # seconds between two leases of rows held by a live lease elsewhere
POSITION = ("topic", "partition", "offset")  # columns every row needs (ids, errors)
ID_COLUMN = {"key": "key", "header": "headers", "json": "value"}  # by `[dedup] id_source` kind


# -- applying rows -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Applied:
    """What one call applied: rows run now, and rows found DONE already."""

    applied: int = 0
    duplicates: int = 0

    def __add__(self, other: Applied) -> Applied:
        return Applied(self.applied + other.applied, self.duplicates + other.duplicates)


def offset_id(topic: str, partition: int, offset: int) -> str:
    """The id of a Kafka record for `key="offset"`; no message id takes this form."""
    return f"~kafka:{topic}/{partition}/{offset}"


def _row_ids(key: Key, source: str, columns: frozenset[str]) -> Callable[[Row], str]:
    """A function giving a row's id: its record's, or its message id per `source`."""
    if key == "offset":
        return lambda row: offset_id(*_position(row))
    read = id_reader(source)

    def message_id(row: Row) -> str:
        position = _position(row)
        headers = row["headers"] if "headers" in columns else None
        record = Record(
            *position,
            row["key"] if "key" in columns else None,
            row["value"] if "value" in columns else None,
            -1,  # not needed for an id
            tuple((h["key"], h["value"]) for h in headers or ()),
        )
        id_, why = read(record)
        if id_ is None:
            raise MissingMessageId(position, why)
        return id_

    return message_id


def apply_rows(
    rows: Iterable[Row],
    handler: RowHandler,
    config: TopicConfig,
    *,
    key: Key = "id",
    columns: Iterable[str] = (*POSITION, "key", "value", "headers"),
    namespace: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Applied:
    """Run `handler(row, effects)` at most once to completion per row's id, for rows of a
    batch (in an executor, or collected on the driver). `columns` are the rows' columns."""
    id_of = _row_ids(key, config.dedup.id_source, frozenset(columns))
    store = worker_store(config, namespace or config.spout_id)
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    patience = 2 * config.dedup.lease  # a holder that died loses its lease within one
    total = Applied()
    it = iter(rows)
    while part := list(islice(it, ROWS_PER_CALL)):
        ids = [id_of(row) for row in part]
        partitions = [row["partition"] for row in part]
        leased = _lease(store, ids, partitions, owner, patience, sleep, clock)
        total += _run(store, part, leased, handler)
    return total


def _lease(
    store: IdempotencyStore,
    ids: list[str],
    partitions: list[int],
    owner: str,
    patience: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> list[tuple[str, Lease | None]]:
    """Each id with its lease, None for a repeat of an id earlier in `ids` with the same record
    (a duplicate); leases held by a live owner elsewhere are waited for, at most `patience`
    seconds."""
    # a record is (shard tag, id): on one server every partition shares the namespace's shard
    records = [((store.tag(p), id_), id_, p) for id_, p in zip(ids, partitions, strict=True)]
    firsts: dict[tuple[str, str], tuple[tuple[str, str], str, int]] = {}
    for record in records:  # one lease per record: a repeat in one call defers itself
        firsts.setdefault(record[0], record)
    leases = dict(zip(firsts, _lease_each(store, list(firsts.values()), owner), strict=True))
    deadline = clock() + patience
    while waiting := [k for k, c in leases.items() if c.status is LeaseStatus.DEFERRED]:
        if clock() >= deadline:
            raise InFlightElsewhere(firsts[waiting[0]][1], patience)
        sleep(min(POLL, max(leases[k].retry_after_ms for k in waiting) / 1000))
        again = _lease_each(store, [firsts[k] for k in waiting], owner)
        leases.update(zip(waiting, again, strict=True))
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, Lease | None]] = []
    for key, id_, _ in records:
        out.append((id_, None if key in seen else leases[key]))
        seen.add(key)
    return out


def _lease_each(
    store: IdempotencyStore, records: Sequence[tuple[tuple[str, str], str, int]], owner: str
) -> list[Lease]:
    """The leases of `(record, id, partition)` records, in order."""
    return store.lease([r[1] for r in records], owner, [r[2] for r in records])


def _run(
    store: IdempotencyStore,
    rows: Sequence[Row],
    leased: Sequence[tuple[str, Lease | None]],
    handler: RowHandler,
) -> Applied:
    """Run the handler on the leased rows, settle them in one call, raise if any failed."""
    settlements: list[Settlement] = []
    ran: list[Row] = []
    failures: list[tuple[Row, str, str]] = []
    refused: list[tuple[Row, str, str]] = []
    duplicates = 0
    for row, (id_, lease) in zip(rows, leased, strict=True):
        if lease is None or lease.status is LeaseStatus.DUPLICATE:
            duplicates += 1
            continue
        if lease.status is LeaseStatus.REJECTED:
            refused.append((row, id_, f"Redis rejected the lease: {lease.error}"))
            continue
        token, attempts = lease.token, lease.attempts
        effects = Effects(store, id_, token, attempts, row["partition"])
        try:
            handler(row, effects)
        except Exception as exc:
            failures.append((row, id_, describe_error(exc)))
            settlements.append(Settlement(id_, token, False, describe_error(exc), (), attempts))
        else:
            settlements.append(Settlement(id_, token, True, None, effects.commands, attempts))
        ran.append(row)
    applied = 0
    results = store.settle(settlements, [row["partition"] for row in ran])
    for row, item, (status, error) in zip(ran, settlements, results, strict=True):
        if status is SettleStatus.SETTLED:
            applied += item.done
        elif status is SettleStatus.STALE:
            refused.append((row, item.id, "another lease holds it now (this one ran out)"))
        elif status is SettleStatus.LOST:
            refused.append((row, item.id, "its record vanished from Redis"))
        else:
            refused.append((row, item.id, f"Redis rejected the settlement: {error}"))
    if failures:
        row, id_, error = failures[0]
        raise HandlerFailed(id_, _position(row), error, len(failures))
    if refused:
        row, id_, reason = refused[0]
        raise SettlementRefused(id_, _position(row), reason)
    return Applied(applied, duplicates)


def _position(row: Row) -> Position:
    return row["topic"], row["partition"], row["offset"]


# -- foreachBatch ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Spec:
    """What a batch's tasks need, shipped to executors with each job."""

    handler: RowHandler
    config: TopicConfig
    key: Key
    namespace: str
    columns: tuple[str, ...]


def _apply_partition(spec: _Spec, rows: Iterable[Row]) -> Iterator[Applied]:
    yield apply_rows(
        rows,
        spec.handler,
        spec.config,
        key=spec.key,
        columns=spec.columns,
        namespace=spec.namespace,
    )


class ExactlyOnce:
    """A `foreachBatch` function that runs `handler(row, effects)` at most once per row's id.

    `applied` and `duplicates` count the rows of every batch so far (on the driver).
    """

    def __init__(
        self,
        handler: RowHandler,
        config: TopicConfig,
        *,
        key: Key = "id",
        namespace: str | None = None,
    ) -> None:
        if key not in ("id", "offset"):
            raise ValueError(f'key must be "id" or "offset", got {key!r}')
        self.handler = handler
        self.config = config
        self.key: Key = key
        self.namespace = namespace or config.spout_id
        self.applied = 0
        self.duplicates = 0

    def needs(self) -> list[str]:
        """The columns a batch must keep: the record's position, and for `key="id"` the one
        the id comes from."""
        kind = self.config.dedup.id_source.partition(":")[0]
        return [*POSITION, *([ID_COLUMN[kind]] if self.key == "id" else [])]

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Apply one batch's rows on the executors; raises when some were not applied."""
        missing = [c for c in self.needs() if c not in df.columns]
        if missing:
            raise ValueError(
                f"the batch has no column {', '.join(missing)}: keep the stream's "
                f"{', '.join(self.needs())} columns for ExactlyOnce(key={self.key!r})"
            )
        spec = _Spec(self.handler, self.config, self.key, self.namespace, tuple(df.columns))
        done = sum(df.rdd.mapPartitions(partial(_apply_partition, spec)).collect(), Applied())
        self.applied += done.applied
        self.duplicates += done.duplicates
        log.info(
            "batch %d: %d rows applied, %d duplicates skipped",
            batch_id,
            done.applied,
            done.duplicates,
        )

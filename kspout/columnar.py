"""Columnar bolts: a bolt that takes a task's whole input as Arrow columns and answers in columns.

A `ColumnarBolt`'s `process_batch(batch, out)` gets its task's input as one
`pyarrow.RecordBatch`. In the chain's first stage the columns are the records' (`RECORD_COLUMNS`:
partition, offset, key, value, timestamp; a row's root is its own `(partition, offset)`);
further down they are the fields the bolt before the grouping declared in `outputs`. The bolt
answers through `out` (`ColumnarOutput`):

* `out.fail(rows, reason)`: these input rows failed (indices or a boolean mask; one reason,
  or one per row): their roots fail with EXCEPTION, retried within their budget, then
  dead-lettered, as a row bolt's `collector.fail`;
* `out.emit(anchor_rows, columns)`: new rows with the bolt's `outputs` as columns, the i-th
  anchored to input row `anchor_rows[i]` (a `BasicBolt`'s emit, for a whole batch at once);
* every input row not failed is **acked** when `process_batch` returns, emitted from or not:
  a `BasicBolt` acks its input when `process` returns, and the call is the bolt's one word on
  its batch, so a row it neither acked nor failed could only wait for its timeout;
* an exception from `process_batch` fails every row of the batch with EXCEPTION (it cannot
  say which row was at fault): per-row faults belong in `out.fail`.

The ledger gets what a `BasicBolt` would give it row by row (`settle_batch`, folded per root
with numpy): each emitted row a random 64-bit id XORed into its root's ack value, each acked
input row its own id (a first stage's records have none: a root's id would be registered and
acked within the same call). So XOR acking per root, retries, timeouts and dead letters hold
unchanged, and a chain may mix row
and columnar stages: a `ColumnarBolt` is a stage of its own (a grouping before it unless it is
first, one after it unless it is last). Between stages its rows travel as an `ArrowChunk` (the
columns, each row's anchor and id); `Fields` routes it by hashing a column's values exactly as
it hashes a tuple's, so a row and a columnar chain send every key to the same task.

A message's timeout needs the task to say which row it is on: a bolt that works row by row
somewhere (a call out per row) names the row with `out.working_on(row)`, so a row that hangs
times out alone; while no row is named the task counts as busy outside any record.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from kspout.acker import Acker, Ids, Ints, Mark, Note, new_tuple_id, xor_runs
from kspout.bolts import (
    ROOT_FIELDS,
    Anchor,
    Bolt,
    Chunk,
    Collector,
    RootKey,
    TaskContext,
    Tuple,
    make_tuple,
)
from kspout.channel.beacon import thread_beacon
from kspout.errors import KafkaRefused
from kspout.kafka import Record
from kspout.kafka.records import RecordColumns
from kspout.outcomes import FailureCatalog

# The first stage's columns: each record's, as `Record` names them, with their Arrow types.
RECORD_COLUMNS = (
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("timestamp", pa.int64()),
)
NO_ROOT = -1  # `ArrowChunk.partitions` of a row without exactly one root (see `several`)
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


@dataclass(slots=True)
class ArrowChunk:
    """Tuples between two bolts as columns: `batch` holds one Arrow column per field; each
    row's root is `(partitions[i], offsets[i])` and its id in that root's tree `ids[i]`.

    A row descending from several roots (a row bolt upstream anchored a tuple to several
    inputs) has partition `NO_ROOT` and its roots with their ids in `several`; one from none
    (an unanchored tuple) has partition `NO_ROOT` alone. Read as a sequence it gives `Tuple`s
    (for a row bolt after a columnar one), through its rows.
    """

    batch: pa.RecordBatch
    partitions: Ints
    offsets: Ints
    ids: Ids
    several: dict[int, dict[RootKey, int]] = field(default_factory=dict)
    _rows: Chunk | None = field(default=None, repr=False)

    @classmethod
    def empty(cls, fields: Sequence[str]) -> ArrowChunk:
        """No rows, with `fields` as (untyped) columns."""
        batch = pa.RecordBatch.from_arrays([pa.nulls(0) for _ in fields], names=list(fields))
        none = np.zeros(0, np.int64)
        return cls(batch, none, none, np.zeros(0, np.uint64))

    @classmethod
    def of_records(cls, records: Sequence[Record]) -> ArrowChunk:
        """Fetched records as a columnar first stage's input: `RECORD_COLUMNS`, each row its
        own root. Their ids are 0: a root tuple's id would reach the ledger twice in the same
        call (registered, then acked, unless failed: and a failed root's value no longer
        matters), so a columnar first stage draws none."""
        batch = _record_batch(records)
        partitions = batch.column(0).to_numpy().astype(np.int64)
        offsets = batch.column(1).to_numpy()
        return cls(batch, partitions, offsets, np.zeros(len(records), np.uint64))

    @classmethod
    def of_columns(cls, columns: RecordColumns) -> ArrowChunk:
        """`of_records`, from the columns `PartitionFetcher.fetch_columns` read."""
        size = len(columns.offsets)
        offsets = np.array(columns.offsets, np.int64)
        arrays = [
            pa.array(np.full(size, columns.partition, np.int32)),
            pa.array(offsets),
            pa.array(columns.keys, pa.binary()),
            pa.array(columns.values, pa.binary()),
            pa.array(columns.timestamps, pa.int64()),
        ]
        batch = pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in RECORD_COLUMNS])
        partitions = np.full(size, columns.partition, np.int64)
        return cls(batch, partitions, offsets, np.zeros(size, np.uint64))

    @classmethod
    def of(cls, chunk: Chunk | ArrowChunk) -> ArrowChunk:
        """`chunk` in columns: the records' `RECORD_COLUMNS` for root tuples, else a column
        per field with the type Arrow infers from its values."""
        if isinstance(chunk, ArrowChunk):
            return chunk
        rows = chunk.rows
        values = list(map(_FIRST, rows))
        ids = np.fromiter(map(_THIRD, rows), np.uint64, len(rows))
        if chunk.fields == ROOT_FIELDS:  # a root tuple's root is its record's place
            batch = _record_batch(list(map(_FIRST, values)))
            partitions = batch.column(0).to_numpy().astype(np.int64)
            return cls(batch, partitions, batch.column(1).to_numpy(), ids, {}, chunk)
        names = list(chunk.fields)
        arrays = [_column(name, [v[i] for v in values]) for i, name in enumerate(names)]
        batch = pa.RecordBatch.from_arrays(arrays, names=names)
        anchors = list(map(_SECOND, rows))
        if all(type(anchor) is tuple for anchor in anchors):
            partitions = np.fromiter(map(_FIRST, anchors), np.int64, len(rows))
            offsets = np.fromiter(map(_SECOND, anchors), np.int64, len(rows))
            return cls(batch, partitions, offsets, ids, {}, chunk)
        partitions = np.full(len(rows), NO_ROOT, np.int64)
        offsets = np.zeros(len(rows), np.int64)
        several: dict[int, dict[RootKey, int]] = {}
        for row, anchor in enumerate(anchors):
            if type(anchor) is tuple:
                partitions[row], offsets[row] = anchor
            elif isinstance(anchor, dict):
                several[row] = anchor
        return cls(batch, partitions, offsets, ids, several, chunk)

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(self.batch.schema.names)

    def anchor(self, row: int) -> Anchor:
        """Row `row`'s anchor, as a `Chunk` row holds it."""
        partition = int(self.partitions[row])
        if partition != NO_ROOT:
            return (partition, int(self.offsets[row]))
        return self.several.get(row)

    def tuple_at(self, row: int) -> Tuple:
        """Row `row` as a `Tuple` with its roots (its values are not needed: no values)."""
        return make_tuple((), (), self.anchor(row), int(self.ids[row]))

    def rows(self) -> Chunk:
        """The same tuples as a row `Chunk` (made once)."""
        if self._rows is None:
            size = len(self)
            columns = [column.to_pylist() for column in self.batch.columns]
            values = list(zip(*columns, strict=True)) if columns else [()] * size
            if self.several or (self.partitions == NO_ROOT).any():
                anchors = [self.anchor(row) for row in range(size)]
            else:
                anchors = list(zip(self.partitions.tolist(), self.offsets.tolist(), strict=True))
            rows = zip(values, anchors, self.ids.tolist(), strict=True)
            self._rows = Chunk(self.fields, list(rows))
        return self._rows

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[Tuple]:
        return iter(self.rows())

    def take(self, indices: Ints) -> ArrowChunk:
        """The rows at `indices`, in that order."""
        several = {}
        if self.several:
            for new, old in enumerate(indices.tolist()):
                if old in self.several:
                    several[new] = self.several[old]
        return ArrowChunk(
            self.batch.take(pa.array(indices)),
            self.partitions[indices],
            self.offsets[indices],
            self.ids[indices],
            several,
        )

    def split(self, targets: Ints, tasks: int) -> list[ArrowChunk]:
        """One chunk per task, row `i` going to task `targets[i]`, rows kept in order."""
        order = np.argsort(targets, kind="stable")
        ends = np.cumsum(np.bincount(targets, minlength=tasks)).tolist()
        starts = [0, *ends[:-1]]
        return [self.take(order[start:end]) for start, end in zip(starts, ends, strict=True)]

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled without its rows (the columns say it all)."""
        return (ArrowChunk, (self.batch, self.partitions, self.offsets, self.ids, self.several))


def join_chunks(fields: tuple[str, ...], parts: Sequence[Chunk | ArrowChunk]) -> Chunk | ArrowChunk:
    """The chunks routed to one task as one: columns when every non-empty part is columnar."""
    full = [part for part in parts if len(part)]
    arrow = [part for part in full if isinstance(part, ArrowChunk)]
    if full and len(arrow) == len(full):
        if len(arrow) == 1:
            return arrow[0]
        several: dict[int, dict[RootKey, int]] = {}
        start = 0
        for part in arrow:
            several.update((start + row, roots) for row, roots in part.several.items())
            start += len(part)
        return ArrowChunk(
            pa.concat_batches([part.batch for part in arrow]),
            np.concatenate([part.partitions for part in arrow]),
            np.concatenate([part.offsets for part in arrow]),
            np.concatenate([part.ids for part in arrow]),
            several,
        )
    joined = Chunk(fields)
    for piece in full:
        rows = piece.rows() if isinstance(piece, ArrowChunk) else piece
        joined.rows.extend(rows.rows)
    return joined


def _record_batch(records: Sequence[Record]) -> pa.RecordBatch:
    """Records as `RECORD_COLUMNS`."""
    arrays = [pa.array(list(map(attrgetter(n), records)), t) for n, t in RECORD_COLUMNS]
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in RECORD_COLUMNS])


def _column(name: str, values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TypeError(
            f"field {name!r} holds values Arrow cannot put in one column ({exc}): emit values "
            "of one type per field before a ColumnarBolt"
        ) from exc


def _ints(values: Sequence[int] | pa.Array | Ints) -> Ints:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        values = values.to_numpy(zero_copy_only=False)
    return np.asarray(values, np.int64)


class ColumnarOutput:
    """What a `ColumnarBolt` answers for its batch: failed rows, emitted rows (see the module
    docstring); the rows it does not fail are acked."""

    __slots__ = ("_anchor_rows", "_batches", "_fields", "_input", "_size", "failed")

    def __init__(self, fields: tuple[str, ...], input_: ArrowChunk) -> None:
        self._fields = fields
        self._input = input_
        self._size = len(input_)
        self.failed: dict[int, Note] = {}  # input row -> its reason (the first one given)
        self._anchor_rows: list[Ints] = []
        self._batches: list[pa.RecordBatch] = []

    def fail(
        self,
        rows: Sequence[int] | pa.Array | Ints,
        reason: str | Sequence[str] | pa.Array | BaseException = "failed by the bolt",
    ) -> None:
        """Fail input `rows` (indices, or a boolean mask as long as the batch) with `reason`
        (one for all, or one per row; an exception: its type, text and place)."""
        indices = self._indices(rows)
        reasons: Iterator[Note]
        if isinstance(reason, BaseException):
            reasons = repeat(FailureCatalog().of(reason))
        elif isinstance(reason, str):
            reasons = repeat(reason)
        elif isinstance(reason, pa.Array | pa.ChunkedArray):
            reasons = iter(reason.to_pylist())
        else:
            reasons = iter(reason)
        failed = self.failed
        for row, why in zip(indices.tolist(), reasons, strict=False):
            failed.setdefault(row, why)

    def emit(
        self,
        anchor_rows: Sequence[int] | pa.Array | Ints,
        columns: pa.RecordBatch | Mapping[str, Any],
    ) -> None:
        """Emit one row per entry of `anchor_rows`, anchored to that input row, with the
        bolt's `outputs` as columns (a RecordBatch, or a mapping of name -> values)."""
        batch = columns if isinstance(columns, pa.RecordBatch) else _batch_of(columns)
        if tuple(batch.schema.names) != self._fields:
            raise ValueError(
                f"emitted columns {tuple(batch.schema.names)}, but the bolt's outputs are "
                f"{self._fields}: emit exactly those columns, in that order"
            )
        anchors = _ints(anchor_rows)
        if len(anchors) != batch.num_rows:
            raise ValueError(f"{len(anchors)} anchor rows for {batch.num_rows} emitted rows")
        if len(anchors) and (anchors.min() < 0 or anchors.max() >= self._size):
            raise IndexError(f"an anchor row is outside the batch's {self._size} rows")
        self._anchor_rows.append(anchors)
        self._batches.append(batch)

    def working_on(self, row: int | None) -> None:
        """Tell the driver which input row the bolt is busy with now (None: no one row), so
        that a row that hangs times out alone (see the module docstring)."""
        thread_beacon().current = None if row is None else self._input.tuple_at(row)

    def _indices(self, rows: Sequence[int] | pa.Array | Ints) -> Ints:
        if isinstance(rows, pa.ChunkedArray):
            rows = rows.combine_chunks()
        if isinstance(rows, pa.Array) and pa.types.is_boolean(rows.type):
            rows = rows.fill_null(False).to_numpy(zero_copy_only=False)
        array = np.asarray(rows)
        if array.dtype == np.bool_:
            if len(array) != self._size:
                raise ValueError(f"a mask of {len(array)} rows for a batch of {self._size}")
            return np.flatnonzero(array)
        indices = array.astype(np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self._size):
            raise IndexError(f"a failed row is outside the batch's {self._size} rows")
        return indices

    def emitted(self) -> tuple[Ints, pa.RecordBatch]:
        """Every emitted row's anchor row, and the emitted columns."""
        if not self._batches:
            return np.zeros(0, np.int64), ArrowChunk.empty(self._fields).batch
        anchors = np.concatenate(self._anchor_rows)
        batches = self._batches
        return anchors, batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _batch_of(columns: Mapping[str, Any]) -> pa.RecordBatch:
    arrays = [
        c if isinstance(c, pa.Array | pa.ChunkedArray) else pa.array(c) for c in columns.values()
    ]
    arrays = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


class ColumnarBolt(Bolt):
    """A bolt that handles its task's whole input at once, as Arrow columns (module docstring).

    `outputs` names the emitted columns; `prepare`, `cleanup` and `start` are a `Bolt`'s.
    """

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        """Handle every row of `batch`: fail rows and emit rows through `out`."""
        raise NotImplementedError

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        raise TypeError(
            f"{type(self).__name__} is a ColumnarBolt: it runs on whole batches "
            "(process_batch), as a stage of its own"
        )


def new_ids(count: int) -> Ids:
    """`count` random non-zero 64-bit tuple ids (`new_tuple_id`'s, made at once), from a
    generator seeded by the OS: forked Python workers never share a sequence."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    return rng.integers(1, np.iinfo(np.uint64).max, count, np.uint64, endpoint=True)


def settle_batch(
    acker: Acker[RootKey], input_: ArrowChunk, out: ColumnarOutput, *, emits: bool
) -> ArrowChunk:
    """Fold a columnar bolt's answer into `acker` as a `BasicBolt` would, row by row: each
    emitted row's new id into its root's value (unless its emits go nowhere, `emits` False),
    each input row's own id unless it failed; failed rows mark their roots FAILED. Returns
    the emitted rows, each anchored to its input row's root."""
    anchor_rows, batch = out.emitted()
    if not emits:
        anchor_rows, batch = anchor_rows[:0], ArrowChunk.empty(batch.schema.names).batch
    edges = new_ids(len(anchor_rows))
    values = input_.ids.copy()  # each input row's share of its root's value: its own id ...
    values[np.fromiter(out.failed, np.int64, len(out.failed))] = 0  # ... unless it failed
    np.bitwise_xor.at(values, anchor_rows, edges)  # ... and the ids of the rows it emitted
    partitions, offsets = input_.partitions, input_.offsets
    single = partitions != NO_ROOT
    if not single.all():
        _ack_several(acker, input_, out.failed)
        values, partitions, offsets = values[single], partitions[single], offsets[single]
    _fold(acker, partitions, offsets, values)
    for row, reason in out.failed.items():
        tuple_ = input_.tuple_at(row)
        for root in tuple_.roots:
            acker.mark(root, Mark.FAILED, reason)
    several: dict[int, dict[RootKey, int]] = {}
    if input_.several:
        for row, anchor in enumerate(anchor_rows.tolist()):
            if anchor in input_.several:
                several[row] = {root: new_tuple_id() for root in input_.several[anchor]}
                for root, id_ in several[row].items():
                    acker.xor(root, id_)
    partitions, offsets = input_.partitions[anchor_rows], input_.offsets[anchor_rows]
    return ArrowChunk(batch, partitions, offsets, edges, several)


def _fold(acker: Acker[RootKey], partitions: Ints, offsets: Ints, values: Ids) -> None:
    """XOR each row's value into its root's ack value: folded per root in numpy, handed to
    `acker` as columns."""
    if not len(values):
        return
    step, advance = np.diff(partitions), np.diff(offsets)
    if not ((step > 0) | ((step == 0) & (advance >= 0))).all():  # not in root order yet
        order = _root_order(partitions, offsets)  # group each root's rows together
        partitions, offsets, values = partitions[order], offsets[order], values[order]
    changed = (partitions[1:] != partitions[:-1]) | (offsets[1:] != offsets[:-1])
    starts, folded = xor_runs(changed, values)
    acker.xor_columns(partitions[starts], offsets[starts], folded)


def _root_order(partitions: Ints, offsets: Ints) -> Ints:
    """The order that sorts rows by root: one sort of a combined key when partitions and
    offsets fit in it (they do but for offsets past 2^47), else a sort by both."""
    if partitions.max() < 1 << 15 and offsets.max() < 1 << 47:
        return np.argsort((partitions << 48) | offsets)
    return np.lexsort((offsets, partitions))


def _ack_several(acker: Acker[RootKey], input_: ArrowChunk, failed: Mapping[int, Note]) -> None:
    """Ack the input rows with several roots (or none) that did not fail, as `Collector.ack`
    does (their emitted rows get their roots' ids in `settle_batch`)."""
    collector = Collector(acker, (), None)
    for row in np.flatnonzero(input_.partitions == NO_ROOT).tolist():
        if row not in failed:
            collector.ack(input_.tuple_at(row))


class ColumnarRunner:
    """Runs a stage made of one `ColumnarBolt` over a task's input (a `StageRunner`'s twin:
    `run`, `chunk`, `close`)."""

    def __init__(
        self, bolt: ColumnarBolt, acker: Acker[RootKey], context: TaskContext, *, last: bool
    ) -> None:
        self._bolt = bolt
        self._acker = acker
        self._last = last
        self.chunk: Chunk | ArrowChunk = ArrowChunk.empty(bolt.outputs)
        bolt.prepare(context)

    def run(self, tuples: Chunk | ArrowChunk) -> None:
        """Hand the bolt the whole input; fold its answer into the ledger."""
        input_ = ArrowChunk.of(tuples)
        out = ColumnarOutput(self._bolt.outputs, input_)
        try:
            self._bolt.process_batch(input_.batch, out)
        except KafkaRefused:
            raise  # as a row bolt's: not the rows' fault, no retry cures it; the run stops
        except Exception as exc:
            out.fail(np.arange(len(input_)), exc)
        finally:
            thread_beacon().current = None
        self.chunk = settle_batch(self._acker, input_, out, emits=not self._last)

    def close(self) -> None:
        self._bolt.cleanup()

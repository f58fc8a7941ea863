"""Groupings: which task of the next bolt receives a tuple (on Spark, a repartition).

`Shuffle()` (any task), `Fields(names)` (equal values of those fields go to the same task, so a
counting bolt sees every tuple of its key), `Global()` (one task sees everything). Each routes
a whole `Chunk` at once, or a columnar bolt's `ArrowChunk` by its columns (`Fields` hashes a
column's values as it hashes a tuple's, so both reach the same task); `route` says where one
`Tuple` goes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from kspout.acker import new_tuple_id
from kspout.bolts import Chunk, Tuple
from kspout.columnar import ArrowChunk

Routed = Chunk | ArrowChunk


class Grouping:
    """How tuples are routed to the next bolt's tasks (a Spark repartition)."""

    def route(self, tuple_: Tuple, tasks: int) -> int:
        """The index of the task that receives `tuple_`."""
        raise NotImplementedError

    def split(self, chunk: Routed, tasks: int) -> list[Routed]:
        """`chunk` cut into one chunk per receiving task, as `route` says of each tuple.

        The groupings here override it to route a whole chunk without a `Tuple` per row.
        """
        if isinstance(chunk, ArrowChunk):
            chunk = chunk.rows()
        parts = [Chunk(chunk.fields) for _ in range(tasks)]
        for row, tuple_ in zip(chunk.rows, chunk, strict=True):
            parts[self.route(tuple_, tasks)].rows.append(row)
        return list(parts)  # typed as the wider list


class Shuffle(Grouping):
    """Any task; tuples are spread evenly (round robin from a random start per copy, since
    every upstream task routes with its own copy)."""

    def __init__(self) -> None:
        self._next: int | None = None

    def route(self, tuple_: Tuple, tasks: int) -> int:
        return self._advance(1, tasks)

    def split(self, chunk: Routed, tasks: int) -> list[Routed]:
        first = self._advance(len(chunk), tasks)
        if isinstance(chunk, ArrowChunk):
            size = len(chunk)
            return [chunk.take(np.arange((t - first) % tasks, size, tasks)) for t in range(tasks)]
        rows = chunk.rows
        return [Chunk(chunk.fields, rows[(task - first) % tasks :: tasks]) for task in range(tasks)]

    def _advance(self, count: int, tasks: int) -> int:
        """The task of the first of `count` tuples; the round robin moves past all of them."""
        current = new_tuple_id() if self._next is None else self._next
        self._next = (current + count) % tasks
        return (current + 1) % tasks

    def __repr__(self) -> str:
        return "Shuffle()"


# Exact types whose equal values always hash alike in `stable_hash`, so a route found for
# one value may be reused for an equal one (1 == 1.0 == True, but 1.0 and True are not here).
_REUSABLE = frozenset({str, bytes, int})


class Fields(Grouping):
    """Tuples with equal values in `names` go to the same task."""

    def __init__(self, *names: str) -> None:
        if not names:
            raise ValueError("Fields() needs at least one field name")
        self.names = names

    def route(self, tuple_: Tuple, tasks: int) -> int:
        key = tuple(tuple_[name] for name in self.names)
        return stable_hash(key) % tasks

    def split(self, chunk: Routed, tasks: int) -> list[Routed]:
        if not len(chunk):  # nothing to route (a stage that failed may not know its fields)
            return [Chunk(chunk.fields) for _ in range(tasks)]
        if isinstance(chunk, ArrowChunk):
            return list(chunk.split(self._targets(chunk.batch, tasks), tasks))
        parts = [Chunk(chunk.fields) for _ in range(tasks)]
        buckets = [part.rows for part in parts]
        key = self._key(chunk.fields)
        routes: dict[object, int] = {}  # per split: a value repeats within a task's output
        for row in chunk.rows:
            value = key(row[0])
            if type(value) in _REUSABLE:
                target = routes.get(value)
                if target is None:
                    target = routes[value] = stable_hash((value,)) % tasks
            else:
                target = stable_hash(value if len(self.names) > 1 else (value,)) % tasks
            buckets[target].append(row)
        return list(parts)

    def _targets(self, batch: pa.RecordBatch, tasks: int) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each row's task, from the grouped columns: `stable_hash` once per distinct value
        (of a one-column key) or per row (several columns), as `split` hashes a row's."""
        for name in self.names:
            if name not in batch.schema.names:
                raise KeyError(f"{self!r}: the columns are {tuple(batch.schema.names)}")
        if len(self.names) == 1:
            column = batch.column(self.names[0])
            encoded = pc.dictionary_encode(column, null_encoding="encode")
            hashes = [stable_hash((v,)) % tasks for v in encoded.dictionary.to_pylist()]
            targets: np.ndarray[Any, np.dtype[np.int64]]
            targets = np.asarray(hashes, np.int64)[encoded.indices.to_numpy()]
            return targets
        keys = zip(*(batch.column(name).to_pylist() for name in self.names), strict=True)
        return np.fromiter((stable_hash(key) % tasks for key in keys), np.int64, batch.num_rows)

    def _key(self, fields: tuple[str, ...]) -> Callable[[tuple[Any, ...]], Any]:
        """Picks the grouped values out of a row's values: the value itself for one name,
        a tuple of them for several."""
        try:
            return itemgetter(*(fields.index(name) for name in self.names))
        except ValueError:
            raise KeyError(f"{self!r}: the tuples have fields {fields}") from None

    def __repr__(self) -> str:
        return f"Fields({', '.join(map(repr, self.names))})"


class Global(Grouping):
    """Every tuple goes to the first task."""

    def route(self, tuple_: Tuple, tasks: int) -> int:
        return 0

    def split(self, chunk: Routed, tasks: int) -> list[Routed]:
        return [chunk, *(Chunk(chunk.fields) for _ in range(tasks - 1))]

    def __repr__(self) -> str:
        return "Global()"


def stable_hash(value: object) -> int:
    """A hash equal in every Python worker for values that compare equal.

    `hash()` of a str is salted per process, and `repr` tells apart equal values (1 and 1.0,
    dicts in another order, sets printed in hash order); this hashes a canonical form instead.
    """
    return zlib.crc32(_canonical(value).encode("utf-8", "surrogatepass"))


def _canonical(value: object) -> str:
    if value is None:
        return "N"
    if isinstance(value, bool | int):
        return f"i{int(value)}"
    if isinstance(value, float):
        return f"i{int(value)}" if value.is_integer() else f"f{value!r}"
    if isinstance(value, str):
        return f"s{len(value)}:{value}"
    if isinstance(value, bytes | bytearray):
        return f"y{bytes(value).hex()}"
    if isinstance(value, tuple | list):
        return "(" + ",".join(_canonical(v) for v in value) + ")"
    if isinstance(value, set | frozenset):
        return "{" + ",".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, dict):
        items = sorted(f"{_canonical(k)}={_canonical(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    return f"r{value!r}"

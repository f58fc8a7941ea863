"""Storm's XOR acker: constant-size tracking of a tuple tree (a DAG) per root message.

Every tuple gets a random 64-bit id. A root's ack value is the XOR of every id created under
it and every id acked, so it returns to zero exactly when each tuple in the tree was both
created and acked, whatever the order the two events arrived in. A failed tuple fails its
roots at once. Besides acks, bolts may mark a root (the dedup bolt marks duplicates and
deferrals); marks merge by precedence. The ledger keeps one integer, and at most one mark and
one error, per root however large the tree grows, and two ledgers merge by XOR: partial
ledgers from separate Spark tasks combine in any order.

Timeouts are not tracked here: a root with a non-zero value stays in flight in its
`PartitionManager`, whose `message_timeout` turns it into a TIMEOUT failure. Pure logic, no I/O.
"""

from __future__ import annotations

import enum
import os
import random
from collections.abc import Hashable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any, Generic, TypeVar, cast

import numpy as np

from kspout.errors import KafkaRefused
from kspout.outcomes import Failure

# What a marked root's error is: a bolt's own text, what user code raised, or (a released
# root's) what Kafka refused the principal, which no retry cures: it stops the run.
Note = str | Failure | KafkaRefused

RootKey = TypeVar("RootKey", bound=Hashable)
Ints = np.ndarray[Any, np.dtype[np.int64]]
Ids = np.ndarray[Any, np.dtype[np.uint64]]
RootColumns = tuple[Ints, Ints, Ids]  # partitions, offsets, ack values: a row per root

_rng = random.Random()
# `random_bits(64) or 1` is `new_tuple_id()` without the call, for loops that make an id each.
random_bits = _rng.getrandbits


def reseed() -> None:
    """Seed the tuple-id generator from the OS.

    Spark forks Python workers from one daemon, and forked copies of one generator would hand
    out the same ids; every task reseeds before it creates any.
    """
    _rng.seed(os.urandom(16))


def new_tuple_id() -> int:
    """A random non-zero 64-bit id (zero would leave no trace in an XOR)."""
    return random_bits(64) or 1


def new_tuple_ids(count: int) -> list[int]:
    """`count` ids of `new_tuple_id`, made at once."""
    ids = list(map(random_bits, repeat(64, count)))
    if 0 in ids:
        ids = [id_ or 1 for id_ in ids]
    return ids


class Mark(enum.IntEnum):
    """What a bolt said about a root besides acks; the highest mark wins when ledgers merge."""

    NONE = 0
    DUPLICATE = 1  # the dedup bolt found it done before: complete, counted as a duplicate
    DEFERRED = 2  # the dedup bolt found it in flight elsewhere: retry later, no attempt spent
    RELEASED = 3  # a task under it failed outside per-message code: retry, no attempt spent
    FAILED = 4  # a tuple under it failed (EXCEPTION): the message's own fault wins
    INVALID = 5  # the message cannot be processed at all (no id): dead-letter it, no retry


class RootState(enum.Enum):
    COMPLETE = "complete"  # every tuple created under the root was acked
    DUPLICATE = "duplicate"  # complete, and the dedup bolt found it done before
    PENDING = "pending"  # tuples still unacked: it completes later or times out
    DEFERRED = "deferred"  # in flight elsewhere: offer it again later
    RELEASED = "released"  # infrastructure failed under it: offer it again, no attempt spent
    FAILED = "failed"  # some tuple under it failed
    INVALID = "invalid"  # cannot be processed: straight to the dead letters


_MARKED = {
    Mark.DEFERRED: RootState.DEFERRED,
    Mark.RELEASED: RootState.RELEASED,
    Mark.FAILED: RootState.FAILED,
    Mark.INVALID: RootState.INVALID,
}


class Acker(Generic[RootKey]):
    """The XOR ledger for a set of roots.

    `values` maps each root to its ack value: a plain dict of ints, which the bolt API's hot
    loops update in place (`values[root] = values.get(root, 0) ^ tuple_id` is `xor`). A
    columnar stage adds its values as arrays instead (`xor_columns`), with no dict entry per
    root; a root's ack value is its dict value XOR its rows in those arrays. `root_columns`
    reads both as arrays; every other reader folds the arrays into the dict first.
    """

    __slots__ = ("_columns", "_errors", "_marks", "values")

    def __init__(self) -> None:
        self.values: dict[RootKey, int] = {}
        self._columns: list[RootColumns] = []
        self._marks: dict[RootKey, Mark] = {}
        self._errors: dict[RootKey, Note] = {}  # a bolt's text, or what it raised

    def xor(self, root: RootKey, value: int) -> None:
        """Fold a tuple id (created or acked) into `root`'s ack value."""
        values = self.values
        values[root] = values.get(root, 0) ^ value

    def xor_each(self, roots: Sequence[RootKey], ids: Sequence[int]) -> None:
        """`xor(root, id)` for each pair; at once into an empty ledger (the usual case: a
        task registering its root tuples)."""
        values = self.values
        if not values:
            values.update(zip(roots, ids, strict=True))
            if len(values) == len(roots):
                return
            values.clear()  # a root came twice: its ids must cancel out, not overwrite
        for root, value in zip(roots, ids, strict=True):
            values[root] = values.get(root, 0) ^ value

    def xor_columns(
        self: Acker[tuple[int, int]], partitions: Ints, offsets: Ints, values: Ids
    ) -> None:
        """Fold ack values given as columns (roots `(partitions[i], offsets[i])`) in as they
        are: a ledger keyed by `(partition, offset)` ships them on as arrays (`root_columns`)
        without a Python object per root."""
        self._columns.append((partitions, offsets, values))

    def root_columns(self: Acker[tuple[int, int]]) -> RootColumns:
        """Every root's ack value as columns, the dict's entries first; a root may be on
        several rows, whose values XOR to its ack value (marks are not in them: `marked`)."""
        values = self.values
        parts = list(self._columns)
        if values or not parts:
            size = len(values)
            partitions = np.fromiter(map(_PARTITION, values), np.int64, size)
            offsets = np.fromiter(map(_OFFSET, values), np.int64, size)
            parts.insert(0, (partitions, offsets, np.fromiter(values.values(), np.uint64, size)))
        if len(parts) == 1:
            return parts[0]
        all_partitions, all_offsets, all_values = (
            np.concatenate(c) for c in zip(*parts, strict=True)
        )
        return all_partitions, all_offsets, all_values

    def flat(self) -> dict[RootKey, int]:
        """`values`, with the columns folded in: every root's ack value in one dict."""
        if self._columns:
            columns, self._columns = self._columns, []
            for partitions, offsets, values in columns:
                roots = zip(partitions.tolist(), offsets.tolist(), strict=True)
                self.xor_each(cast(list[RootKey], list(roots)), values.tolist())
        return self.values

    def mark(self, root: RootKey, mark: Mark, error: Note | None = None) -> None:
        """Record what a bolt said about `root`; a higher mark overrides a lower one."""
        self.values.setdefault(root, 0)
        if mark > self._marks.get(root, Mark.NONE):
            self._marks[root] = mark
            if error is not None:
                self._errors[root] = error

    def fail(self, root: RootKey, error: Note) -> None:
        """Mark `root` failed with EXCEPTION; the first error is kept."""
        self.mark(root, Mark.FAILED, error)

    def add(self, root: RootKey, value: int, mark: Mark, error: Note | None) -> None:
        """Fold in one entry of a partial ledger, as `entries` gives it."""
        self.xor(root, value)
        self.mark(root, mark, error)

    def merge(self, other: Acker[RootKey]) -> None:
        """Fold another (partial) ledger into this one."""
        for entry in other.entries():
            self.add(*entry)

    def state(self, root: RootKey) -> RootState:
        """Where `root` stands now."""
        mark = self._marks.get(root, Mark.NONE)
        if mark >= Mark.DEFERRED:
            return _MARKED[mark]
        if self.flat().get(root, 0):
            return RootState.PENDING
        return RootState.DUPLICATE if mark is Mark.DUPLICATE else RootState.COMPLETE

    def settled(self) -> tuple[list[RootKey], list[tuple[RootKey, RootState, Note | None]]]:
        """The complete roots (unmarked, value zero), and every marked root with its state
        and error (the unmarked roots with a value are pending: they have no outcome yet)."""
        marks, errors = self._marks, self._errors
        complete = [root for root, value in self.flat().items() if not value and root not in marks]
        marked = [(root, self.state(root), errors.get(root)) for root in marks]
        return complete, marked

    def marked(self) -> Iterator[tuple[RootKey, Mark, Note | None]]:
        """`(root, mark, error)` for every marked root (usually few: most have a value only)."""
        errors = self._errors
        for root, mark in self._marks.items():
            yield root, mark, errors.get(root)

    def entries(self) -> Iterator[tuple[RootKey, int, Mark, Note | None]]:
        """`(root, ack value, mark, error)` per root: what `merge` folds into another ledger."""
        marks, errors = self._marks, self._errors
        for root, value in self.flat().items():
            yield root, value, marks.get(root, Mark.NONE), errors.get(root)

    def __len__(self) -> int:
        return len(self.flat())


def xor_runs(changed: np.ndarray[Any, np.dtype[np.bool_]], values: Ids) -> tuple[Ints, Ids]:
    """Rows sorted by root (at least one), folded per root: where each root's run of rows
    starts (`changed[i]`: row i + 1 has another root than row i), and each run's values XORed."""
    starts = np.flatnonzero(np.concatenate(([True], changed)))
    return starts, np.bitwise_xor.reduceat(values, starts)


_PARTITION, _OFFSET = itemgetter(0), itemgetter(1)

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
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

RootKey = TypeVar("RootKey", bound=Hashable)

_rng = random.Random()


def reseed() -> None:
    """Seed the tuple-id generator from the OS.

    Spark forks Python workers from one daemon, and forked copies of one generator would hand
    out the same ids; every task reseeds before it creates any.
    """
    _rng.seed(os.urandom(16))


def new_tuple_id() -> int:
    """A random non-zero 64-bit id (zero would leave no trace in an XOR)."""
    return _rng.getrandbits(64) or 1


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
    """The XOR ledger for a set of roots."""

    __slots__ = ("_errors", "_marks", "_values")

    def __init__(self) -> None:
        self._values: dict[RootKey, int] = {}
        self._marks: dict[RootKey, Mark] = {}
        self._errors: dict[RootKey, str] = {}

    def xor(self, root: RootKey, value: int) -> None:
        """Fold a tuple id (created or acked) into `root`'s ack value."""
        values = self._values
        values[root] = values.get(root, 0) ^ value

    def mark(self, root: RootKey, mark: Mark, error: str | None = None) -> None:
        """Record what a bolt said about `root`; a higher mark overrides a lower one."""
        self._values.setdefault(root, 0)
        if mark > self._marks.get(root, Mark.NONE):
            self._marks[root] = mark
            if error is not None:
                self._errors[root] = error

    def fail(self, root: RootKey, error: str) -> None:
        """Mark `root` failed with EXCEPTION; the first error is kept."""
        self.mark(root, Mark.FAILED, error)

    def add(self, root: RootKey, value: int, mark: Mark, error: str | None) -> None:
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
        if self._values.get(root, 0):
            return RootState.PENDING
        return RootState.DUPLICATE if mark is Mark.DUPLICATE else RootState.COMPLETE

    def states(self) -> Iterator[tuple[RootKey, RootState, str | None]]:
        """`(root, state, error)` for every root, in one pass (what `state` gives per root)."""
        marks, errors = self._marks, self._errors
        pending, complete = RootState.PENDING, RootState.COMPLETE
        for root, value in self._values.items():
            if root in marks:
                yield root, self.state(root), errors.get(root)
            else:
                yield root, pending if value else complete, None

    def entries(self) -> Iterator[tuple[RootKey, int, Mark, str | None]]:
        """`(root, ack value, mark, error)` per root: what ships between tasks."""
        marks, errors = self._marks, self._errors
        for root, value in self._values.items():
            yield root, value, marks.get(root, Mark.NONE), errors.get(root)

    def __len__(self) -> int:
        return len(self._values)

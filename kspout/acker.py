"""Storm's XOR acker: constant-size tracking of a tuple tree (a DAG) per root message.

Every tuple gets a random 64-bit id. A root's ack value is the XOR of every id created under
it and every id acked, so it returns to zero exactly when each tuple in the tree was both
created and acked, whatever the order the two events arrived in. A failed tuple fails its
roots at once. The ledger keeps one integer (and an error, once failed) per root, however
large the tree grows, and two ledgers merge by XOR: partial ledgers from separate Spark tasks
combine in any order.

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


class RootState(enum.Enum):
    COMPLETE = "complete"  # every tuple created under the root was acked
    FAILED = "failed"  # some tuple under it failed
    PENDING = "pending"  # tuples still unacked: it completes later or times out


class Acker(Generic[RootKey]):
    """The XOR ledger for a set of roots."""

    __slots__ = ("_failed", "_values")

    def __init__(self) -> None:
        self._values: dict[RootKey, int] = {}
        self._failed: dict[RootKey, str] = {}

    def xor(self, root: RootKey, value: int) -> None:
        """Fold a tuple id (created or acked) into `root`'s ack value."""
        values = self._values
        values[root] = values.get(root, 0) ^ value

    def fail(self, root: RootKey, error: str) -> None:
        """Mark `root` failed; the first error is kept."""
        self._failed.setdefault(root, error)
        self._values.setdefault(root, 0)

    def merge(self, other: Acker[RootKey]) -> None:
        """Fold another (partial) ledger into this one."""
        for root, value in other._values.items():
            self.xor(root, value)
        for root, error in other._failed.items():
            self._failed.setdefault(root, error)

    def state(self, root: RootKey) -> RootState:
        """Where `root` stands now."""
        if root in self._failed:
            return RootState.FAILED
        return RootState.PENDING if self._values.get(root, 0) else RootState.COMPLETE

    def error(self, root: RootKey) -> str | None:
        """The error that failed `root`, if it failed."""
        return self._failed.get(root)

    def roots(self) -> Iterator[RootKey]:
        """Every root this ledger has seen."""
        return iter(self._values)

    def entries(self) -> Iterator[tuple[RootKey, int, str | None]]:
        """`(root, ack value, error or None)` per root: what ships between tasks."""
        failed = self._failed
        for root, value in self._values.items():
            yield root, value, failed.get(root)

    def __len__(self) -> int:
        return len(self._values)

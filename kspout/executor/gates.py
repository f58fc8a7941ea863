"""The handler loop's gate: which of a task's fetched records the handler runs now.

A plain task has no gate: every record runs. With `ordering = key` (see kspout.ordering) the
`KeyOrderGate` runs a record only when no earlier record of its key is unfinished; one that has
to wait is DEFERRED, and in a slice of a split partition the records of other slices are
reported acked (the slices' results are merged with every non-ack winning,
`kspout.executor.slices.merge_slices`, and each record is some slice's).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from kspout.contract import PartitionTask
from kspout.kafka import FetchResult, Record
from kspout.ordering import KeyGate, KeyOrder, within
from kspout.ranges import Range


class Verdict(enum.Enum):
    """What the handler loop does with a record."""

    RUN = "run"  # call the handler
    OTHERS = "others"  # another slice's record: acked here, its own slice settles it
    WAIT = "wait"  # an earlier record of its key is unfinished: DEFERRED


class Gate(Protocol):
    """Decides, record by record in offset order, which records run now."""

    def admit(self, record: Record) -> Verdict: ...

    def hold(self, record: Record) -> None:
        """`record` ran and did not finish: what its gate must remember for later records."""
        ...


class KeyOrderGate:
    """`ordering = key`: a record of this task's key slice runs when its key is free."""

    __slots__ = ("_keys", "_order")

    def __init__(self, order: KeyOrder, blockers: Sequence[Record]) -> None:
        self._order = order
        self._keys = KeyGate(blockers)

    def admit(self, record: Record) -> Verdict:
        if not self._order.mine(record):
            return Verdict.OTHERS
        # A record that waits needs no hold: an earlier unfinished one holds its key already.
        return Verdict.RUN if self._keys.admits(record) else Verdict.WAIT

    def hold(self, record: Record) -> None:
        self._keys.hold(record)


def gated(
    task: PartitionTask, fetched: FetchResult
) -> tuple[Sequence[Record], Sequence[Range], Gate | None]:
    """What the handler loop goes through for `task`: the records it settles, the offsets
    Kafka does not have (reported GONE), and its gate (None: every record runs).

    With `ordering = key`, `fetched` holds the blockers too: they only teach the gate their
    keys, and only what Kafka lacks inside the plan is GONE.
    """
    if task.keys is None:
        return fetched.records, fetched.missing, None
    planned = task.plan.ranges()
    records, blockers = _planned_and_blockers(fetched.records, planned)
    return records, within(planned, fetched.missing), KeyOrderGate(task.keys, blockers)


def _planned_and_blockers(
    records: Sequence[Record], planned: Sequence[tuple[int, int]]
) -> tuple[list[Record], list[Record]]:
    """Split fetched records (ascending) into the planned ones and the blockers."""
    mine: list[Record] = []
    others: list[Record] = []
    i = 0
    for record in records:
        offset = record.offset
        while i < len(planned) and planned[i][1] <= offset:
            i += 1
        (mine if i < len(planned) and planned[i][0] <= offset else others).append(record)
    return mine, others

"""`ordering = key`: a record waits while an earlier record with the same key is unfinished.

The driver knows offsets, not keys; executors know keys once they fetch. So the driver hands
each task, besides its plan, the partition's *blockers*: the offsets below the plan's end that
are unfinished and not in the plan (failed and waiting for a retry, deferred, timed out). The
executor fetches those too, learns their keys, and runs a planned record only when no earlier
record of its key is unfinished; one that has to wait is reported DEFERRED (no attempt spent)
and offered again later. Within a task, records are handled in offset order, and a record that
does not finish (it fails, is deferred, or had to wait) holds back the later ones of its key.
The driver plans a partition again only once its task is over, so a record in flight is never
overtaken by a later batch.

A hot partition can be split into several Spark tasks by key hash (`max_tasks_per_partition`):
each slice fetches the whole plan and handles only the records of its keys, so every key stays
in one task and in order. Records without a key are not ordered (each is its own key).

Pure logic: no I/O, no client library.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kspout.errors import ChainError
from kspout.kafka.records import Record
from kspout.ranges import Range, union

WAITS_FOR_KEY = "waits for an earlier record of its key (ordering = key)"


@dataclass(frozen=True, slots=True)
class KeyOrder:
    """What a task needs to keep `ordering = key`: earlier unfinished offsets, its key slice."""

    blockers: tuple[Range, ...] = ()  # sorted, disjoint offsets that hold back their keys
    slice: int = 0  # this task handles the keys whose hash lands in `slice` ...
    slices: int = 1  # ... of `slices`

    def mine(self, record: Record) -> bool:
        """True when `record`'s key belongs to this task's slice."""
        return self.slices == 1 or slice_of(record.key, self.slices) == self.slice

    def sliced(self, count: int) -> list[KeyOrder]:
        """This order split into `count` slices by key hash."""
        return [KeyOrder(self.blockers, i, count) for i in range(count)]


def check_runs_in_order(ordering: str, per_record: bool) -> None:
    """Refuse `ordering = key` where outcomes are not per record: only a handler (a function
    of one record) reports each record before the next of its key runs."""
    if ordering == "key" and not per_record:
        raise ChainError(
            'ordering = "key" runs a handler (a function of one record), not a bolt chain or '
            'a batch function: pass a function to KafkaSpout.run, or set ordering = "none" in '
            "the topic file"
        )


def slice_of(key: bytes | None, slices: int) -> int:
    """The slice a key belongs to: a hash that every Python worker computes alike (the
    built-in `hash` of bytes differs from process to process)."""
    if key is None:
        return 0
    return zlib.crc32(key) % slices


class KeyGate:
    """Decides, record by record in offset order, which records of a task may run now."""

    __slots__ = ("_first",)

    def __init__(self, blockers: Iterable[Record]) -> None:
        self._first: dict[bytes, int] = {}  # key -> its lowest unfinished offset
        for record in blockers:
            self.hold(record)

    def admits(self, record: Record) -> bool:
        """True when no earlier record of `record`'s key is unfinished."""
        key = record.key
        if key is None:
            return True
        first = self._first.get(key)
        return first is None or first >= record.offset

    def hold(self, record: Record) -> None:
        """`record` did not finish: later records of its key wait."""
        key = record.key
        if key is not None:
            first = self._first.get(key)
            if first is None or record.offset < first:
                self._first[key] = record.offset


def blockers_of(unfinished: Sequence[Range], plan: Sequence[Range]) -> tuple[Range, ...]:
    """The unfinished ranges below the plan's end that the plan does not cover: what can
    hold back a planned record's key. Both inputs are sorted and disjoint."""
    if not plan:
        return ()
    end = plan[-1][1]
    out: list[Range] = []
    i = 0
    for lo, hi in unfinished:
        hi = min(hi, end)
        while lo < hi:
            while i < len(plan) and plan[i][1] <= lo:
                i += 1
            if i == len(plan) or plan[i][0] >= hi:
                out.append((lo, hi))
                break
            if plan[i][0] > lo:
                out.append((lo, plan[i][0]))
            lo = plan[i][1]
    return tuple(out)


def fetch_ranges(plan: Sequence[Range], blockers: Sequence[Range]) -> list[Range]:
    """The plan's ranges and the blockers, merged into one sorted list of disjoint ranges."""
    return list(union(plan, blockers))


def within(ranges: Sequence[Range], missing: Iterable[Range]) -> list[Range]:
    """The parts of `missing` that lie inside `ranges` (both sorted)."""
    out: list[Range] = []
    for a, b in missing:
        for lo, hi in ranges:
            lo, hi = max(lo, a), min(hi, b)
            if lo < hi:
                out.append((lo, hi))
    return out

"""Poison-pill isolation: find the one record that kills its Python worker, charge only it.

A task that dies without saying why (its worker was killed: `os._exit`, a segfault in a C
library, the OOM killer) is ambiguous: the record it was on may be guilty, or the machine may
have failed under it. So nobody is charged at first. What the dead task left unsettled
becomes a group of *suspects*, run again alone, as a Spark job of its own so that another
crash takes no healthy neighbour down with it:

    suspects --run alone, ends normally--> settled by their outcomes (innocent)
    suspects of n > 1 --run alone, dies--> split: the record it was last seen on alone, the
                                           rest in two halves (bisection)
    one suspect --run alone, dies--> the culprit: FAIL(CRASH), its retry budget is spent

The outcome channel usually names the record a task was on when it died, so the first split
tends to isolate the culprit at once; bisection guarantees progress when it does not (a crash
between two beats). A proven crasher stays known until it is finished, so its retries always
run alone. Offsets keep their attempt while they are suspects: no attempt is spent until one
record is proven guilty.

Pure logic: no I/O, no Spark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kspout.partition_manager import Plan, Span
from kspout.partition_manager.plans import join


@dataclass(frozen=True, slots=True)
class Suspects:
    """Offsets of one partition to run alone: spans at the attempt they are in flight at."""

    partition: int
    generation: int
    spans: tuple[Span, ...]

    @property
    def size(self) -> int:
        return sum(span.end - span.start for span in self.spans)

    def plan(self) -> Plan:
        """The plan that runs exactly these offsets."""
        return Plan(self.spans, self.generation)


def split(group: Suspects, last_seen: int | None) -> list[Suspects]:
    """Smaller groups after `group` died again: `last_seen` alone (when it is a suspect),
    then the rest in two halves by count."""
    offsets = [(o, span.attempt) for span in group.spans for o in range(span.start, span.end)]
    first: list[list[tuple[int, int]]] = []
    if last_seen is not None and any(o == last_seen for o, _ in offsets):
        first.append([(o, a) for o, a in offsets if o == last_seen])
        offsets = [(o, a) for o, a in offsets if o != last_seen]
    half = (len(offsets) + 1) // 2
    parts = [*first, offsets[:half], offsets[half:]]
    return [Suspects(group.partition, group.generation, _spans(part)) for part in parts if part]


def _spans(offsets: Sequence[tuple[int, int]]) -> tuple[Span, ...]:
    """Ascending `(offset, attempt)` pairs as spans of consecutive offsets, one attempt each."""
    return tuple(join([Span(offset, offset + 1, attempt) for offset, attempt in offsets]))


class Isolation:
    """Suspect groups waiting to run alone, and the records proven to kill workers."""

    def __init__(self) -> None:
        self._queue: deque[Suspects] = deque()
        self._crashers: dict[int, set[int]] = {}
        self.runs = 0  # isolation jobs handed out

    def __len__(self) -> int:
        return len(self._queue)

    def waiting(self) -> Iterable[Suspects]:
        """Groups not handed out yet (the driver holds their deadlines)."""
        return iter(self._queue)

    def suspect(self, partition: int, generation: int, open_spans: Sequence[Span]) -> None:
        """A task died leaving `open_spans` unsettled: queue them as one group."""
        if open_spans:
            self._queue.append(Suspects(partition, generation, tuple(open_spans)))

    def next(self) -> Suspects | None:
        """The next group to run alone, or None."""
        if not self._queue:
            return None
        self.runs += 1
        return self._queue.popleft()

    def died(
        self, group: Suspects, open_spans: Sequence[Span], last_seen: int | None
    ) -> int | None:
        """A group's isolated run died leaving `open_spans` unsettled.

        Returns the culprit's offset when one record alone died (the caller fails it with
        CRASH); otherwise queues the smaller groups and returns None.
        """
        remaining = Suspects(group.partition, group.generation, tuple(open_spans))
        if remaining.size == 0:
            return None
        if remaining.size == 1:
            culprit = remaining.spans[0].start
            self._crashers.setdefault(group.partition, set()).add(culprit)
            return culprit
        self._queue.extend(split(remaining, last_seen))
        return None

    def carve(self, partition: int, plan: Plan) -> tuple[Plan, list[Suspects]]:
        """Take known crashers out of a fresh plan: they run alone, each in its own group."""
        crashers = self._crashers.get(partition)
        if not crashers:
            return plan, []
        kept: list[Span] = []
        alone: list[Suspects] = []
        for span in plan.spans:
            start = span.start
            for offset in sorted(o for o in crashers if span.start <= o < span.end):
                if start < offset:
                    kept.append(Span(start, offset, span.attempt))
                alone.append(
                    Suspects(partition, plan.generation, (Span(offset, offset + 1, span.attempt),))
                )
                start = offset + 1
            if start < span.end:
                kept.append(Span(start, span.end, span.attempt))
        return Plan(tuple(kept), plan.generation), alone

    def forget_below(self, partition: int, commit_point: int) -> None:
        """Crashers below the commit point are finished (dead-lettered or acked)."""
        crashers = self._crashers.get(partition)
        if crashers:
            crashers.difference_update([o for o in crashers if o < commit_point])

    def queue_front(self, groups: Iterable[Suspects]) -> None:
        """Queue groups to run alone before any other waiting group."""
        self._queue.extendleft(reversed(list(groups)))

    def drop_partition(self, partition: int) -> None:
        """Forget everything about a partition (it moved, or restarted at another offset)."""
        self._queue = deque(g for g in self._queue if g.partition != partition)
        self._crashers.pop(partition, None)

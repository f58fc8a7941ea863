"""A key-ordered partition split into slices by key hash, and the slices' results joined.

A hot partition with `ordering = key` can run as several tasks (`max_tasks_per_partition`):
each slice fetches the whole plan and handles only the records of its keys, so every key stays
in one task and in order (see kspout.ordering).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from kspout.contract import PartitionTask, TaskResult
from kspout.outcomes import Outcome, OutcomeKind

_ACK = OutcomeKind.ACK


def split_by_key(tasks: Sequence[PartitionTask], slices: int) -> list[PartitionTask]:
    """Each key-ordered task as `slices` tasks that share its plan and split its keys by
    hash (`max_tasks_per_partition`); other tasks as they are."""
    out: list[PartitionTask] = []
    for task in tasks:
        if task.keys is None or slices == 1:
            out.append(task)
        else:
            out.extend(replace(task, keys=keys) for keys in task.keys.sliced(slices))
    return out


def join_slices(tasks: Sequence[PartitionTask], results: Sequence[TaskResult]) -> list[TaskResult]:
    """One result per task of `tasks`, merging the results of a split partition's slices."""
    by_partition: dict[int, list[TaskResult]] = {}
    for result in results:
        by_partition.setdefault(result.partition, []).append(result)
    return [merge_slices(t, by_partition[t.partition]) for t in tasks]


def merge_slices(task: PartitionTask, results: Sequence[TaskResult]) -> TaskResult:
    """One result for a partition split by key hash, from its slices' results.

    Each record belongs to one slice; the others report it acked. So every non-ack outcome
    stands (GONE and out-of-range ones, seen by every slice, once), and the rest is acked. A
    slice that died or failed outside per-message code speaks for the whole partition: which
    offsets were its records is not known here.
    """
    if len(results) == 1:
        return results[0]
    for result in results:
        if result.attempt_died or result.infra_error is not None:
            return result
    settled: dict[tuple[int, int, OutcomeKind], Outcome] = {}
    for result in results:
        for o in result.outcomes:
            if o.kind is not _ACK:
                settled.setdefault((o.offset, o.count, o.kind), o)
    holes: list[Outcome] = []
    for o in sorted(settled.values(), key=lambda o: o.offset):
        if not holes or o.offset >= holes[-1].offset + holes[-1].count:
            holes.append(o)  # an overlap only comes of slices whose fetch stopped apart
    outcomes = list(holes)
    h = 0
    for span in task.plan.spans:
        lo = span.start
        while h < len(holes) and holes[h].offset < span.end:
            hole = holes[h]
            end = hole.offset + hole.count
            if hole.offset > lo:
                outcomes.append(Outcome(lo, _ACK, span.attempt, count=hole.offset - lo))
            lo = max(lo, end)
            if end > span.end:
                break  # the hole goes on into the next span
            h += 1
        if lo < span.end:
            outcomes.append(Outcome(lo, _ACK, span.attempt, count=span.end - lo))
    outcomes.sort(key=lambda o: o.offset)
    out_of_range = next((r.out_of_range for r in results if r.out_of_range), None)
    epochs = [r.leader_epoch for r in results if r.leader_epoch is not None]
    return TaskResult(
        task.topic,
        task.partition,
        task.plan.generation,
        outcomes,
        out_of_range,
        leader_epoch=max(epochs, default=None),
    )

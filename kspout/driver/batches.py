"""Batches in flight, as their tasks' beats describe them: per-message timeouts and cancels.

The tracker keeps, per running batch, what each of its tasks last said over the outcome
channel and what was already settled from it, and decides three things every driver step:

* **A message times out alone.** A task that has been on the same root for longer than
  `message_timeout` fails that root with TIMEOUT at its attempt (the original may still
  run; a late ACK still counts). The records queued behind it are not its fault: while the
  executor is alive, the unsettled offsets of running batches are *held* (their deadline
  pushed), so only the PartitionManager's own deadline, the fallback for a silent executor,
  can time them out.
* **A stuck batch is cancelled.** When every task of a batch that is still running is stuck
  (on a root past its timeout, or outside any record for longer than `message_timeout`, which
  is a hung dependency) and has been so for another `message_timeout` (a slow record gets
  that long to finish: cancelling costs the work of every other record in the batch), the
  batch is cancelled: Spark kills its tasks, which also kills a Python worker stuck in user
  code. What it left unsettled is released, no attempt spent.
* **Outcomes stream.** A plain handler's task reports `upto` (everything fetched below it is
  settled) and its failures; those become outcomes at once, and the final results are later
  clipped to what was not applied yet.

Pure bookkeeping on top of the PartitionManagers; the loop does the I/O (cancelling jobs,
applying results with their breakers and out-of-range hints).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from kspout.contract import Beat, Final, Message, PartitionTask, RootKey, TaskId, TaskResult
from kspout.driver.isolation import Suspects
from kspout.outcomes import FailReason, Outcome, OutcomeKind, describe_error
from kspout.partition_manager import PartitionManager, Span

log = logging.getLogger(__name__)

# Seconds without a beat after which a task's executor no longer counts as alive; beats come
# every 0.2 s, so this allows for a long GC pause or a busy machine.
BEAT_TIMEOUT = 3.0
# Seconds every open task of a batch must have been stuck before the batch is cancelled: the
# gap between one task ending and the next starting on the freed core must not look stuck.
CANCEL_GRACE = 1.0
# Seconds between two holds of the same batch's deadlines (a hold walks a few spans).
HOLD_EVERY = 0.5


@dataclass(slots=True)
class Watch:
    """One task of a batch as its beats describe it."""

    partition: int | None
    heard_at: float  # driver clock at the last beat
    current: RootKey | None
    busy_for: float  # seconds on `current` at the last beat
    done: bool = False
    stuck: bool = False  # on a root past its timeout, or hung outside any record
    hung_outside: bool = False  # stuck outside any record: a dependency, not a message

    def busy(self, now: float) -> float:
        """Seconds on `current` by now (a silent task's time keeps running)."""
        return self.busy_for + (now - self.heard_at)


@dataclass(slots=True)
class RunningBatch:
    """One submitted batch and what the driver knows of it so far."""

    id: int
    tasks: dict[int, PartitionTask]  # by Kafka partition
    future: Future[list[TaskResult]]
    group: Suspects | None  # set for an isolation run
    watches: dict[TaskId, Watch] = field(default_factory=dict)
    upto: dict[int, int] = field(default_factory=dict)  # streamed: settled below this
    missing: dict[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)  # partitions whose results were applied
    cancelled: bool = False
    stuck_since: float | None = None
    held_at: float = float("-inf")
    started_at: float = 0.0  # driver clock just before the executor got it

    def open_spans(self, partition: int) -> list[Span]:
        """The partition's planned spans not settled by streamed outcomes."""
        upto = self.upto.get(partition)
        spans = self.tasks[partition].plan.spans
        if upto is None:
            return list(spans)
        return [Span(max(s.start, upto), s.end, s.attempt) for s in spans if s.end > upto]

    def last_seen(self, partition: int) -> int | None:
        """The offset of `partition` a task of this batch was last seen on, if any."""
        seen = [w for w in self.watches.values() if w.current and w.current[0] == partition]
        return max(seen, key=lambda w: w.heard_at).current[1] if seen else None  # type: ignore[index]


@dataclass(frozen=True, slots=True)
class Ended:
    """A batch whose job is over: results to apply, or how it failed and what it left open."""

    batch: RunningBatch
    results: list[TaskResult]  # not applied yet (clipped to what the stream did not apply)
    error: str | None  # the job failed (None: it succeeded)
    hung_partitions: frozenset[int]  # partitions whose task hung outside any record


class BatchTracker:
    """The running batches of one driver; see the module docstring for what it decides."""

    def __init__(self, message_timeout: float) -> None:
        self._timeout = message_timeout
        self._running: dict[int, RunningBatch] = {}
        self._heard_at = float("-inf")  # the last beat from any task
        self.cancelled = 0  # batches cancelled as stuck

    def __len__(self) -> int:
        return len(self._running)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._running.values())

    def futures(self) -> list[Future[list[TaskResult]]]:
        return [b.future for b in self._running.values()]

    def running(self, partition: int) -> bool:
        """True while a batch has a task of `partition` whose result is not in yet."""
        return any(
            partition in b.tasks and partition not in b.finished for b in self._running.values()
        )

    def add(
        self,
        batch: int,
        tasks: list[PartitionTask],
        future: Future[list[TaskResult]],
        group: Suspects | None = None,
        *,
        started_at: float = 0.0,
    ) -> None:
        """Track a submitted batch; `started_at` is the clock before `submit` (an in-process
        executor runs the whole batch inside it)."""
        by_partition = {t.partition: t for t in tasks}
        self._running[batch] = RunningBatch(
            batch, by_partition, future, group, started_at=started_at
        )

    # -- what tasks say ----------------------------------------------------------------------

    def absorb(self, messages: list[Message], now: float) -> list[tuple[RunningBatch, TaskResult]]:
        """Take beats and final results in; returns outcomes to apply now, in order."""
        out: list[tuple[RunningBatch, TaskResult]] = []
        for message in messages:
            if isinstance(message, Final):
                batch = self._running.get(message.batch)
                if batch is not None:
                    out.extend((batch, r) for r in self._final(batch, message.results))
            else:
                batch = self._running.get(message.task.batch)
                if batch is not None:
                    out.extend((batch, r) for r in self._beat(batch, message, now))
        return out

    def _beat(self, batch: RunningBatch, beat: Beat, now: float) -> list[TaskResult]:
        self._heard_at = now
        watch = batch.watches.get(beat.task)
        if watch is None or watch.current != beat.current:
            stuck = False
            hung = False
        else:
            stuck, hung = watch.stuck, watch.hung_outside
        batch.watches[beat.task] = Watch(
            beat.partition, now, beat.current, beat.busy_for, beat.done, stuck, hung
        )
        p = beat.partition
        if p is None or p not in batch.tasks or p in batch.finished:
            return []
        if beat.missing is not None:
            batch.missing[p] = beat.missing
        if beat.upto is None:
            return []
        return [self._streamed(batch, p, beat.upto, beat.failures)]

    def _streamed(
        self, batch: RunningBatch, p: int, upto: int, failures: tuple[Outcome, ...]
    ) -> TaskResult:
        """Outcomes for `[last upto, upto)`: the failures reported, GONE for missing
        offsets, and ACK runs for every other planned offset."""
        task = batch.tasks[p]
        low = batch.upto.get(p, -1)
        batch.upto[p] = max(low, upto)
        holes = sorted([(o.offset, o.offset + o.count) for o in failures])
        holes += [(a, b) for a, b in batch.missing.get(p, ()) if b > low and a < upto]
        holes.sort()
        outcomes: list[Outcome] = list(failures)
        for span in task.plan.spans:
            lo, hi = max(span.start, low), min(span.end, upto)
            for a, b in holes:
                if b <= lo or a >= hi:
                    continue
                if a > lo:
                    outcomes.append(Outcome(lo, OutcomeKind.ACK, span.attempt, count=a - lo))
                lo = max(lo, b)
            if lo < hi:
                outcomes.append(Outcome(lo, OutcomeKind.ACK, span.attempt, count=hi - lo))
        for a, b in batch.missing.get(p, ()):
            a, b = max(a, low), min(b, upto)
            if a < b:
                outcomes.append(Outcome(a, OutcomeKind.GONE, count=b - a))
        outcomes.sort(key=lambda o: o.offset)
        return TaskResult(task.topic, p, task.plan.generation, outcomes)

    def _final(
        self, batch: RunningBatch, results: tuple[TaskResult, ...] | list[TaskResult]
    ) -> list[TaskResult]:
        out = []
        for result in results:
            p = result.partition
            if p in batch.finished or p not in batch.tasks:
                continue
            batch.finished.add(p)
            out.append(_clip(result, batch.upto.get(p)))
        return out

    # -- jobs that ended ---------------------------------------------------------------------

    def ended(self) -> list[Ended]:
        """Batches whose jobs are over, removed from tracking."""
        out = []
        for batch in [b for b in self._running.values() if b.future.done()]:
            del self._running[batch.id]
            try:
                results = batch.future.result()
            except Exception as exc:
                error = describe_error(exc) if not str(exc) else str(exc)
                hung = frozenset(
                    p
                    for w in batch.watches.values()
                    if w.hung_outside
                    for p in ([w.partition] if w.partition is not None else batch.tasks)
                )
                out.append(Ended(batch, [], error, hung))
                continue
            out.append(Ended(batch, self._final(batch, results), None, frozenset()))
        return out

    # -- the watch ---------------------------------------------------------------------------

    def watch(self, pms: Mapping[int, PartitionManager], now: float) -> list[int]:
        """Time out roots a task is stuck on, hold the rest, and return batches to cancel."""
        cancel = []
        alive = now - self._heard_at < BEAT_TIMEOUT
        for batch in self._running.values():
            if batch.cancelled:
                continue
            open_watches = [w for w in batch.watches.values() if not w.done]
            for w in open_watches:
                if not w.stuck:
                    self._check(batch, w, pms, now)
            if open_watches and all(
                w.stuck and w.busy(now) >= 2 * self._timeout for w in open_watches
            ):
                batch.stuck_since = batch.stuck_since if batch.stuck_since is not None else now
                if now - batch.stuck_since >= CANCEL_GRACE:
                    batch.cancelled = True
                    self.cancelled += 1
                    cancel.append(batch.id)
                    continue
            else:
                batch.stuck_since = None
            if alive and now - batch.held_at >= HOLD_EVERY:
                batch.held_at = now
                self._hold(batch, pms, now + self._timeout)
        return cancel

    def _check(
        self, batch: RunningBatch, w: Watch, pms: Mapping[int, PartitionManager], now: float
    ) -> None:
        busy = w.busy(now)
        if busy <= self._timeout:
            return
        w.stuck = True
        if w.current is None:
            w.hung_outside = True
            log.warning(
                "batch %d: a task has been outside any record for %.1fs (a dependency hangs?)",
                batch.id,
                busy,
            )
            return
        p, offset = w.current
        task = batch.tasks.get(p)
        pm = pms.get(p)
        if task is None or pm is None:
            return
        try:
            attempt = task.plan.attempt_of(offset)
        except KeyError:
            return
        error = f"still running after {busy:.1f}s (message_timeout={self._timeout}s)"
        pm.fail(offset, FailReason.TIMEOUT, error, attempt, generation=task.plan.generation)
        log.warning("%s[%d] offset %d timed out: %s", task.topic, p, offset, error)

    def _hold(self, batch: RunningBatch, pms: Mapping[int, PartitionManager], until: float) -> None:
        for p, task in batch.tasks.items():
            pm = pms.get(p)
            if pm is None or p in batch.finished or pm.generation != task.plan.generation:
                continue
            for span in batch.open_spans(p):
                pm.hold(span.start, span.end, span.attempt, until)

    def hold_group(self, group: Suspects, pm: PartitionManager, now: float) -> None:
        """Keep a queued suspect group's offsets from timing out while they wait their turn."""
        if pm.generation == group.generation:
            for span in group.spans:
                pm.hold(span.start, span.end, span.attempt, now + self._timeout)


def _clip(result: TaskResult, upto: int | None) -> TaskResult:
    """`result` without the outcomes below `upto` (already applied from the stream)."""
    if upto is None:
        return result
    kept = []
    for o in result.outcomes:
        end = o.offset + o.count
        if end <= upto:
            continue
        if o.offset < upto:
            o = Outcome(upto, o.kind, o.attempt, o.reason, o.error, end - upto)
        kept.append(o)
    return TaskResult(
        result.topic,
        result.partition,
        result.generation,
        kept,
        result.out_of_range,
        result.infra_error,
        result.attempt_died,
        result.leader_epoch,
    )

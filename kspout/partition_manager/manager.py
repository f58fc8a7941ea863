"""PartitionManager: storm-kafka's per-partition bookkeeping, rewritten without its defects.

Pure logic: offsets and time only, never payloads, no I/O, no client library. The driver asks
it what to fetch (`plan`), reports what happened (`apply`, `fail`, ...), and commits its
`commit_point`.

Every offset in `[commit_point, emitted_to)` is in exactly one state, kept in a `SpanMap`
(memory grows with gaps, not offsets):

    IN_FLIGHT(attempt, deadline)   handed out by `plan`; waits for its outcome
    WAITING(attempt, reason)       failed or deferred; offered again by `plan` once due (its
                                   due time is kept by the ready schedule, see below)
    DEAD_LETTER                    given up; waits for the driver to write it to the DLQ
    UNPLANNED                      not handed out yet: an unfinished gap between finished
                                   spans restored from the stored record
    DONE                           finished: acked, duplicate, skipped, dead-lettered, lost,
                                   a gap (an offset Kafka never had for this consumer), or
                                   restored (finished before a restart, per the record)

Transitions and why:

    (new) --plan--> IN_FLIGHT(1)
    (start) --finished spans restored--> DONE(restored), the gaps UNPLANNED
    UNPLANNED --plan--> IN_FLIGHT(1)                   replayed like a new offset
    IN_FLIGHT --ack/duplicate--> DONE                   the work is done
    IN_FLIGHT --fail(reason)--> WAITING(due=now+backoff)  within the retry budget
    IN_FLIGHT --fail, budget spent--> DEAD_LETTER | DONE(skipped)   `on_exhausted`
    IN_FLIGHT --fail(INVALID)--> DEAD_LETTER             no id, undecodable: a retry cannot help
    IN_FLIGHT --deadline passes--> fail(TIMEOUT)         the original may still be running
    IN_FLIGHT --defer--> WAITING(due=now+defer_delay)    running elsewhere; no attempt spent
    IN_FLIGHT --release--> WAITING(due=now)              infrastructure failed (fetch, Redis,
                                                         a lost worker): no attempt spent
    IN_FLIGHT --hold--> IN_FLIGHT(later deadline)        its task is alive and has not reached
                                                         it yet: queueing is not its fault
    WAITING --plan, due--> IN_FLIGHT(attempt+1)         retries interleave with new work
    WAITING/DEAD_LETTER --late ack--> DONE               the work was done after all
    WAITING below emitted_to - max_offset_behind --> DEAD_LETTER | DONE(skipped) | stays
                                                         one `behind_policy` for every offset
    DEAD_LETTER --dead_lettered--> DONE                  the DLQ record is durable
    any unfinished --gone--> DONE(gap)                  never data (a transaction marker, a
                                                         compacted record): counted as gaps
    any unfinished --out-of-range reset--> DONE(lost)   data not processed: counted, logged
    any --truncation--> (restart at min(end, commit))    an unclean leader election replaced
                                                         handed-out offsets: planned again

An in-flight offset is never given up while it runs: its deadline turns it into a TIMEOUT
failure first, and the policies apply to failures. So nothing is orphaned: every unfinished
offset either has a deadline, a due time, or a dead-letter write pending.

The manager is the rules over named collaborators: the span ledger (`ledger`: the states, their
schedules and the totals), the fail batcher (`fail_batch`: single `fail` calls logged and
applied in one go), dead letters (`dead_letters`), out of range (`out_of_range`) and truncation
(`truncation`: the leader-epoch anchor and the rollback). It holds
the ledger only through the batcher, whose `ledger()` applies pending failures first: no
method can read or change the ledger while a logged failure is pending.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import dead_letters, out_of_range, truncation
from kspout.partition_manager.dead_letters import DeadLetterTicket
from kspout.partition_manager.fail_batch import FailBatcher
from kspout.partition_manager.ledger import SpanLedger
from kspout.partition_manager.out_of_range import OutOfRangeReset
from kspout.partition_manager.plans import Plan, Span, join
from kspout.partition_manager.states import (
    DONE,
    DeadLetterPending,
    InFlight,
    State,
    Unplanned,
    Waiting,
)
from kspout.partition_manager.stats import Stats
from kspout.partition_manager.truncation import Anchor, Truncation
from kspout.policy import PartitionPolicy
from kspout.ranges import Range, append


class PartitionManager:
    """Bookkeeping for one Kafka partition: what to fetch, what is finished, where to commit.

    `start_offset` is where the partition resumes (the stored commit point, or the position
    chosen by the `start` policy). `finished` are half-open ranges above it that the stored
    record says were finished before a restart: they start DONE (counted as `restored`) and
    are not replayed; the gaps between them are. `generation` is the first generation: a driver that
    takes a partition again starts above every generation it planned before, so outcomes of those
    plans are ignored. `leader_epoch` is the stored anchor (`truncation`), None when unknown.
    `clock` returns seconds (monotonic); tests pass a fake.

    The driver asks every partition what to do at every step, so those questions must not
    walk the spans: the ledger counts offsets per state and schedules what comes due, so an
    idle partition answers each question in O(1).
    """

    def __init__(
        self,
        policy: PartitionPolicy,
        start_offset: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        topic: str = "",
        partition: int = -1,
        finished: Iterable[tuple[int, int]] = (),
        generation: int = 0,
        leader_epoch: Anchor | None = None,
    ) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.policy = policy
        self.topic = topic
        self.partition = partition
        self._clock = clock
        # The ledger lives inside the batcher: `_ledger()`, which applies the logged `fail`
        # calls first, is the only way to it; `fail` appends to `_log`. Both are bound once
        # here, as the hot paths of single calls and of the driver's questions go through them.
        batch = FailBatcher(SpanLedger(policy, start_offset, finished, topic, partition))
        self._ledger: Callable[[], SpanLedger] = batch.ledger
        self._log = batch.log
        self._generation = generation
        self._nothing = Plan((), generation)  # what `plan` returns when nothing is due (shared)
        self._anchor = leader_epoch

    def _restart(self, offset: int) -> None:
        """Forget every offset: the partition starts over, empty, at `offset` (a new generation)."""
        self._ledger().reset(offset)
        self._generation += 1
        self._nothing = Plan((), self._generation)

    # -- reading -----------------------------------------------------------------------------

    @property
    def commit_point(self) -> int:
        """The smallest unfinished offset, or `emitted_to`: everything below it is finished."""
        return self._ledger().map.first

    @property
    def emitted_to(self) -> int:
        """Every offset below this was handed out at least once."""
        return self._ledger().map.end

    @property
    def generation(self) -> int:
        """Bumped by an out-of-range reset; outcomes of older plans are ignored."""
        return self._generation

    def state_of(self, offset: int) -> State | None:
        """The state of an unfinished offset; DONE below the commit point; None if not emitted."""
        m = self._ledger().map
        if offset < m.first:
            return DONE
        return m.get(offset)

    def finished_spans(self, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        """The first `limit` runs of finished offsets above the commit point, ascending, and
        where the first run left out starts (None: none is). What the stored record keeps, so
        a restart need not replay them; costs O(limit), not O(spans).
        """
        m = self._ledger().map
        out: list[tuple[int, int]] = []
        i = 0
        while True:
            try:
                i = m.values.index(DONE, i)  # a C-speed scan (values compare by identity)
            except ValueError:
                return out, None
            if len(out) == limit:
                return out, m.starts[i]
            out.append((m.starts[i], m.span_end(i)))
            i += 1

    @property
    def finished_total(self) -> int:
        """Offsets finished since the start, however: it changes whenever the finished runs
        above the commit point may have (a cheap test before `finished_spans`)."""
        return self._ledger().counts.finished

    def spans(self) -> Iterator[tuple[int, int, State]]:
        """Every span from the commit point to `emitted_to`, ascending, with its state: a walk
        over all of them (for tools and tests; the driver's questions never need one)."""
        return self._ledger().map.spans()

    def stats(self) -> Stats:
        """Current state counts and totals, in O(1) (the map keeps the counts)."""
        ledger = self._ledger()
        m = ledger.map
        return replace(
            ledger.counts,
            commit_point=m.first,
            emitted_to=m.end,
            in_flight=m.count(InFlight),
            waiting=m.count(Waiting),
            dead_letter_pending=m.count(DeadLetterPending),
            unplanned=m.count(Unplanned),
            spans=len(m),
        )

    def unfinished_below(self, hi: int) -> list[tuple[int, int]]:
        """The runs not finished between the commit point and `hi` (what holds back a key
        under `ordering = key`)."""
        ledger = self._ledger()
        return ledger.unfinished(ledger.map.first, hi)

    # -- planning ----------------------------------------------------------------------------

    def plan(self, high_watermark: int, max_new: int) -> Plan:
        """Mark due retries and up to `max_new` new offsets (below `high_watermark`) in flight.

        Expires overdue attempts first (TIMEOUT), offers due retries and UNPLANNED gaps (at
        most `max_new` of them, lowest first) beside new work, and plans no new offsets while
        more than `max_uncommitted` are uncommitted (backpressure; retries still go out).
        """
        ledger = self._ledger()
        now = self._clock()
        if ledger.deadlines.due(now):
            self._expire(ledger, now)
        m = ledger.map
        new = min(max_new, high_watermark - m.end)
        if new <= 0 and not ledger.ready.due(now):  # the idle partition's step: nothing to do
            return self._nothing
        deadline = now + self.policy.message_timeout
        spans = self._plan_ready(ledger, now, deadline, max_new) if max_new > 0 else []
        if self.policy.max_uncommitted is not None:
            new = min(new, self.policy.max_uncommitted - (m.end - m.first))
        if new > 0:
            start = m.end
            m.extend(start + new, InFlight(1, 0, deadline))
            ledger.deadlines.add(deadline, start, start + new)
            spans.append(Span(start, start + new, 1))
            ledger.enforce_behind()
        return Plan(tuple(join(spans)), self._generation)

    @staticmethod
    def _plan_ready(ledger: SpanLedger, now: float, deadline: float, budget: int) -> list[Span]:
        """Put in flight the lowest `budget` offsets that are due retries or UNPLANNED gaps;
        what is due beyond the budget stays scheduled for the next plan."""
        spans: list[Span] = []
        ready = ledger.ready
        due = ready.pop_due(now)
        in_flight = InFlight(1, 0, deadline)  # shared by alike neighbours, which then merge
        for k, (lo, hi, value, at) in enumerate(due):
            if budget <= 0:
                ledger.reschedule(ready, due[k:])
                break
            end = min(hi, lo + budget)
            if end < hi:
                ready.add(at, end, hi)
            attempt, deferrals = 1, 0
            if isinstance(value, Waiting):
                attempt, deferrals = value.attempt + 1, value.deferrals
                if value.reason is not None:
                    ledger.counts.retried += end - lo
            if (in_flight.attempt, in_flight.deferrals) != (attempt, deferrals):
                in_flight = InFlight(attempt, deferrals, deadline)
            ledger.map.assign(lo, end, in_flight)
            ledger.deadlines.add(deadline, lo, end)
            spans.append(Span(lo, end, in_flight.attempt))
            budget -= end - lo
        return spans

    def expire(self, now: float | None = None) -> int:
        """Fail every in-flight attempt past its deadline with TIMEOUT; returns how many."""
        return self._expire(self._ledger(), self._clock() if now is None else now)

    def _expire(self, ledger: SpanLedger, now: float) -> int:
        due = ledger.deadlines.pop_due(now)
        if not due:
            return 0
        expired = 0
        error = f"not completed within message_timeout={self.policy.message_timeout}s"
        for lo, hi, value, _ in due:
            if isinstance(value, InFlight):
                ledger.fail_span(lo, hi, value, FailReason.TIMEOUT, error, now)
                expired += hi - lo
        return expired

    def hold(self, lo: int, hi: int, attempt: int, until: float) -> None:
        """Push the deadline of `[lo, hi)`, in flight at `attempt`, to at least `until`.

        The driver holds offsets whose task is alive but has not finished them (queued behind
        other records, or waiting for a later stage): a message times out for its own
        slowness, not for the records before it. Offsets at another attempt are left alone.
        """
        ledger = self._ledger()
        for a, b, value in ledger.map.spans(lo, hi):
            if isinstance(value, InFlight) and value.attempt == attempt and value.deadline < until:
                ledger.map.assign(a, b, InFlight(value.attempt, value.deferrals, until))
                ledger.deadlines.add(until, a, b)

    def release(self, lo: int, hi: int, attempt: int | None, error: str | None = None) -> int:
        """Hand `[lo, hi)` back without spending an attempt: infrastructure failed under it.

        Only offsets still in flight (at `attempt`, when given) are released; they are due at
        once (the partition's circuit breaker decides when it is planned again). Returns how
        many were released.
        """
        ledger = self._ledger()
        return ledger.wait_range(lo, hi, attempt, self._clock(), error, deferred=False)

    def unsettled(self, lo: int, hi: int, attempt: int) -> list[Range]:
        """The runs of `[lo, hi)` still in flight at `attempt` (what a lost task left open)."""
        out: list[Range] = []
        for a, b, value in self._ledger().map.spans(lo, hi):
            if isinstance(value, InFlight) and value.attempt == attempt:
                append(out, a, b)
        return out

    def restart_at(self, offset: int) -> list[tuple[int, int]]:
        """Start over at `offset` (an operator moved the partition); returns the unfinished
        ranges given up. Outcomes of earlier plans no longer apply (a new generation)."""
        ledger = self._ledger()
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        abandoned = ledger.unfinished(ledger.map.first, ledger.map.end)
        self._restart(offset)
        return abandoned

    # -- leader epochs ---------------------------------------------------------------------

    @property
    def leader_epoch(self) -> Anchor | None:
        """The anchor `(position, epoch)`: the record below `position` was written in leader
        epoch `epoch`; what the driver validates against Kafka (None: no record seen yet)."""
        return self._anchor

    def saw_epoch(self, position: int, epoch: int) -> None:
        """A fetch returned the record at `position - 1`, written in leader epoch `epoch`."""
        self._anchor = truncation.newer(self._anchor, (position, epoch))

    def on_truncation(self, end: int, end_epoch: int, new_epoch: int | None) -> Truncation | None:
        """Kafka's log ends the anchor's epoch at `end` (the record below it in `end_epoch`);
        records of `new_epoch` revealed it. Below the anchor, offsets handed out from `end` on
        were replaced: start over at `min(end, commit point)` in a new generation, count and
        log them (`truncation.roll_back`), and anchor at `(end, end_epoch)`."""
        anchor = self._anchor
        if anchor is None or end >= anchor[0]:
            return None
        self._anchor = (end, end_epoch)
        return truncation.roll_back(self._ledger(), anchor, end, new_epoch, self._restart)

    # -- outcomes ----------------------------------------------------------------------------

    def fail(
        self,
        offset: int,
        reason: FailReason,
        error: str | None = None,
        attempt: int | None = None,
        *,
        generation: int | None = None,
    ) -> None:
        """The attempt failed. Ignored unless the offset is in flight at that attempt.

        Logged, and applied by the next call that reads or changes the partition, in call
        order and at this call's clock reading (`FailBatcher`): single calls come in floods
        (one per message of a failed batch), which are then applied in one go.
        """
        if generation is not None and generation != self._generation:
            self._ledger().counts.stale += 1
        else:
            log = self._log
            log.offsets.append(offset)
            log.reasons.append(reason)
            log.errors.append(error)
            log.attempts.append(attempt)
            log.times.append(self._clock())

    def apply(self, outcomes: Sequence[Outcome], *, generation: int) -> None:
        """Apply one batch's outcomes; contiguous alike outcomes are applied as one range.

        `generation` is the generation of the plan the outcomes answer (required, so no caller can
        forget it): outcomes planned before an out-of-range reset are ignored. The batch is
        applied at one clock reading, so its failures share their retry state. A late ACK
        from an attempt that timed out still means the work is done (a retry in flight will
        find it DUPLICATE in the dedup bolt), so ACKs count whichever attempt they name.
        """
        ledger = self._ledger()
        if generation != self._generation:
            ledger.counts.stale += sum(o.count for o in outcomes)
            return
        now = self._clock()
        first: Outcome | None = None
        hi = -1  # end of the run `first` starts (no offset matches -1)
        kind = attempt = reason = error = None
        for o in outcomes:
            if (
                o.offset == hi
                and o.kind is kind
                and o.attempt == attempt
                and o.reason is reason
                and o.error == error
            ):
                hi += o.count
                continue
            if first is not None:
                _apply_run(ledger, first, hi, now)
            first, hi = o, o.offset + o.count
            kind, attempt, reason, error = o.kind, o.attempt, o.reason, o.error
        if first is not None:
            _apply_run(ledger, first, hi, now)

    # -- dead letters ------------------------------------------------------------------------

    def take_dead_letters(self, limit: int | None = None) -> list[DeadLetterTicket]:
        """Offsets to write to the dead-letter topic now, lowest first; confirm with
        `dead_lettered`. O(1) when there are none."""
        return dead_letters.take(self._ledger(), limit)

    def dead_lettered(self, offsets: Iterable[int]) -> None:
        """The dead-letter records for these offsets are durable: they are finished."""
        dead_letters.written(self._ledger(), offsets)

    def dead_letter_failed(self, offsets: Iterable[int]) -> None:
        """Writing these dead letters failed: hand them out again later."""
        dead_letters.unwritten(self._ledger(), offsets)

    # -- out of range ------------------------------------------------------------------------

    def out_of_range(self, low: int, high: int) -> bool:
        """True when the partition's next offsets are outside Kafka's `[low, high)`."""
        return out_of_range.is_out_of_range(self._ledger(), low, high)

    def on_out_of_range(
        self, low: int, high: int, *, timestamp_offset: int | None = None
    ) -> OutOfRangeReset | None:
        """Apply the `out_of_range` policy when Kafka no longer holds what this partition needs.

        Below `low` (retention deleted unfinished or unread offsets) or above `high` (the
        partition was truncated or recreated). `timestamp_offset` is the resolved offset for a
        `timestamp:<ms>` policy (None: no such offset, fall back to `earliest`, never to
        `latest`). Every unfinished offset below the new start is counted and logged as lost
        with its exact range; `fail` raises `PartitionStopped` and changes nothing.
        """
        return out_of_range.reset(self._ledger(), low, high, timestamp_offset, self._restart)


def _apply_run(ledger: SpanLedger, o: Outcome, hi: int, now: float) -> None:
    """Apply `o`'s outcome to `[o.offset, hi)` (a run of alike outcomes)."""
    kind = o.kind
    if kind is OutcomeKind.ACK:
        ledger.ack_range(o.offset, hi, duplicate=False)
    elif kind is OutcomeKind.FAIL:
        assert o.reason is not None
        ledger.fail_range(o.offset, hi, o.reason, o.error, o.attempt, now)
    elif kind is OutcomeKind.DUPLICATE:
        ledger.ack_range(o.offset, hi, duplicate=True)
    elif kind is OutcomeKind.DEFERRED:
        ledger.defer_range(o.offset, hi, o.attempt, now)
    elif kind is OutcomeKind.RELEASED:
        ledger.wait_range(o.offset, hi, o.attempt, now, o.error, deferred=False)
    else:
        ledger.lose(o.offset, hi)

"""PartitionManager: storm-kafka's per-partition bookkeeping, rewritten without its defects.

Pure logic: offsets and time only, never payloads, no I/O, no client library. The driver asks
it what to fetch (`plan`), reports what happened (`ack`, `fail`, `apply`, ...), and commits its
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

An in-flight offset is never given up while it runs: its deadline turns it into a TIMEOUT
failure first, and the policies apply to failures. So nothing is orphaned: every unfinished
offset either has a deadline, a due time, or a dead-letter write pending.

The driver asks every partition what to do at every step, so no question it asks walks the
spans: the map counts offsets per state (`SpanMap.count`), and three schedules (`Schedule`)
find what comes due: in-flight spans by deadline (`expire`), waiting spans by due time and
unplanned gaps at once (`plan`), dead letters not handed out yet (`take_dead_letters`).
Whatever assigns one of those states registers it in its schedule. A `Waiting` value holds no
due time, so alike failures share one value (and neighbours merge) whenever they fail.
"""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain, islice
from operator import itemgetter, lt
from typing import Final, NamedTuple, TypeAlias, TypeVar

from kspout.errors import PartitionStopped
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.policy import BehindPolicy, ExhaustedPolicy, PartitionPolicy, PositionKind
from kspout.spans import Due, Schedule, SpanMap, runs
from kspout.wording import count as count_of

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class _Done:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


class _Unplanned:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNPLANNED"


DONE: Final = _Done()
UNPLANNED: Final = _Unplanned()


# The states with data are immutable named tuples: one value is shared by every span it covers
# (the map merges neighbours by identity), and a tuple is made several times faster than a
# frozen dataclass, which matters on the single-`fail` path.


class InFlight(NamedTuple):
    attempt: int  # 1 for the first attempt; +1 every time the offset is planned again
    deferrals: int  # attempts that ended DEFERRED or RELEASED (not charged to the budget)
    deadline: float  # clock value after which the attempt fails with TIMEOUT


class Waiting(NamedTuple):
    attempt: int  # the attempt that ended
    deferrals: int
    reason: FailReason | None  # None: deferred, not failed
    error: str | None


class DeadLetterPending(NamedTuple):
    attempts: int
    reason: FailReason | None
    error: str | None
    cause: str  # "retries exhausted", "max_offset_behind" or "not retried" (INVALID)
    handed: bool  # handed to the driver by take_dead_letters, write not yet confirmed


State: TypeAlias = _Done | _Unplanned | InFlight | Waiting | DeadLetterPending


class _FailLog:
    """`fail` calls not applied yet, as columns: call k failed `offsets[k]` for `reasons[k]`
    (`errors[k]`) at `attempts[k]`, the clock reading `times[k]`. No object per call, so a
    flood of them costs the cyclic garbage collector nothing."""

    __slots__ = ("attempts", "errors", "offsets", "reasons", "times")

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.reasons: list[FailReason] = []
        self.errors: list[str | None] = []
        self.attempts: list[int | None] = []
        self.times: list[float] = []

    def pick(self, calls: Sequence[int]) -> _FailLog:
        """The calls at `calls`, in that order."""
        picked = _FailLog()
        for name in _FailLog.__slots__:
            setattr(picked, name, _take(getattr(self, name), calls))
        return picked

    def alike(self) -> tuple[FailReason, str | None, int | None] | None:
        """The reason, error and attempt every call shares; None if they differ."""
        n, reason, error, attempt = (
            len(self.offsets),
            self.reasons[0],
            self.errors[0],
            self.attempts[0],
        )
        if (
            self.reasons.count(reason) == n
            and self.errors.count(error) == n
            and self.attempts.count(attempt) == n
        ):
            return reason, error, attempt
        return None


def _take(column: list[_T], calls: Sequence[int]) -> list[_T]:
    """`column`'s items at `calls`, in that order (a slice when they are a range)."""
    if isinstance(calls, range):
        return column[calls.start : calls.stop]
    if len(calls) == 1:
        return [column[calls[0]]]
    return list(itemgetter(*calls)(column))


@dataclass(frozen=True, slots=True)
class Span:
    """A planned run of offsets `[start, end)`, all at the same attempt."""

    start: int
    end: int
    attempt: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Offsets to fetch next: due retries and a new range, ascending, each offset once."""

    spans: tuple[Span, ...]
    epoch: int  # outcomes from another epoch (before an out-of-range reset) are ignored

    def __iter__(self) -> Iterator[int]:
        for span in self.spans:
            yield from range(span.start, span.end)

    def __len__(self) -> int:
        return sum(span.end - span.start for span in self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def ranges(self) -> list[tuple[int, int]]:
        """Half-open ranges to fetch; adjacent spans of different attempts are joined."""
        out: list[tuple[int, int]] = []
        for span in self.spans:
            if out and out[-1][1] == span.start:
                out[-1] = (out[-1][0], span.end)
            else:
                out.append((span.start, span.end))
        return out

    def attempt_of(self, offset: int) -> int:
        """The attempt number this plan gives `offset` (KeyError when not planned)."""
        i = bisect_right(self.spans, offset, key=lambda span: span.start) - 1
        if i < 0 or offset >= self.spans[i].end:
            raise KeyError(offset)
        return self.spans[i].attempt


@dataclass(frozen=True, slots=True)
class DeadLetterTicket:
    """An offset the driver must write to the dead-letter topic, then confirm."""

    offset: int
    attempts: int
    reason: FailReason | None
    error: str | None
    cause: str


@dataclass(frozen=True, slots=True)
class OutOfRangeReset:
    """What an out-of-range policy did: where the partition moved and what was lost."""

    low: int
    high: int
    old_commit: int
    old_emitted: int
    new_start: int
    lost: tuple[tuple[int, int], ...]  # exact half-open ranges of unfinished offsets given up

    @property
    def lost_count(self) -> int:
        return sum(hi - lo for lo, hi in self.lost)


@dataclass(slots=True)
class Stats:
    """Counts for one partition: states now (in_flight, failed, ...) and totals since start.

    A value to read, not to change. Not frozen: a frozen dataclass sets each of these fields
    through `object.__setattr__` (several microseconds per snapshot), and the driver takes one
    per partition for every progress snapshot.
    """

    commit_point: int
    emitted_to: int
    in_flight: int
    failed: int  # waiting for a retry (or deferred)
    dead_letter_pending: int
    unplanned: int  # unfinished gaps between restored spans, not handed out yet
    acked: int
    duplicates: int
    retried: int
    deferred: int
    timed_out: int
    exceptions: int  # failed as EXCEPTION: the handler raised
    skipped: int
    dead_lettered: int
    lost: int  # data Kafka had that was never processed (out-of-range resets)
    gaps: int  # GONE: offsets Kafka never had for this consumer (markers, compaction)
    invalid: int  # failed as INVALID (no id, undecodable): dead-lettered without a retry
    crashed: int  # failed as CRASH: killed its worker when run alone
    released: int  # handed back for an infrastructure failure, no attempt spent
    stale: int  # outcomes ignored: late, duplicated, or from a finished attempt
    restored: int  # finished before a restart (spans in the stored record): not replayed
    spans: int  # memory in use: number of spans


@dataclass(slots=True)
class _Counters:
    acked: int = 0
    duplicates: int = 0
    retried: int = 0
    deferred: int = 0
    timed_out: int = 0
    exceptions: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    lost: int = 0
    gaps: int = 0
    invalid: int = 0
    crashed: int = 0
    released: int = 0
    stale: int = 0
    restored: int = 0


class PartitionManager:
    """Bookkeeping for one Kafka partition: what to fetch, what is finished, where to commit.

    `start_offset` is where the partition resumes (the stored commit point, or the position
    chosen by the `start` policy). `finished` are half-open ranges above it that the stored
    record says were finished before a restart: they start DONE (counted as `restored`) and
    are not replayed; the gaps between them are. `epoch` is the first epoch: a driver that
    takes a partition again starts above every epoch it planned before, so outcomes of those
    plans are ignored. `clock` returns seconds (monotonic); tests pass a fake.

    The driver asks every partition what to do at every step, so those questions must not
    walk the spans: per-state offset counts are kept by the map (`SpanMap.count`), and three
    schedules (`Schedule`) find what comes due without a walk: in-flight spans by deadline
    (`expire`), waiting and unplanned spans by due time (`plan`), and dead letters not handed
    out yet (`take_dead_letters`). Every assignment of such a state registers it in its
    schedule; an idle partition then answers each question in O(1).
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
        epoch: int = 0,
    ) -> None:
        if start_offset < 0:
            raise ValueError(f"start_offset must be >= 0, got {start_offset}")
        self.policy = policy
        self.topic = topic
        self.partition = partition
        self._clock = clock
        self._map: SpanMap[State] = SpanMap(start_offset)
        self._deadlines = Schedule(self._map, _expires_at)
        # A waiting span or gap has one live entry, so live entries are at most its offsets.
        m = self._map
        self._ready = Schedule(
            m, _is_ready, live_bound=lambda: m.count(Waiting) + m.count(_Unplanned)
        )
        self._letters = Schedule(m, _is_letter, live_bound=lambda: m.count(DeadLetterPending))
        self._last_waiting: Waiting | None = None  # shared by alike failures (`_waiting`)
        self._failing = _FailLog()  # `fail` calls not applied yet (`_settle`)
        self._epoch = epoch
        self._nothing = Plan((), epoch)  # what `plan` returns when nothing is due (shared)
        self._c = _Counters()
        self._restore(finished)
        # `max_offset_behind`, when a behind policy acts on it (`retry` never gives up).
        self._max_behind = (
            None if policy.behind_policy is BehindPolicy.RETRY else policy.max_offset_behind
        )
        # The most attempts the budget allows (`policy.exhausted` beyond), as a plain number.
        self._max_spent = math.inf if policy.max_retries is None else policy.max_retries
        # Precomputed backoff before retry n for the first retries (a budget may be huge).
        budget = 64 if policy.max_retries is None else min(policy.max_retries, 64)
        self._delays = [policy.backoff.delay(n) for n in range(budget + 1)]

    def _restore(self, finished: Iterable[tuple[int, int]]) -> None:
        """Start with `finished` DONE and the gaps below them UNPLANNED (ascending, disjoint
        ranges at or above the start; anything else is a caller's bug)."""
        m = self._map
        for lo, hi in finished:
            if not m.end <= lo < hi:
                raise ValueError(f"finished ranges must ascend above {m.end}, got [{lo}, {hi})")
            if m.end < lo:
                self._ready.add(_NOW, m.end, lo)
            m.extend(lo, UNPLANNED)
            m.extend(hi, DONE)
            self._c.restored += hi - lo
        m.drop_front(DONE)

    def _reset(self, offset: int) -> None:
        """Forget every offset: the partition starts over, empty, at `offset` (a new epoch)."""
        self._map.reset(offset)
        for schedule in (self._deadlines, self._ready, self._letters):
            schedule.clear()
        self._epoch += 1
        self._nothing = Plan((), self._epoch)

    # -- reading -----------------------------------------------------------------------------

    @property
    def commit_point(self) -> int:
        """The smallest unfinished offset, or `emitted_to`: everything below it is finished."""
        self._settle()
        return self._map.first

    @property
    def emitted_to(self) -> int:
        """Every offset below this was handed out at least once."""
        self._settle()
        return self._map.end

    @property
    def epoch(self) -> int:
        """Bumped by an out-of-range reset; outcomes of older plans are ignored."""
        return self._epoch

    def state_of(self, offset: int) -> State | None:
        """The state of an unfinished offset; DONE below the commit point; None if not emitted."""
        self._settle()
        if offset < self.commit_point:
            return DONE
        return self._map.get(offset)

    def finished_spans(self, limit: int) -> tuple[list[tuple[int, int]], int | None]:
        """The first `limit` runs of finished offsets above the commit point, ascending, and
        where the first run left out starts (None: none is). What the stored record keeps, so
        a restart need not replay them; costs O(limit), not O(spans).
        """
        self._settle()
        m = self._map
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
        self._settle()
        c = self._c
        return c.acked + c.duplicates + c.skipped + c.dead_lettered + c.lost + c.gaps

    def spans(self) -> Iterator[tuple[int, int, State]]:
        """Every span from the commit point to `emitted_to`, ascending, with its state: a walk
        over all of them (for tools and tests; the driver's questions never need one)."""
        self._settle()
        return self._map.spans()

    def stats(self) -> Stats:
        """Current state counts and totals, in O(1) (the map keeps the counts)."""
        self._settle()
        m, c = self._map, self._c
        return Stats(
            commit_point=m.first,
            emitted_to=m.end,
            in_flight=m.count(InFlight),
            failed=m.count(Waiting),
            dead_letter_pending=m.count(DeadLetterPending),
            unplanned=m.count(_Unplanned),
            acked=c.acked,
            duplicates=c.duplicates,
            retried=c.retried,
            deferred=c.deferred,
            timed_out=c.timed_out,
            exceptions=c.exceptions,
            skipped=c.skipped,
            dead_lettered=c.dead_lettered,
            lost=c.lost,
            gaps=c.gaps,
            invalid=c.invalid,
            crashed=c.crashed,
            released=c.released,
            stale=c.stale,
            restored=c.restored,
            spans=len(self._map),
        )

    # -- planning ----------------------------------------------------------------------------

    def plan(self, high_watermark: int, max_new: int) -> Plan:
        """Mark due retries and up to `max_new` new offsets (below `high_watermark`) in flight.

        Expires overdue attempts first (TIMEOUT), offers due retries and UNPLANNED gaps (at
        most `max_new` of them, lowest first) beside new work, and plans no new offsets while
        more than `max_uncommitted` are uncommitted (backpressure; retries still go out).
        """
        self._settle()
        now = self._clock()
        if self._deadlines.due(now):
            self._expire(now)
        m = self._map
        new = min(max_new, high_watermark - m.end)
        if new <= 0 and not self._ready.due(now):  # the idle partition's step: nothing to do
            return self._nothing
        deadline = now + self.policy.message_timeout
        spans = self._plan_ready(now, deadline, max_new) if max_new > 0 else []
        if self.policy.max_uncommitted is not None:
            new = min(new, self.policy.max_uncommitted - (m.end - m.first))
        if new > 0:
            start = m.end
            m.extend(start + new, InFlight(1, 0, deadline))
            self._deadlines.add(deadline, start, start + new)
            spans.append(Span(start, start + new, 1))
            self._enforce_behind()
        return Plan(tuple(self._join(spans)), self._epoch)

    def _plan_ready(self, now: float, deadline: float, budget: int) -> list[Span]:
        """Put in flight the lowest `budget` offsets that are due retries or UNPLANNED gaps;
        what is due beyond the budget stays scheduled for the next plan."""
        spans: list[Span] = []
        ready = self._ready.pop_due(now)
        in_flight = InFlight(1, 0, deadline)  # shared by alike neighbours, which then merge
        for k, (lo, hi, value, at) in enumerate(ready):
            if budget <= 0:
                self._reschedule(self._ready, ready[k:])
                break
            end = min(hi, lo + budget)
            if end < hi:
                self._ready.add(at, end, hi)
            attempt, deferrals = 1, 0
            if isinstance(value, Waiting):
                attempt, deferrals = value.attempt + 1, value.deferrals
                if value.reason is not None:
                    self._c.retried += end - lo
            if (in_flight.attempt, in_flight.deferrals) != (attempt, deferrals):
                in_flight = InFlight(attempt, deferrals, deadline)
            self._map.assign(lo, end, in_flight)
            self._deadlines.add(deadline, lo, end)
            spans.append(Span(lo, end, in_flight.attempt))
            budget -= end - lo
        return spans

    @staticmethod
    def _reschedule(schedule: Schedule[State], pieces: Iterable[Due[State]]) -> None:
        """Due pieces left for later (a budget, a limit) go back in their schedule."""
        for lo, hi, _, at in pieces:
            schedule.add(at, lo, hi)

    @staticmethod
    def _join(spans: list[Span]) -> list[Span]:
        out: list[Span] = []
        for span in spans:
            if out and out[-1].end == span.start and out[-1].attempt == span.attempt:
                out[-1] = Span(out[-1].start, span.end, span.attempt)
            else:
                out.append(span)
        return out

    def expire(self, now: float | None = None) -> int:
        """Fail every in-flight attempt past its deadline with TIMEOUT; returns how many."""
        self._settle()
        return self._expire(self._clock() if now is None else now)

    def _expire(self, now: float) -> int:
        """`expire` at `now`, the failure log settled."""
        due = self._deadlines.pop_due(now)
        if not due:
            return 0
        expired = 0
        error = f"not completed within message_timeout={self.policy.message_timeout}s"
        for lo, hi, value, _ in due:
            if isinstance(value, InFlight):
                self._fail_span(lo, hi, value, FailReason.TIMEOUT, error, now)
                expired += hi - lo
        return expired

    def hold(self, lo: int, hi: int, attempt: int, until: float) -> None:
        """Push the deadline of `[lo, hi)`, in flight at `attempt`, to at least `until`.

        The driver holds offsets whose task is alive but has not finished them (queued behind
        other records, or waiting for a later stage): a message times out for its own
        slowness, not for the records before it. Offsets at another attempt are left alone.
        """
        self._settle()
        for a, b, value in self._map.spans(lo, hi):
            if isinstance(value, InFlight) and value.attempt == attempt and value.deadline < until:
                self._map.assign(a, b, InFlight(value.attempt, value.deferrals, until))
                self._deadlines.add(until, a, b)

    def release(self, lo: int, hi: int, attempt: int | None, error: str | None = None) -> int:
        """Hand `[lo, hi)` back without spending an attempt: infrastructure failed under it.

        Only offsets still in flight (at `attempt`, when given) are released; they are due at
        once (the partition's circuit breaker decides when it is planned again). Returns how
        many were released.
        """
        self._settle()
        return self._wait_range(lo, hi, attempt, self._clock(), error, deferred=False)

    def unsettled(self, lo: int, hi: int, attempt: int) -> list[tuple[int, int]]:
        """The runs of `[lo, hi)` still in flight at `attempt` (what a lost task left open)."""
        self._settle()
        out: list[tuple[int, int]] = []
        for a, b, value in self._map.spans(lo, hi):
            if isinstance(value, InFlight) and value.attempt == attempt:
                if out and out[-1][1] == a:
                    out[-1] = (out[-1][0], b)
                else:
                    out.append((a, b))
        return out

    def restart_at(self, offset: int) -> list[tuple[int, int]]:
        """Start over at `offset` (an operator moved the partition); returns the unfinished
        ranges given up. Outcomes of earlier plans no longer apply (a new epoch)."""
        self._settle()
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        abandoned = self._unfinished(self.commit_point, self.emitted_to)
        self._reset(offset)
        return abandoned

    # -- outcomes ----------------------------------------------------------------------------

    def ack(self, offset: int, *, epoch: int | None = None) -> None:
        """The offset was fully processed: applied whichever attempt it came from, late or not.

        A late ACK from an attempt that timed out still means the work is done (a retry in
        flight will find it DUPLICATE in the dedup bolt), so ACKs need no attempt number.
        """
        self._settle()
        if epoch is not None and epoch != self._epoch:
            self._c.stale += 1
            return
        m = self._map
        starts = m.starts
        if not starts or offset < starts[0] or offset >= m.end:
            self._c.stale += 1
            return
        # Fast path: in-order ack of the lowest in-flight offset just moves the commit point.
        if offset == starts[0] and type(m.values[0]) is InFlight:
            m.drop_first(DONE)
            self._c.acked += 1
            return
        i = m.index(offset)
        if m.values[i] is DONE:
            self._c.stale += 1
            return
        m.assign(offset, offset + 1, DONE)
        if i == 0:
            m.drop_front(DONE)
        self._c.acked += 1

    def duplicate(self, offset: int) -> None:
        """The dedup bolt found the offset already done elsewhere: counts as an ack."""
        self._settle()
        self._ack_range(offset, offset + 1, duplicate=True)

    def fail(
        self,
        offset: int,
        reason: FailReason,
        error: str | None = None,
        attempt: int | None = None,
        *,
        epoch: int | None = None,
    ) -> None:
        """The attempt failed. Ignored unless the offset is in flight at that attempt.

        Logged, and applied by the next call that reads or changes the partition, in call
        order and at this call's clock reading (`_settle`): single calls come in floods (one
        per message of a failed batch), which are then applied in one go.
        """
        if epoch is not None and epoch != self._epoch:
            self._c.stale += 1
        else:
            log = self._failing
            log.offsets.append(offset)
            log.reasons.append(reason)
            log.errors.append(error)
            log.attempts.append(attempt)
            log.times.append(self._clock())

    def defer(self, offset: int, attempt: int | None = None) -> None:
        """In flight elsewhere (a live dedup lease): offer it again later, no attempt spent."""
        self._settle()
        self._defer_range(offset, offset + 1, attempt, self._clock())

    def gone(self, offset: int) -> None:
        """Kafka has no record at the offset (a transaction marker, compacted away): it is
        finished as a gap, not lost (nothing was there to process)."""
        self._settle()
        self._lose(offset, offset + 1)

    def ack_range(self, lo: int, hi: int) -> None:
        """Ack every offset in `[lo, hi)`: one step however many offsets it holds."""
        self._settle()
        self._ack_range(lo, hi, duplicate=False)

    def fail_range(
        self,
        lo: int,
        hi: int,
        reason: FailReason,
        error: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Fail every in-flight offset in `[lo, hi)` (at `attempt`, when given)."""
        self._settle()
        self._fail_range(lo, hi, reason, error, attempt, self._clock())

    def ack_many(self, offsets: Iterable[int]) -> None:
        """Ack a batch of offsets; contiguous runs are applied as ranges."""
        self._settle()
        for lo, hi in runs(offsets):
            self._ack_range(lo, hi, duplicate=False)

    def fail_many(
        self, offsets: Iterable[int], reason: FailReason, error: str | None = None
    ) -> None:
        """Fail a batch of offsets (at their current attempts); runs are applied as ranges."""
        self._settle()
        now = self._clock()
        for lo, hi in runs(offsets):
            self._fail_range(lo, hi, reason, error, None, now)

    def apply(self, outcomes: Sequence[Outcome], *, epoch: int) -> None:
        """Apply one batch's outcomes; contiguous alike outcomes are applied as one range.

        `epoch` is the epoch of the plan the outcomes answer (required, so no caller can
        forget it): outcomes planned before an out-of-range reset are ignored. The batch is
        applied at one clock reading, so its failures share their retry state.
        """
        self._settle()
        if epoch != self._epoch:
            self._c.stale += sum(o.count for o in outcomes)
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
                self._apply_run(first, hi, now)
            first, hi = o, o.offset + o.count
            kind, attempt, reason, error = o.kind, o.attempt, o.reason, o.error
        if first is not None:
            self._apply_run(first, hi, now)

    def _apply_run(self, o: Outcome, hi: int, now: float) -> None:
        """Apply `o`'s outcome to `[o.offset, hi)` (a run of alike outcomes)."""
        kind = o.kind
        if kind is OutcomeKind.ACK:
            self._ack_range(o.offset, hi, duplicate=False)
        elif kind is OutcomeKind.FAIL:
            assert o.reason is not None
            self._fail_range(o.offset, hi, o.reason, o.error, o.attempt, now)
        elif kind is OutcomeKind.DUPLICATE:
            self._ack_range(o.offset, hi, duplicate=True)
        elif kind is OutcomeKind.DEFERRED:
            self._defer_range(o.offset, hi, o.attempt, now)
        elif kind is OutcomeKind.RELEASED:
            self._wait_range(o.offset, hi, o.attempt, now, o.error, deferred=False)
        else:
            self._lose(o.offset, hi)

    # -- dead letters ------------------------------------------------------------------------

    def take_dead_letters(self, limit: int | None = None) -> list[DeadLetterTicket]:
        """Offsets to write to the dead-letter topic now, lowest first; confirm with
        `dead_lettered`. O(1) when there are none."""
        self._settle()
        out: list[DeadLetterTicket] = []
        if not self._letters:
            return out
        pieces = self._letters.pop_due(math.inf)
        for k, (lo, hi, value, at) in enumerate(pieces):
            if limit is not None and len(out) >= limit:
                self._reschedule(self._letters, pieces[k:])
                break
            if not isinstance(value, DeadLetterPending):
                continue
            if limit is not None and lo + limit - len(out) < hi:
                self._letters.add(at, lo + limit - len(out), hi)
                hi = lo + limit - len(out)
            self._map.assign(lo, hi, value._replace(handed=True))
            out.extend(
                DeadLetterTicket(o, value.attempts, value.reason, value.error, value.cause)
                for o in range(lo, hi)
            )
        return out

    def dead_lettered(self, offsets: Iterable[int]) -> None:
        """The dead-letter records for these offsets are durable: they are finished."""
        self._settle()
        for lo, hi in runs(offsets):
            for a, b, value in self._map.spans(lo, hi):
                if isinstance(value, DeadLetterPending):
                    self._map.assign(a, b, DONE)
                    self._c.dead_lettered += b - a
        self._map.drop_front(DONE)

    def dead_letter_failed(self, offsets: Iterable[int]) -> None:
        """Writing these dead letters failed: hand them out again later."""
        self._settle()
        for lo, hi in runs(offsets):
            for a, b, value in self._map.spans(lo, hi):
                if isinstance(value, DeadLetterPending) and value.handed:
                    self._map.assign(a, b, value._replace(handed=False))
                    self._letters.add(_NOW, a, b)

    # -- out of range ------------------------------------------------------------------------

    def out_of_range(self, low: int, high: int) -> bool:
        """True when the partition's next offsets are outside Kafka's `[low, high)`."""
        self._settle()
        return self._map.first < low or self._map.end > high

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
        self._settle()
        if not self.out_of_range(low, high):
            return None
        cp, emitted = self.commit_point, self.emitted_to
        position = self.policy.out_of_range
        if position.kind is PositionKind.FAIL:
            raise PartitionStopped(
                self.topic, self.partition, cp if cp < low else emitted, low, high
            )
        if position.kind is PositionKind.LATEST:
            target = high
        elif position.kind is PositionKind.TIMESTAMP and timestamp_offset is not None:
            target = timestamp_offset
        else:
            target = low
        target = min(max(target, low), high)
        lost: list[tuple[int, int]] = []
        if emitted <= high and cp < target < emitted:
            # Only the head is gone: keep the state of what Kafka still has.
            lost = self._unfinished(cp, target)
            self._map.assign(cp, target, DONE)
            self._map.drop_front(DONE)
        else:
            lost = _clip_lost(self._unfinished(cp, emitted), target, high)
            if target > emitted:
                lost.append((emitted, target))
            self._reset(target)
        lost_offsets = sum(b - a for a, b in lost)
        self._c.lost += lost_offsets
        reset = OutOfRangeReset(low, high, cp, emitted, target, tuple(lost))
        log.warning(
            "%s[%s] out of range: needed [%d, %d), Kafka holds [%d, %d); policy %s moved to %d; "
            "lost %s %s",
            self.topic,
            self.partition,
            cp,
            emitted,
            low,
            high,
            position,
            target,
            count_of(lost_offsets, "offset"),
            lost,
        )
        return reset

    # -- internals ---------------------------------------------------------------------------

    def unfinished_below(self, hi: int) -> list[tuple[int, int]]:
        """The runs not finished between the commit point and `hi` (what holds back a key
        under `ordering = key`)."""
        self._settle()
        return self._unfinished(self.commit_point, hi)

    def _unfinished(self, lo: int, hi: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b, value in self._map.spans(lo, hi):
            if value is DONE:
                continue
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return out

    def _ack_range(self, lo: int, hi: int, *, duplicate: bool) -> None:
        """Finish every unfinished offset of `[lo, hi)`; the rest of it is stale news."""
        m = self._map
        lo_c, hi_c = max(lo, m.first), min(hi, m.end)
        stale = (hi - lo) - max(0, hi_c - lo_c)
        done = 0
        if lo_c < hi_c:
            i = m.index(lo_c)
            if hi_c <= m.span_end(i):  # inside one span: the common case, no walk
                if m.values[i] is DONE:
                    stale += hi_c - lo_c
                else:
                    done = hi_c - lo_c
                    m.assign_within(i, lo_c, hi_c, DONE)
            else:
                for a, b, value in m.spans(lo_c, hi_c):
                    if value is DONE:
                        stale += b - a
                    else:
                        done += b - a
                if done:
                    m.assign(lo_c, hi_c, DONE)
            if done:
                m.drop_front(DONE)
        if duplicate:
            self._c.duplicates += done
        else:
            self._c.acked += done
        self._c.stale += stale

    def _fail_range(
        self,
        lo: int,
        hi: int,
        reason: FailReason,
        error: str | None,
        attempt: int | None,
        now: float,
    ) -> None:
        """Fail the offsets of `[lo, hi)` in flight (at `attempt`, when given)."""
        if hi == lo + 1:  # one offset: no walk
            if not self._fail_one(lo, reason, error, attempt, now):
                self._c.stale += 1
            return
        handled = 0
        for a, b, value in self._map.spans(lo, hi):
            if isinstance(value, InFlight) and (attempt is None or attempt == value.attempt):
                self._fail_span(a, b, value, reason, error, now)
                handled += b - a
        self._c.stale += (hi - lo) - handled

    def _fail_one(
        self, offset: int, reason: FailReason, error: str | None, attempt: int | None, now: float
    ) -> bool:
        """Fail `offset` if it is in flight (at `attempt`, when given); False if it is not.

        The hot path of single `fail` calls and of batches with scattered failures: one bisect
        finds the span, which `_fail_span` then edits in place.
        """
        m = self._map
        starts = m.starts
        if not starts or offset < starts[0] or offset >= m.end:
            return False
        i = bisect_right(starts, offset) - 1
        value = m.values[i]
        if type(value) is not InFlight or (attempt is not None and attempt != value.attempt):
            return False
        self._fail_span(offset, offset + 1, value, reason, error, now, i)
        return True

    def _fail_span(
        self,
        lo: int,
        hi: int,
        value: InFlight,
        reason: FailReason,
        error: str | None,
        now: float,
        index: int | None = None,
    ) -> None:
        """Schedule a retry of `[lo, hi)`, or give up once the budget is spent.

        `index`, when the caller already found the span holding `[lo, hi)`, saves a lookup.
        """
        self._count_failed(reason, hi - lo)
        if reason is FailReason.INVALID:  # retrying cannot help: straight to the dead letters
            self._give_up(
                lo, hi, ExhaustedPolicy.DEAD_LETTER, value.attempt, reason, error, "not retried"
            )
            return
        spent = value.attempt - value.deferrals  # attempts that count against the budget
        if spent > self._max_spent:
            self._give_up(
                lo, hi, self.policy.on_exhausted, value.attempt, reason, error, "retries exhausted"
            )
            return
        due = now + self._delay(spent)
        waiting = self._waiting(value.attempt, value.deferrals, reason, error)
        if index is None:
            self._map.assign(lo, hi, waiting)
        else:
            self._map.assign_within(index, lo, hi, waiting)
        self._ready.add(due, lo, hi)
        if self._max_behind is not None and lo < self.emitted_to - self._max_behind:
            self._enforce_behind()

    def _count_failed(self, reason: FailReason, n: int) -> None:
        """Count `n` offsets failed for `reason`."""
        c = self._c
        if reason is FailReason.EXCEPTION:
            c.exceptions += n
        elif reason is FailReason.TIMEOUT:
            c.timed_out += n
        elif reason is FailReason.CRASH:
            c.crashed += n
        else:
            c.invalid += n

    def _delay(self, spent: int) -> float:
        """The backoff before the retry after `spent` charged attempts."""
        delays = self._delays
        return delays[spent] if spent < len(delays) else self.policy.backoff.delay(spent)

    def _settle(self) -> None:
        """Apply the failures `fail` logged, each at its own clock reading: every other public
        method and property calls this first, so none sees the log."""
        failing = self._failing
        if not failing.offsets:
            return
        self._failing = _FailLog()
        self._fail_log(failing)

    def _fail_logged(self, log: _FailLog, k: int) -> None:
        """Apply logged call `k` on its own."""
        if not self._fail_one(
            log.offsets[k], log.reasons[k], log.errors[k], log.attempts[k], log.times[k]
        ):
            self._c.stale += 1

    def _fail_log(self, log: _FailLog) -> None:
        """Apply logged failures by span, with the result of applying them in call order.

        Failures of distinct offsets do not depend on one another, so they are taken by
        offset: the alike failures inside one in-flight span (`_fail_alike`) become one splice
        of the map, the others are applied one by one. Spans go from the highest down, so an
        edit never moves a span still to come. An offset failed twice in the log (its calls
        depend on each other) sends the whole log one by one, in call order.
        """
        offsets = log.offsets
        n = len(offsets)
        order: Sequence[int] = range(n)
        ascending = offsets
        if not all(map(lt, offsets, islice(offsets, 1, None))):
            order = sorted(order, key=offsets.__getitem__)
            ascending = _take(offsets, order)
            if not all(map(lt, ascending, islice(ascending, 1, None))):
                for k in range(n):
                    self._fail_logged(log, k)
                return
        m = self._map
        groups: list[tuple[int, int]] = []  # `ascending[a:b]` lie in one span each
        pos = 0
        while pos < n:
            i = bisect_right(m.starts, ascending[pos]) - 1
            end = m.span_end(i) if i >= 0 else m.first
            stop = max(pos + 1, bisect_left(ascending, end, pos + 1))
            groups.append((pos, stop))
            pos = stop
        shared = log.alike()  # a flood's calls mostly share them: no check per group then
        batched: dict[float, list[Sequence[int]]] = {}  # backoff delay -> calls that wait it
        for a, b in reversed(groups):
            calls = order[a:b]
            alike = shared if shared is not None or b - a < 2 else log.pick(calls).alike()
            delay = None
            if b - a >= 2 and alike is not None:
                delay = self._fail_alike(ascending[a:b], *alike)
            if delay is None:
                for k in calls:
                    self._fail_logged(log, k)
            else:
                batched.setdefault(delay, []).append(calls)
        for delay, done in batched.items():  # their due times, as runs in call order
            if len(done) > 1 or not isinstance(done[0], range):
                calls = sorted(chain.from_iterable(done))
            else:
                calls = done[0]  # a flood logged in offset order: slices, no copy per call
            self._ready.add_singles(_take(log.times, calls), delay, _take(offsets, calls))

    def _fail_alike(
        self, offsets: Sequence[int], reason: FailReason, error: str | None, attempt: int | None
    ) -> float | None:
        """Fail `offsets` (ascending, two or more, inside one span) in one splice when they
        are in flight (at `attempt`, when given), `reason` is not INVALID, the budget is not
        spent and none is behind `max_offset_behind`. Returns their backoff delay (their due
        times are left to the caller); None, with nothing done, otherwise."""
        m = self._map
        n, first, last = len(offsets), offsets[0], offsets[-1]
        if not m.first <= first < m.end:
            return None
        i = bisect_right(m.starts, first) - 1
        value = m.values[i]
        if (
            type(value) is not InFlight
            or last >= m.span_end(i)
            or (attempt is not None and attempt != value.attempt)
            or reason is FailReason.INVALID
            or value.attempt - value.deferrals > self._max_spent
            or (self._max_behind is not None and first < m.end - self._max_behind)
        ):
            return None
        self._count_failed(reason, n)
        waiting = self._waiting(value.attempt, value.deferrals, reason, error)
        if last - first == n - 1:  # contiguous: one run
            m.assign_within(i, first, last + 1, waiting)
        else:
            los, his = zip(*runs(offsets), strict=True)
            m.assign_runs(i, los, his, waiting)
        return self._delay(value.attempt - value.deferrals)

    def _waiting(
        self, attempt: int, deferrals: int, reason: FailReason | None, error: str | None
    ) -> Waiting:
        """A `Waiting` value: the last one made when it is alike, else a new one, so alike
        failures share one object (their spans merge where they touch) and a flood of them
        allocates none."""
        w = self._last_waiting
        if (
            w is None
            or w.attempt != attempt
            or w.deferrals != deferrals
            or w.reason is not reason
            or w.error != error
        ):
            w = self._last_waiting = Waiting(attempt, deferrals, reason, error)
        return w

    def _defer_range(self, lo: int, hi: int, attempt: int | None, now: float) -> None:
        self._wait_range(lo, hi, attempt, now + self.policy.defer_delay, None, deferred=True)

    def _wait_range(
        self,
        lo: int,
        hi: int,
        attempt: int | None,
        due: float,
        error: str | None,
        *,
        deferred: bool,
    ) -> int:
        """In-flight offsets of `[lo, hi)` wait until `due` for another attempt that is not
        charged to them (a deferral or a release); returns how many."""
        handled = 0
        for a, b, value in self._map.spans(lo, hi):
            if isinstance(value, InFlight) and (attempt is None or attempt == value.attempt):
                waiting = self._waiting(value.attempt, value.deferrals + 1, None, error)
                self._map.assign(a, b, waiting)
                self._ready.add(due, a, b)
                handled += b - a
        if deferred:
            self._c.deferred += handled
            self._c.stale += (hi - lo) - handled
        else:  # releases are the driver sweeping a lost task: what was settled is no news
            self._c.released += handled
        return handled

    def _lose(self, lo: int, hi: int) -> None:
        """GONE: offsets inside Kafka's log that hold no record for this consumer (transaction
        markers, aborted or compacted records) are finished and counted as gaps, never as
        `lost`, which is only for data that existed and was not processed."""
        gaps = self._unfinished(max(lo, self._map.first), min(hi, self._map.end))
        for a, b in gaps:
            self._map.assign(a, b, DONE)
            self._c.gaps += b - a
            log.info(
                "%s[%s] offsets [%d, %d) are gone from Kafka (no record there: transaction "
                "markers, compaction): counted as gaps",
                self.topic,
                self.partition,
                a,
                b,
            )
        self._map.drop_front(DONE)

    def _enforce_behind(self) -> None:
        """Apply `behind_policy` to every waiting offset below `emitted_to - max_offset_behind`."""
        if self._max_behind is None:
            return
        limit = self.emitted_to - self._max_behind
        if limit <= self.commit_point:
            return
        action = (
            ExhaustedPolicy.SKIP
            if self.policy.behind_policy is BehindPolicy.SKIP
            else ExhaustedPolicy.DEAD_LETTER
        )
        for lo, hi, value in self._map.spans(None, limit):
            if isinstance(value, Waiting):
                self._give_up(
                    lo, hi, action, value.attempt, value.reason, value.error, "max_offset_behind"
                )

    def _give_up(
        self,
        lo: int,
        hi: int,
        action: ExhaustedPolicy,
        attempts: int,
        reason: FailReason | None,
        error: str | None,
        cause: str,
    ) -> None:
        if action is ExhaustedPolicy.SKIP:
            self._map.assign(lo, hi, DONE)
            self._map.drop_front(DONE)
            self._c.skipped += hi - lo
            log.warning(
                "%s[%s] skipped offsets [%d, %d) after %d attempts (%s): %s",
                self.topic,
                self.partition,
                lo,
                hi,
                attempts,
                cause,
                error,
            )
        else:
            self._map.assign(lo, hi, DeadLetterPending(attempts, reason, error, cause, False))
            self._letters.add(_NOW, lo, hi)


# Whether a span still holds what a schedule entry of time `at` was made for (entries are not
# updated when spans change). An in-flight span is expired by the entry of its own deadline
# (a hold leaves the entry of the old one behind); a waiting span or an unplanned gap has one
# entry (its due time, -inf for a gap), since it can only leave the state by being planned,
# which pops the entry, or by finishing; a dead letter is due at once until it is handed out.
_NOW: Final = -math.inf  # due from the start, whatever the clock says


def _expires_at(value: State, at: float) -> bool:
    return type(value) is InFlight and value.deadline == at


def _is_ready(value: State, at: float) -> bool:
    return type(value) is Waiting or value is UNPLANNED


def _is_letter(value: State, at: float) -> bool:
    return type(value) is DeadLetterPending and not value.handed


def _clip_lost(ranges: list[tuple[int, int]], target: int, high: int) -> list[tuple[int, int]]:
    """Keep the parts of `ranges` that a reset to `target` will not reprocess.

    After a reset, offsets in `[target, high)` are fetched again, so only unfinished offsets
    below the target, or at/above `high` (no longer in Kafka), are lost.
    """
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if a < target:
            out.append((a, min(b, target)))
        if b > high:
            out.append((max(a, high, target), b))
    return [(a, b) for a, b in out if a < b]

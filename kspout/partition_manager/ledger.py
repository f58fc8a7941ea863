"""The span ledger: every unfinished offset's state in a `SpanMap`, the three schedules that find
what comes due, the totals, and the transitions that keep them in step.

Whatever assigns a scheduled state registers it in its schedule here, and every transition
counts what it did, so the driver's questions never walk the spans: the map counts offsets per
state, `deadlines` finds expired attempts, `ready` due retries and unplanned gaps, `letters`
dead letters not handed out yet. The ledger holds no clock and no generation: callers pass `now`.
"""

from __future__ import annotations

import logging
import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from kspout.outcomes import FailReason
from kspout.partition_manager.states import (
    DONE,
    NOW,
    UNPLANNED,
    DeadLetterPending,
    InFlight,
    State,
    Unplanned,
    Waiting,
    expires_at,
    is_letter,
    is_ready,
)
from kspout.partition_manager.stats import Stats
from kspout.policy import BehindPolicy, ExhaustedPolicy, PartitionPolicy
from kspout.ranges import Range, append, runs
from kspout.spans import Due, Schedule, SpanMap

# The package's one logger name, as before it was split: operators filter on it.
log = logging.getLogger("kspout.partition_manager")


class SpanLedger:
    """The states of `[map.first, map.end)` under `policy`, their schedules and the totals.

    `finished` are the restored ranges (see `PartitionManager`). `topic` and `partition` only
    name the partition in log lines.
    """

    def __init__(
        self,
        policy: PartitionPolicy,
        start_offset: int,
        finished: Iterable[tuple[int, int]],
        topic: str,
        partition: int,
    ) -> None:
        self.policy = policy
        self.topic = topic
        self.partition = partition
        self.map: SpanMap[State] = SpanMap(start_offset)
        m = self.map
        self.deadlines = Schedule(m, expires_at)
        # A waiting span or gap has one live entry, so live entries are at most its offsets.
        self.ready = Schedule(m, is_ready, live_bound=lambda: m.count(Waiting) + m.count(Unplanned))
        self.letters = Schedule(m, is_letter, live_bound=lambda: m.count(DeadLetterPending))
        self.counts = Stats()  # the totals; the map counts the states
        self._last_waiting: Waiting | None = None  # shared by alike failures (`_waiting`)
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
        m = self.map
        for lo, hi in finished:
            if not m.end <= lo < hi:
                raise ValueError(f"finished ranges must ascend above {m.end}, got [{lo}, {hi})")
            if m.end < lo:
                self.ready.add(NOW, m.end, lo)
            m.extend(lo, UNPLANNED)
            m.extend(hi, DONE)
            self.counts.restored += hi - lo
        m.drop_front(DONE)

    def reset(self, offset: int) -> None:
        """Forget every offset: the ledger starts over, empty, at `offset`."""
        self.map.reset(offset)
        for schedule in (self.deadlines, self.ready, self.letters):
            schedule.clear()

    @staticmethod
    def reschedule(schedule: Schedule[State], pieces: Iterable[Due[State]]) -> None:
        """Due pieces left for later (a budget, a limit) go back in their schedule."""
        for lo, hi, _, at in pieces:
            schedule.add(at, lo, hi)

    def unfinished(self, lo: int, hi: int) -> list[Range]:
        """The runs of `[lo, hi)` not finished, joined where they touch."""
        out: list[Range] = []
        for a, b, value in self.map.spans(lo, hi):
            if value is not DONE:
                append(out, a, b)
        return out

    def ack_range(self, lo: int, hi: int, *, duplicate: bool) -> None:
        """Finish every unfinished offset of `[lo, hi)`; the rest of it is stale news."""
        m = self.map
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
            self.counts.duplicates += done
        else:
            self.counts.acked += done
        self.counts.stale += stale

    def fail_range(
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
            if not self.fail_one(lo, reason, error, attempt, now):
                self.counts.stale += 1
            return
        handled = 0
        for a, b, value in self.map.spans(lo, hi):
            if isinstance(value, InFlight) and (attempt is None or attempt == value.attempt):
                self.fail_span(a, b, value, reason, error, now)
                handled += b - a
        self.counts.stale += (hi - lo) - handled

    def fail_one(
        self, offset: int, reason: FailReason, error: str | None, attempt: int | None, now: float
    ) -> bool:
        """Fail `offset` if it is in flight (at `attempt`, when given); False if it is not.

        The hot path of single `fail` calls and of batches with scattered failures: one bisect
        finds the span, which `fail_span` then edits in place.
        """
        m = self.map
        starts = m.starts
        if not starts or offset < starts[0] or offset >= m.end:
            return False
        i = bisect_right(starts, offset) - 1
        value = m.values[i]
        if type(value) is not InFlight or (attempt is not None and attempt != value.attempt):
            return False
        self.fail_span(offset, offset + 1, value, reason, error, now, i)
        return True

    def fail_span(
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
            self.map.assign(lo, hi, waiting)
        else:
            self.map.assign_within(index, lo, hi, waiting)
        self.ready.add(due, lo, hi)
        if self._max_behind is not None and lo < self.map.end - self._max_behind:
            self.enforce_behind()

    def _count_failed(self, reason: FailReason, n: int) -> None:
        """Count `n` offsets failed for `reason`."""
        c = self.counts
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

    def fail_alike(
        self, offsets: Sequence[int], reason: FailReason, error: str | None, attempt: int | None
    ) -> float | None:
        """Fail `offsets` (ascending, two or more, inside one span) in one splice when they
        are in flight (at `attempt`, when given), `reason` is not INVALID, the budget is not
        spent and none is behind `max_offset_behind`. Returns their backoff delay (their due
        times are left to the caller); None, with nothing done, otherwise."""
        m = self.map
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

    def defer_range(self, lo: int, hi: int, attempt: int | None, now: float) -> None:
        self.wait_range(lo, hi, attempt, now + self.policy.defer_delay, None, deferred=True)

    def wait_range(
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
        for a, b, value in self.map.spans(lo, hi):
            if isinstance(value, InFlight) and (attempt is None or attempt == value.attempt):
                waiting = self._waiting(value.attempt, value.deferrals + 1, None, error)
                self.map.assign(a, b, waiting)
                self.ready.add(due, a, b)
                handled += b - a
        if deferred:
            self.counts.deferred += handled
            self.counts.stale += (hi - lo) - handled
        else:  # releases are the driver sweeping a lost task: what was settled is no news
            self.counts.released += handled
        return handled

    def lose(self, lo: int, hi: int) -> None:
        """GONE: offsets inside Kafka's log that hold no record for this consumer (transaction
        markers, aborted or compacted records) are finished and counted as gaps, never as
        `lost`, which is only for data that existed and was not processed."""
        gaps = self.unfinished(max(lo, self.map.first), min(hi, self.map.end))
        for a, b in gaps:
            self.map.assign(a, b, DONE)
            self.counts.gaps += b - a
            log.info(
                "%s[%s] offsets [%d, %d) are gone from Kafka (no record there: transaction "
                "markers, compaction): counted as gaps",
                self.topic,
                self.partition,
                a,
                b,
            )
        self.map.drop_front(DONE)

    def enforce_behind(self) -> None:
        """Apply `behind_policy` to every waiting offset below `emitted_to - max_offset_behind`."""
        if self._max_behind is None:
            return
        limit = self.map.end - self._max_behind
        if limit <= self.map.first:
            return
        action = (
            ExhaustedPolicy.SKIP
            if self.policy.behind_policy is BehindPolicy.SKIP
            else ExhaustedPolicy.DEAD_LETTER
        )
        for lo, hi, value in self.map.spans(None, limit):
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
            self.map.assign(lo, hi, DONE)
            self.map.drop_front(DONE)
            self.counts.skipped += hi - lo
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
            self.map.assign(lo, hi, DeadLetterPending(attempts, reason, error, cause, False))
            self.letters.add(NOW, lo, hi)

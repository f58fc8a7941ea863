"""A deliberately naive reference model of the PartitionManager: one dict entry per offset.

It restates the rules of design.md offset by offset, with no ranges and no shortcuts, so the
property tests can compare the real, range-based manager against it step by step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kspout.outcomes import FailReason
from kspout.policy import BehindPolicy, ExhaustedPolicy, PartitionPolicy, PositionKind


@dataclass
class Off:
    state: str  # unplanned | inflight | waiting | deadletter | done
    attempt: int = 1
    deferrals: int = 0
    deadline: float = 0.0
    due: float = 0.0
    failed: bool = False  # waiting after a failure (not a deferral)
    handed: bool = False
    how: str = ""  # for done: acked | duplicates | skipped | dead_lettered | lost | restored


@dataclass
class Model:
    policy: PartitionPolicy
    start: int
    finished: list[tuple[int, int]] = field(default_factory=list)  # restored from a record
    offsets: dict[int, Off] = field(default_factory=dict)
    emitted: int = -1
    base: int = -1  # lowest offset still tracked (after resets)
    generation: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.emitted = self.base = self.start
        self.counts = {
            k: 0
            for k in (
                "acked",
                "duplicates",
                "skipped",
                "dead_lettered",
                "lost",
                "gaps",
                "retried",
                "deferred",
                "timed_out",
                "exceptions",
                "invalid",
                "crashed",
                "released",
                "restored",
            )
        }
        # A restart: offsets in `finished` are done, the ones between are not handed out yet.
        for lo, hi in self.finished:
            for o in range(self.emitted, lo):
                self.offsets[o] = Off("unplanned")
            for o in range(lo, hi):
                self._finish(o, "restored")
            self.emitted = hi

    # -- reading ---------------------------------------------------------------------------
    def commit_point(self) -> int:
        o = self.base
        while o < self.emitted and self.offsets[o].state == "done":
            o += 1
        return o

    def unfinished(self) -> list[int]:
        return [o for o in range(self.base, self.emitted) if self.offsets[o].state != "done"]

    def count(self, state: str) -> int:
        return sum(1 for o in range(self.base, self.emitted) if self.offsets[o].state == state)

    # -- transitions -------------------------------------------------------------------------
    def _finish(self, o: int, how: str) -> None:
        self.offsets[o] = Off("done", how=how)
        self.counts[how] += 1

    def _give_up(self, o: int, action: ExhaustedPolicy, attempts: int) -> None:
        if action is ExhaustedPolicy.SKIP:
            self._finish(o, "skipped")
        else:
            self.offsets[o] = Off("deadletter", attempt=attempts)

    def _behind_limit(self) -> int | None:
        p = self.policy
        if p.max_offset_behind is None or p.behind_policy is BehindPolicy.RETRY:
            return None
        return self.emitted - p.max_offset_behind

    def _enforce_behind(self) -> None:
        limit = self._behind_limit()
        if limit is None:
            return
        action = (
            ExhaustedPolicy.SKIP
            if self.policy.behind_policy is BehindPolicy.SKIP
            else ExhaustedPolicy.DEAD_LETTER
        )
        for o in range(self.base, min(limit, self.emitted)):
            s = self.offsets[o]
            if s.state == "waiting":
                self._give_up(o, action, s.attempt)

    def _fail_one(self, o: int, now: float) -> None:
        s = self.offsets[o]
        spent = s.attempt - s.deferrals
        if self.policy.exhausted(spent):
            self._give_up(o, self.policy.on_exhausted, s.attempt)
            return
        due = now + self.policy.backoff.delay(spent)
        self.offsets[o] = Off("waiting", s.attempt, s.deferrals, due=due, failed=True)
        limit = self._behind_limit()
        if limit is not None and o < limit:
            self._enforce_behind()

    def expire(self, now: float) -> None:
        for o in range(self.base, self.emitted):
            s = self.offsets[o]
            if s.state == "inflight" and s.deadline <= now:
                self.counts["timed_out"] += 1
                self._fail_one(o, now)

    def plan(self, now: float, high: int, max_new: int) -> list[tuple[int, int]]:
        self.expire(now)
        deadline = now + self.policy.message_timeout
        planned: list[tuple[int, int]] = []
        for o in range(self.base, self.emitted):
            if len(planned) >= max_new:
                break
            s = self.offsets[o]
            if s.state == "waiting" and s.due <= now:
                if s.failed:
                    self.counts["retried"] += 1
                self.offsets[o] = Off("inflight", s.attempt + 1, s.deferrals, deadline=deadline)
                planned.append((o, s.attempt + 1))
            elif s.state == "unplanned":
                self.offsets[o] = Off("inflight", 1, 0, deadline=deadline)
                planned.append((o, 1))
        new = min(max_new, high - self.emitted)
        if self.policy.max_uncommitted is not None:
            new = min(new, self.policy.max_uncommitted - (self.emitted - self.commit_point()))
        if new > 0:
            for o in range(self.emitted, self.emitted + new):
                self.offsets[o] = Off("inflight", 1, 0, deadline=deadline)
                planned.append((o, 1))
            self.emitted += new
            self._enforce_behind()
        return planned

    def _live(self, o: int) -> Off | None:
        if o < self.base or o >= self.emitted:
            return None
        s = self.offsets[o]
        return None if s.state == "done" else s

    def ack(self, o: int, duplicate: bool = False) -> None:
        if self._live(o) is not None:
            self._finish(o, "duplicates" if duplicate else "acked")

    def fail(
        self, o: int, now: float, attempt: int | None, reason: FailReason = FailReason.EXCEPTION
    ) -> None:
        s = self._live(o)
        if s is not None and s.state == "inflight" and attempt in (None, s.attempt):
            if reason is FailReason.EXCEPTION:
                self.counts["exceptions"] += 1
            elif reason is FailReason.TIMEOUT:
                self.counts["timed_out"] += 1
            elif reason is FailReason.CRASH:
                self.counts["crashed"] += 1
            if reason is FailReason.INVALID:
                self.counts["invalid"] += 1
                self._give_up(o, ExhaustedPolicy.DEAD_LETTER, s.attempt)
            else:
                self._fail_one(o, now)

    def defer(self, o: int, now: float, attempt: int | None) -> None:
        s = self._live(o)
        if s is not None and s.state == "inflight" and attempt in (None, s.attempt):
            self.offsets[o] = Off(
                "waiting", s.attempt, s.deferrals + 1, due=now + self.policy.defer_delay
            )
            self.counts["deferred"] += 1

    def release(self, o: int, now: float, attempt: int | None) -> None:
        s = self._live(o)
        if s is not None and s.state == "inflight" and attempt in (None, s.attempt):
            self.offsets[o] = Off("waiting", s.attempt, s.deferrals + 1, due=now)
            self.counts["released"] += 1

    def hold(self, o: int, attempt: int, until: float) -> None:
        s = self._live(o)
        if s is not None and s.state == "inflight" and s.attempt == attempt:
            s.deadline = max(s.deadline, until)

    def gone(self, o: int) -> None:
        """A gap (no record at the offset): counted as gaps, not lost; like a loss, the
        offset is finished without having run, which `how` records as "lost"."""
        if self._live(o) is not None:
            self.offsets[o] = Off("done", how="lost")
            self.counts["gaps"] += 1

    def take_dead_letters(self) -> list[int]:
        out = []
        for o in range(self.base, self.emitted):
            s = self.offsets[o]
            if s.state == "deadletter" and not s.handed:
                s.handed = True
                out.append(o)
        return out

    def dead_lettered(self, offsets: list[int]) -> None:
        for o in offsets:
            s = self._live(o)
            if s is not None and s.state == "deadletter":
                self._finish(o, "dead_lettered")

    def out_of_range(self, low: int, high: int) -> int | None:
        """Returns the new start, or None when nothing was out of range."""
        cp = self.commit_point()
        if not (cp < low or self.emitted > high):
            return None
        kind = self.policy.out_of_range.kind
        assert kind in (PositionKind.EARLIEST, PositionKind.LATEST)
        target = high if kind is PositionKind.LATEST else low
        if self.emitted <= high and cp < target < self.emitted:
            for o in range(cp, target):
                if self.offsets[o].state != "done":
                    self._finish(o, "lost")
            return target
        for o in range(cp, self.emitted):
            if self.offsets[o].state != "done" and (o < target or o >= high):
                self._finish(o, "lost")
        for o in range(self.emitted, target):
            self.offsets[o] = Off("done", how="lost")
            self.counts["lost"] += 1
        # Offsets at and above the new start are forgotten and will be handed out again.
        for o in [o for o in self.offsets if o >= target]:
            del self.offsets[o]
        self.base = self.emitted = target
        self.generation += 1
        return target


__all__ = ["FailReason", "Model"]

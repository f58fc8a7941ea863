"""The failures user code raised, as the driver hears of them: logged, counted, summed up.

A broken handler must not look like success. So the first failure of each kind (exception
type, message and place, `Failure.key`) in each partition is logged at WARNING with its
traceback; later ones of that kind and partition are counted and logged as one line every
`every` seconds ("... again 40 times in the last 10 s"), never one line per record; those
lines group by exception type and place, so messages that name their record (`KeyError('id-1')`,
`KeyError('id-2')`, ...) still make one line per interval and partition. The run's
summary (`summary()`, in every `Progress`) groups them by kind: failed attempts, the records
among them, how many of those were dead-lettered, and the partitions.

It also keeps, per partition, the last failure of each record still unfinished, so that its
dead letter can carry the traceback; a record leaves when its dead letter is written or the
commit point passes it.

Only failures for a record's own fault come here (FAIL with EXCEPTION: user code raised or
failed the tuple). Infrastructure failures (a fetch, an unreachable Kafka a handler writes to)
release their offsets instead, and the partition's breaker reports them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kspout.outcomes import FailReason, Failure, Outcome, OutcomeKind

log = logging.getLogger(__name__)

# Seconds between two "again N times" lines of one kind of failure in one partition: a steady
# stream of failures costs a line per kind, partition and interval, however fast it runs.
REPEAT_EVERY = 10.0
# An exception whose message names the record (`KeyError('id-123')`) makes a new kind per
# record. So tracebacks are logged for at most this many messages of one type and place per
# partition (then they are counted), and the summary keeps at most MAX_KINDS kinds: further
# messages of a type and place are summed up under OTHER_MESSAGES.
TRACEBACKS_PER_PLACE = 3
MAX_KINDS = 100
OTHER_MESSAGES = "(other messages)"

Key = tuple[str, str, str]  # Failure.key: type, message, place
Place = tuple[str, str, int]  # exception type, place, partition: what "again" lines count by


@dataclass(frozen=True, slots=True)
class FailureSummary:
    """One kind of failure over the run so far: a row of the run's summary."""

    failure: Failure  # the first of its kind (its traceback)
    failures: int  # attempts that failed so
    records: int  # distinct records among them
    dead_lettered: int  # records among them whose dead letter was written
    partitions: tuple[int, ...]


@dataclass(slots=True)
class _Unsaid:
    """Failures of one type and place in one partition since the last "again" line."""

    failure: Failure  # the first of them
    count: int = 0
    varied: bool = False  # their messages differ

    def describe(self) -> str:
        if not self.varied:
            return str(self.failure)
        where = f" at {self.failure.place}" if self.failure.place else ""
        return f"{self.failure.kind} (several messages){where}"


@dataclass(slots=True)
class _Kind:
    failure: Failure
    failures: int = 0
    records: int = 0
    dead_lettered: int = 0
    partitions: set[int] = field(default_factory=set)


class FailureLog:
    """Logs, counts and remembers the failures of one driver's partitions."""

    def __init__(self, topic: str, clock: Callable[[], float], every: float = REPEAT_EVERY) -> None:
        self._topic = topic
        self._clock = clock
        self._every = every
        self._kinds: dict[Key, _Kind] = {}
        self._logged: set[tuple[Key, int]] = set()  # (kind, partition) logged with a traceback
        self._tracebacks: dict[Place, int] = {}  # tracebacks logged
        self._unsaid: dict[Place, _Unsaid] = {}  # failures since the last "again" line
        self._said_at = clock()
        # partition -> offset -> its last failure, and the kind it was counted under
        self._open: dict[int, dict[int, tuple[Failure, _Kind]]] = {}

    @property
    def records(self) -> int:
        """Records that failed so far (each counted once per kind of failure)."""
        return sum(kind.records for kind in self._kinds.values())

    def record(self, partition: int, outcomes: Iterable[Outcome]) -> None:
        """Take in a result's outcomes: count, and log, every failure for the record's fault."""
        for outcome in outcomes:
            if outcome.kind is OutcomeKind.FAIL and outcome.reason is FailReason.EXCEPTION:
                self._failed(partition, outcome)

    def _failed(self, partition: int, outcome: Outcome) -> None:
        failure = outcome.failure or Failure("", outcome.error or "failed", "", "")
        kind = self._kind_of(failure)
        kind.failures += outcome.count
        kind.partitions.add(partition)
        open_ = self._open.setdefault(partition, {})
        for offset in range(outcome.offset, outcome.offset + outcome.count):
            last = open_.get(offset)
            if last is None or last[1] is not kind:
                kind.records += 1
            open_[offset] = (failure, kind)
        where = (kind.failure.key, partition)
        place = (failure.kind, failure.place, partition)
        if where in self._logged or self._tracebacks.get(place, 0) >= TRACEBACKS_PER_PLACE:
            unsaid = self._unsaid.get(place)
            if unsaid is None:
                unsaid = self._unsaid[place] = _Unsaid(failure)
            unsaid.count += outcome.count
            unsaid.varied = unsaid.varied or failure.message != unsaid.failure.message
            return
        self._logged.add(where)
        self._tracebacks[place] = self._tracebacks.get(place, 0) + 1
        log.warning(
            "%s[%d] offset %d failed (attempt %s): %s%s",
            self._topic,
            partition,
            outcome.offset,
            outcome.attempt if outcome.attempt is not None else "?",
            failure,
            f"\n{failure.traceback.rstrip()}" if failure.traceback else "",
        )

    def _kind_of(self, failure: Failure) -> _Kind:
        """The kind `failure` is counted under (made on first sight, up to MAX_KINDS)."""
        kind = self._kinds.get(failure.key)
        if kind is None:
            if len(self._kinds) >= MAX_KINDS:
                other = Failure(failure.kind, OTHER_MESSAGES, failure.place, failure.traceback)
                kind = self._kinds.get(other.key)
                if kind is not None:
                    return kind
                failure = other
            kind = self._kinds[failure.key] = _Kind(failure)
        return kind

    def tick(self, *, final: bool = False) -> None:
        """Log the failures counted since the last line, once `every` seconds passed (`final`:
        now, at the end of a run)."""
        now = self._clock()
        if not self._unsaid or (not final and now - self._said_at < self._every):
            return
        for (_type, _place, partition), unsaid in sorted(
            self._unsaid.items(), key=lambda item: item[0][2]
        ):
            log.warning(
                "%s: %s again %d %s in the last %.0f s, partition %d",
                self._topic,
                unsaid.describe(),
                unsaid.count,
                "time" if unsaid.count == 1 else "times",
                now - self._said_at,
                partition,
            )
        self._unsaid.clear()
        self._said_at = now

    def tracebacks(self, partition: int, offsets: Iterable[int]) -> dict[int, str]:
        """The traceback of each offset's last failure, for its dead letter."""
        open_ = self._open.get(partition, {})
        found = {offset: open_.get(offset) for offset in offsets}
        return {o: f[0].traceback for o, f in found.items() if f is not None and f[0].traceback}

    def dead_lettered(self, partition: int, offsets: Iterable[int]) -> None:
        """These offsets' dead letters are written: count them under their last failure."""
        open_ = self._open.get(partition, {})
        for offset in offsets:
            last = open_.pop(offset, None)
            if last is not None:
                last[1].dead_lettered += 1

    def finished_below(self, commit_points: Mapping[int, int]) -> None:
        """Forget the records below each partition's commit point: they are finished."""
        for partition, point in commit_points.items():
            open_ = self._open.get(partition)
            if open_:
                for offset in [o for o in open_ if o < point]:
                    del open_[offset]

    def drop(self, partition: int) -> None:
        """The partition moved to another instance: its records are no longer ours."""
        self._open.pop(partition, None)

    def summary(self) -> list[FailureSummary]:
        """Every kind of failure so far, the most frequent first."""
        kinds = sorted(self._kinds.values(), key=lambda k: -k.failures)
        return [
            FailureSummary(
                k.failure, k.failures, k.records, k.dead_lettered, tuple(sorted(k.partitions))
            )
            for k in kinds
        ]

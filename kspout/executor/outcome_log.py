"""One task's outcomes as the executor writes them: acks folded into counted runs."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from kspout.contract import PartitionTask
from kspout.errors import KafkaUnavailable
from kspout.outcomes import (
    FailReason,
    Failure,
    FailureCatalog,
    Outcome,
    OutcomeKind,
    describe_error,
)

_ACK, _FAIL, _GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
_RELEASED = OutcomeKind.RELEASED


class OutcomeLog:
    """One task's outcomes, with consecutive acks at one attempt folded into counted runs.

    A clean span then costs one small record on its way to the driver, not one per message.
    Offsets must be reported in ascending order.
    """

    __slots__ = ("_attempt", "_attempt_of", "_end", "_failures", "_outcomes", "_spans", "_start")

    def __init__(self, task: PartitionTask) -> None:
        self._spans = task.plan.spans
        self._attempt_of = task.attempt_lookup()
        self._outcomes: list[Outcome] = []
        self._failures = FailureCatalog()
        self._start = self._end = self._attempt = -1  # the run of acks not yet written

    def ack_run(self, lo: int, hi: int) -> None:
        """Ack the consecutive offsets `[lo, hi)`, looking attempts up per span, not per offset."""
        spans = self._spans
        i = bisect_right(spans, lo, key=lambda span: span.start) - 1
        while lo < hi:
            span = spans[i]
            end = min(hi, span.end)
            self._extend(lo, end, span.attempt)
            lo, i = end, i + 1

    def _extend(self, lo: int, hi: int, attempt: int) -> None:
        if lo == self._end and attempt == self._attempt:
            self._end = hi
            return
        self._flush()
        self._start, self._end, self._attempt = lo, hi, attempt

    @property
    def outcomes(self) -> list[Outcome]:
        """The outcomes written so far (grows while the task runs; not sorted until
        `finish`). The task's reporter thread reads it to stream failures early."""
        return self._outcomes

    def fail(self, offset: int, exc: Exception) -> None:
        """A failure with EXCEPTION: user code raised `exc` (its type, message, place and
        traceback go with the outcome)."""
        failure = self._failures.of(exc)
        self._outcomes.append(
            Outcome(
                offset,
                _FAIL,
                self._attempt_of(offset),
                FailReason.EXCEPTION,
                failure.description,  # describe_error's text, made once per kind
                failure=failure,
            )
        )

    def release(self, offset: int, exc: KafkaUnavailable) -> str:
        """User code met an outage of a Kafka it writes to: RELEASED, no attempt spent.
        Returns the error text, for the partition's breaker."""
        error = describe_error(exc)
        self.add(offset, _RELEASED, None, error)
        return error

    def add(
        self,
        offset: int,
        kind: OutcomeKind,
        reason: FailReason | None,
        error: str | Failure | None,
    ) -> None:
        """Any outcome but an ack, at the attempt the plan gave `offset` (`error`: a text, or
        what user code raised)."""
        attempt = self._attempt_of(offset)
        if isinstance(error, Failure):
            outcome = Outcome(offset, kind, attempt, reason, error.description, failure=error)
        else:
            outcome = Outcome(offset, kind, attempt, reason, error)
        self._outcomes.append(outcome)

    def finish(self, missing: Sequence[tuple[int, int]]) -> list[Outcome]:
        """Every outcome, ascending, with `missing` ranges reported GONE."""
        self._flush()
        outcomes = self._outcomes
        outcomes.extend(Outcome(lo, _GONE, count=hi - lo) for lo, hi in missing)
        outcomes.sort(key=lambda o: o.offset)
        return outcomes

    def _flush(self) -> None:
        if self._end > self._start:
            count = self._end - self._start
            self._outcomes.append(Outcome(self._start, _ACK, self._attempt, count=count))
            self._start = self._end

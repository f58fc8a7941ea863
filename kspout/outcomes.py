"""What happened to one root message: the small record executors send back to the driver."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FailReason(enum.Enum):
    """Why a root message failed; the two cases need different handling downstream."""

    EXCEPTION = "exception"  # user code raised: the attempt is over, retry within the budget
    TIMEOUT = "timeout"  # not completed within message_timeout: the original may still run
    INVALID = "invalid"  # the message itself cannot be processed (no id, undecodable): no retry
    CRASH = "crash"  # the message killed its Python worker, proven by running it alone


class OutcomeKind(enum.Enum):
    ACK = "ack"  # fully processed
    FAIL = "fail"  # failed with a FailReason
    DUPLICATE = "duplicate"  # the dedup bolt found it already done: counts as an ack
    DEFERRED = "deferred"  # in flight elsewhere (dedup lease): retry later, no attempt spent
    GONE = "gone"  # the offset no longer exists in Kafka (retention, compaction, markers)
    RELEASED = "released"  # not settled for a reason outside the message (infrastructure):
    # offered again without spending an attempt, once the partition's breaker allows


@dataclass(frozen=True, slots=True)
class Outcome:
    """The outcome of one attempt at offsets `[offset, offset + count)`.

    `attempt` names the attempt the outcome belongs to (as planned); `None` means "whatever
    attempt is current", for callers that do not track attempts. `count` lets an executor
    report a run of alike outcomes (typically a whole span acked) as one small record instead
    of one object per message.
    """

    offset: int
    kind: OutcomeKind
    attempt: int | None = None
    reason: FailReason | None = None
    error: str | None = None
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"an outcome covers at least one offset, got count={self.count}")
        if (self.kind is OutcomeKind.FAIL) != (self.reason is not None):
            raise ValueError("a FAIL outcome needs a reason, and only a FAIL outcome has one")


def describe_error(exc: BaseException) -> str:
    """A one-line error for outcomes and dead-letter headers."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__

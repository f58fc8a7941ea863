"""Per-partition policies as plain frozen values: what the PartitionManager obeys.

These carry no I/O and no client types, so the PartitionManager stays pure logic; `config`
builds them from a topic file.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class BehindPolicy(enum.Enum):
    """What happens to an unfinished offset that falls more than `max_offset_behind` behind."""

    RETRY = "retry"  # never give up: keep retrying it (the commit point waits)
    DEAD_LETTER = "dead_letter"  # write it to the dead-letter topic, then count it finished
    SKIP = "skip"  # count it as skipped and move on


class ExhaustedPolicy(enum.Enum):
    """What happens to an offset whose retry budget is spent."""

    DEAD_LETTER = "dead_letter"
    SKIP = "skip"


class PositionKind(enum.StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a partition chosen by rule: `earliest`, `latest`, `timestamp:<ms>`, `fail`."""

    kind: PositionKind
    timestamp_ms: int | None = None

    @classmethod
    def parse(cls, text: str, *, allow_fail: bool) -> Position:
        """Parse `earliest | latest | timestamp:<ms>` (and `fail` where allowed)."""
        value = text.strip().lower()
        if value.startswith("timestamp:"):
            raw = value.split(":", 1)[1]
            if not raw.isdigit():
                raise ValueError(f"timestamp must be milliseconds since the epoch, got {raw!r}")
            return cls(PositionKind.TIMESTAMP, int(raw))
        allowed = {"earliest", "latest"} | ({"fail"} if allow_fail else set())
        if value not in allowed:
            choices = ", ".join(sorted(allowed)) + " or timestamp:<ms>"
            raise ValueError(f"must be {choices}, got {text!r}")
        return cls(PositionKind(value))

    def __str__(self) -> str:
        if self.kind is PositionKind.TIMESTAMP:
            return f"timestamp:{self.timestamp_ms}"
        return str(self.kind.value)


# The power `multiplier**(n-1)` is compared with the cap in log space and computed only below
# it and below 1e300, so no retry count and no multiplier >= 1 overflows a float. Once the power
# passes 1e300 the delay is `max`: only a `max` above 1e300 times `initial` would tell the
# difference, and no real backoff has one.
_LOG_POWER_LIMIT = 300 * math.log(10)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential retry delay: `initial * multiplier**(n-1)`, capped at `max`, for retry n."""

    initial: float = 0.5
    multiplier: float = 2.0
    max: float = 60.0

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1 for the first retry); any count."""
        if retry <= 0:
            return 0.0
        if self.initial >= self.max:
            return self.max
        if self.initial <= 0:
            return 0.0
        growth = (retry - 1) * math.log(self.multiplier)  # log of the power, never overflows
        if growth >= min(_LOG_POWER_LIMIT, math.log(self.max / self.initial)):
            return self.max
        return min(self.max, self.initial * self.multiplier ** (retry - 1))


@dataclass(frozen=True, slots=True)
class PartitionPolicy:
    """Everything a PartitionManager decides by. Defaults follow storm-kafka where sensible.

    There is deliberately no failure-rate rule (storm-kafka 0.9.3 threw when more than
    `maxOffsetBehind` offsets failed without an ack): each failing offset is governed by its
    own retry budget and by `max_offset_behind`, never by how many others failed.
    """

    max_retries: int | None = 5  # None: unlimited (storm-kafka's retryLimit -1), never exhausted
    backoff: Backoff = Backoff()
    on_exhausted: ExhaustedPolicy = ExhaustedPolicy.DEAD_LETTER
    max_offset_behind: int | None = None
    behind_policy: BehindPolicy = BehindPolicy.RETRY
    message_timeout: float = 30.0
    # How far a partition may run ahead of a stuck commit point (README: the dedup window).
    max_uncommitted: int | None = 1_000_000
    out_of_range: Position = Position(PositionKind.EARLIEST)
    # Wait before a DEFERRED offset (in flight elsewhere) is offered again; no attempt is spent.
    defer_delay: float = 1.0

    def exhausted(self, spent: int) -> bool:
        """True once `spent` charged attempts exceed the retry budget; never when unlimited."""
        return self.max_retries is not None and spent > self.max_retries

"""Value types of the store (leases, settlements, records), and the decoding of script replies."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice, repeat
from typing import Any, NamedTuple

from dedup.scripts import REJECTED_RUN, SettleCode


class LeaseStatus(enum.Enum):
    LEASED = "leased"  # run the user code with `token`; settle it afterwards
    DUPLICATE = "duplicate"  # already DONE: ack without running user code
    # a live lease elsewhere, or DONE but not yet acknowledged by the replicas asked for: retry
    # after `retry_after_ms`, no attempt spent
    DEFERRED = "deferred"
    REJECTED = "rejected"  # the id's key holds something else: nothing changed, see `error`


class Lease(NamedTuple):
    """One id's answer to `lease`; `token` and `attempts` are 0 unless LEASED."""

    status: LeaseStatus
    token: int
    attempts: int
    retry_after_ms: int  # DEFERRED: when the other owner's lease ends, else 0
    error: str | None = None  # REJECTED: why


class LeaseRun(NamedTuple):
    """Consecutive ids of one `lease_runs` call with one answer, counted: a batch of new ids is
    one run, and DUPLICATE and DEFERRED replays cost no object per id."""

    status: LeaseStatus
    start: int  # the position of the run's first id in the call's ids
    length: int  # how many ids
    token: int  # LEASED: the token of every id of the run (one per call, fresh per lease)
    attempts: int  # LEASED: the attempt all the run's ids are at
    retry_after_ms: int  # DEFERRED: when the last of the run's other leases ends, else 0
    errors: tuple[str, ...] = ()  # REJECTED: why, one per id


def expand(runs: Sequence[LeaseRun]) -> list[Lease]:
    """One `Lease` per id of the runs, in order (the runs cover positions 0..n-1)."""
    out: list[Lease] = []
    for status, _, length, token, attempts, retry, errors in runs:
        if status is _LEASED:
            out += repeat(Lease(_LEASED, token, attempts, 0), length)
        elif status is _DUP:
            out += repeat(_DUPLICATE, length)
        elif status is _DEFERRED:
            out += repeat(Lease(_DEFERRED, 0, 0, retry), length)
        else:
            out += (Lease(status, 0, 0, 0, error) for error in errors)
    return out


class SettleStatus(enum.Enum):
    SETTLED = "settled"  # the record is now DONE (effects applied) or FAILED
    STALE = "stale"  # another lease holds the record, or it was already settled: nothing changed
    LOST = "lost"  # no record (expired, or Redis lost it): nothing changed
    # an effect would fail in Redis (none applied, record FAILED with why), or the record's key
    # holds another type (nothing changed)
    REJECTED = "rejected"


class SettleResult(NamedTuple):
    """One item's answer to `settle`."""

    status: SettleStatus
    error: str | None = None  # REJECTED: why


Effect = Sequence[str | bytes | int | float]
"""A Redis write command, e.g. `("HINCRBY", key, field, 1)`; see `ALLOWED_EFFECTS`."""


class Settlement(NamedTuple):
    """How one leased id ended: DONE (`done=True`, with optional `effects`) or FAILED (`error`).

    `attempts` is what the lease answered with `token`: with it, settling takes one Redis
    command per id; 0 (unknown) costs a second one."""

    id: str
    token: int
    done: bool
    error: str | None = None
    effects: Sequence[Effect] = ()
    attempts: int = 0


class IdRecordState(enum.Enum):
    IN_FLIGHT = "I"
    DONE = "D"
    FAILED = "F"


@dataclass(frozen=True, slots=True)
class IdRecord:
    """A decoded idempotency record, for inspection; owner and lease only while IN_FLIGHT."""

    state: IdRecordState
    token: int
    attempts: int
    owner: str | None = None
    lease_deadline_ms: int | None = None
    error: str | None = None

    @classmethod
    def decode(cls, raw: bytes) -> IdRecord:
        state = IdRecordState(raw[:1].decode())
        if state is IdRecordState.IN_FLIGHT:
            token, attempts, deadline, _, owner = raw[2:].split(b":", 4)  # _: ids leased
            return cls(state, int(token, 16), int(attempts), owner.decode(), int(deadline))
        if state is IdRecordState.DONE:
            token, attempts = raw[2:].split(b":")
            return cls(state, int(token, 16), int(attempts))
        token, attempts, error = raw[2:].split(b":", 2)
        return cls(state, int(token, 16), int(attempts), error=error.decode())


# a settle reply's digit (a byte) -> its result (SettleCode's names are SettleStatus's)
_RESULT_BY_DIGIT = {
    ord(str(int(code))): SettleResult(SettleStatus[code.name]) for code in SettleCode
}
_REJECTED_DIGIT = ord(str(int(SettleCode.REJECTED)))
SETTLED = SettleResult(SettleStatus.SETTLED)
_DUPLICATE = Lease(LeaseStatus.DUPLICATE, 0, 0, 0, None)
_LEASED = LeaseStatus.LEASED
_DEFERRED = LeaseStatus.DEFERRED
_DUP = LeaseStatus.DUPLICATE
_REJECTED = LeaseStatus.REJECTED


def decode_lease_runs(
    first: int, codes: bytes | str, reasons: Sequence[bytes | str]
) -> list[LeaseRun]:
    """Decode the lease script's runs (`<code>:<count>` joined by ','; the codes:
    `dedup.scripts.REJECTED_RUN`); the LEASED ids have token `first + 1`; `reasons` are the
    REJECTED ids' errors."""
    text = codes.decode() if isinstance(codes, bytes) else codes
    errors = map(_decoded, reasons)
    runs: list[LeaseRun] = []
    start = 0
    for part in text.split(","):
        code, _, counted = part.partition(":")
        count = int(counted)
        if code == REJECTED_RUN:
            runs.append(LeaseRun(_REJECTED, start, count, 0, 0, 0, tuple(islice(errors, count))))
        elif (value := int(code)) > 0:
            runs.append(LeaseRun(_LEASED, start, count, first + 1, value, 0))
        elif value == 0:
            runs.append(LeaseRun(_DUP, start, count, 0, 0, 0))
        else:
            runs.append(LeaseRun(_DEFERRED, start, count, 0, 0, -value))
        start += count
    return runs


def remap_runs(runs: Sequence[LeaseRun], positions: list[int]) -> list[LeaseRun]:
    """Runs over a shard's ids (the ids at `positions` of a call) as runs over the call's
    positions: a run is cut where the positions are not consecutive."""
    out: list[LeaseRun] = []
    for run in runs:
        k = 0
        while k < run.length:
            first = positions[run.start + k]
            j = k + 1
            while j < run.length and positions[run.start + j] == first + j - k:
                j += 1
            out.append(run._replace(start=first, length=j - k, errors=run.errors[k:j]))
            k = j
    return out


def decode_settle_results(reply: list[Any], n: int) -> list[SettleResult]:
    """Decode a settle script's reply for `n` items."""
    digits, reasons = reply
    raw = digits.encode() if isinstance(digits, str) else digits
    if not raw:
        return [SETTLED] * n
    results = [_RESULT_BY_DIGIT[digit] for digit in raw]
    if reasons:
        errors = map(text, reasons)
        results = [
            SettleResult(r.status, next(errors)) if d == _REJECTED_DIGIT else r
            for d, r in zip(raw, results, strict=True)
        ]
    return results


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def text(value: object) -> str | None:
    """A reply's value as text (bytes decoded), None as None."""
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)

"""What happened to one root message: the small record executors send back to the driver."""

from __future__ import annotations

import enum
import functools
import os
import sysconfig
import traceback
from dataclasses import dataclass, field
from types import TracebackType


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
    # What user code raised, for an EXCEPTION failure: a detail of `error`, not compared.
    failure: Failure | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"an outcome covers at least one offset, got count={self.count}")
        if (self.kind is OutcomeKind.FAIL) != (self.reason is not None):
            raise ValueError("a FAIL outcome needs a reason, and only a FAIL outcome has one")


def describe_error(exc: BaseException) -> str:
    """A one-line error for outcomes and dead-letter headers."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


# Tracebacks are cut to this many characters (their end kept: the innermost frames and the
# exception): enough for a deep stack, small enough for a log line and a Kafka header.
TRACEBACK_LIMIT = 4000
# Frames in these directories are library code, not the user's: kspout's own, the standard
# library's, installed packages'. A failure's place is the innermost frame outside them.
_LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(path), "")
    for path in {
        os.path.dirname(os.path.abspath(__file__)),
        *(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
)


@dataclass(frozen=True, slots=True)
class Failure:
    """What user code raised for a record: its type, message and place, and the traceback.

    `key` (type, message, place) groups alike failures in logs and the run's summary; the
    traceback goes with the first of each kind to the log and with every dead letter.
    """

    kind: str  # the exception's class name
    message: str  # the first line of its text
    place: str  # `file.py:line` of the innermost frame in user code; "" when unknown
    traceback: str  # the formatted traceback, at most TRACEBACK_LIMIT characters

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.message, self.place

    @property
    def description(self) -> str:
        """The one-line error `describe_error` gives the exception: `RuntimeError: boom`."""
        return f"{self.kind}: {self.message}" if self.message else self.kind

    def __str__(self) -> str:
        """`RuntimeError('always broken') at raiser.py:3` (a bolt's own text when it failed a
        tuple without an exception)."""
        if not self.kind:
            return self.message
        where = f" at {self.place}" if self.place else ""
        return f"{self.kind}({self.message!r}){where}"


class FailureCatalog:
    """Turns exceptions into `Failure`s, one object per kind: a task reports a thousand alike
    failures with one traceback (pickle sends a shared object once), and formats it once."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, str], Failure] = {}

    def of(self, exc: BaseException) -> Failure:
        text = str(exc).strip()
        key = (type(exc).__name__, text.splitlines()[0] if text else "", _place(exc.__traceback__))
        failure = self._known.get(key)
        if failure is None:
            formatted = "".join(traceback.format_exception(type(exc), exc, _from_user(exc)))
            if len(formatted) > TRACEBACK_LIMIT:
                formatted = "...\n" + formatted[-TRACEBACK_LIMIT:]
            failure = self._known[key] = Failure(*key, formatted)
        return failure


def _from_user(exc: BaseException) -> TracebackType | None:
    """`exc`'s traceback without the library frames that called user code (kspout's loop)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _is_library(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _place(tb: TracebackType | None) -> str:
    """`file.py:line` of the innermost frame outside library code (else the innermost)."""
    inner = user = None
    while tb is not None:
        inner = tb
        if not _is_library(tb.tb_frame.f_code.co_filename):
            user = tb
        tb = tb.tb_next
    found = user or inner
    if found is None:
        return ""
    return f"{os.path.basename(found.tb_frame.f_code.co_filename)}:{found.tb_lineno}"


@functools.lru_cache(maxsize=1024)
def _is_library(path: str) -> bool:
    return os.path.realpath(path).startswith(_LIBRARY_DIRS)

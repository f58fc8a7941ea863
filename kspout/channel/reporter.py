"""Executor side of the outcome channel: a thread per task that sends `Beat`s to the driver.

One connection per Python worker and driver address, opened on first use and reused by every
later task the worker runs (Spark reuses Python workers). Sending never raises into the task:
a driver that cannot be reached disables reporting for this worker with one warning, and the
task's results still return through Spark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from types import TracebackType

from kspout.channel.beacon import thread_beacon
from kspout.contract import Beat, ChannelAddress, Final, Message, RootKey, TaskId, TaskResult
from kspout.outcomes import Outcome, OutcomeKind
from kspout.worker_clients import WorkerClients

log = logging.getLogger(__name__)

# Seconds between beats: the precision of per-message timeouts and of "which record was it on".
BEAT_INTERVAL = 0.2


class _Link:
    """This worker's connection to one driver listener; thread-safe sends."""

    def __init__(self, address: ChannelAddress) -> None:
        self._address = address
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self.broken = False

    def send(self, message: Message) -> None:
        if self.broken:
            return
        with self._lock:
            try:
                if self._conn is None:
                    a = self._address
                    self._conn = Client((a.host, a.port), authkey=a.authkey)
                self._conn.send(message)
            except (OSError, EOFError, ValueError) as exc:
                self.broken = True
                log.warning(
                    "outcome channel to %r lost (%s): results return with the job",
                    self._address,
                    exc,
                )


_links = WorkerClients(_Link, usable=lambda link: not link.broken)


def root_of(current: object) -> RootKey | None:
    """The root key of what a beacon holds: a Record, a Tuple, or None."""
    if current is None:
        return None
    roots = getattr(current, "roots", None)
    if roots is not None:  # a Tuple: its first root (an unanchored tuple has none)
        return next(iter(roots), None)
    return (current.partition, current.offset)  # type: ignore[attr-defined]


class TaskReporter:
    """Beats for one task, from a daemon thread, while the task runs (a context manager).

    The task's thread sets its beacon's `current` per record; for a plain handler it also
    passes the growing outcome list (`watch_outcomes`) so settled offsets stream early.
    """

    def __init__(
        self,
        address: ChannelAddress | None,
        task: TaskId,
        partition: int | None = None,
        *,
        interval: float = BEAT_INTERVAL,
    ) -> None:
        self._link = _links.get(address) if address is not None else None
        self._task = task
        self._partition = partition
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._outcomes: Sequence[Outcome] | None = None
        self._missing: tuple[tuple[int, int], ...] | None = None
        self._missing_sent = False
        self._sent = 0  # outcomes[:_sent] were reported
        self._seen: object = None
        self._since = time.monotonic()
        self._beacon = thread_beacon()  # the thread that runs the task makes the reporter

    def __enter__(self) -> TaskReporter:
        self._beacon.current = None
        if self._link is not None:
            self._thread = threading.Thread(target=self._run, name="kspout-beat", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._beacon.current = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._link is not None:
                self._link.send(self._beat(done=True))

    def fetched(self, missing: Sequence[tuple[int, int]], outcomes: Sequence[Outcome]) -> None:
        """The fetch is done: report `missing` once, and stream `outcomes` as it grows."""
        self._missing = tuple(missing)
        self._outcomes = outcomes

    def final(self, results: Sequence[TaskResult]) -> None:
        """Send the task's final results now (the job may still run for a while)."""
        if self._link is not None:
            self._link.send(Final(self._task.batch, tuple(results)))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            assert self._link is not None
            self._link.send(self._beat(done=False))
            if self._link.broken:
                return

    def _beat(self, *, done: bool) -> Beat:
        now = time.monotonic()
        current = self._beacon.current  # read before the outcomes: all of them below it are final
        if current is not self._seen:
            self._seen, self._since = current, now
        root = root_of(current)
        missing = None
        if self._missing is not None and not self._missing_sent:
            missing, self._missing_sent = self._missing, True
        upto, failures = self._settled_below(root)
        return Beat(
            self._task,
            self._partition,
            root,
            now - self._since,
            upto,
            failures,
            missing,
            done,
        )

    def _settled_below(self, root: RootKey | None) -> tuple[int | None, tuple[Outcome, ...]]:
        """`upto` and the non-ack outcomes below it not reported yet (plain handlers only)."""
        outcomes = self._outcomes
        if outcomes is None or root is None:
            return None, ()
        upto = root[1]
        snapshot = outcomes[self._sent :]
        failures = []
        for outcome in snapshot:
            if outcome.offset >= upto:
                break
            if outcome.kind is not OutcomeKind.ACK:
                failures.append(outcome)
            self._sent += 1
        return upto, tuple(failures)

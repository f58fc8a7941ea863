"""Dead letters written off the driver's thread, so a slow or unreachable DLQ never stalls it.

The driver takes `DeadLetterTicket`s from a partition's `PartitionManager` and `submit`s them
here; the call returns at once. A background thread turns each submission (a *job*: one
partition's tickets) into dead letters: it coalesces the offsets into contiguous runs, fetches
their payloads in one `PartitionFetcher.fetch` call, builds one `DeadLetter` per ticket (with the
original record, or none when Kafka no longer has it) and writes them with
`DeadLetterWriter.write`, which returns once Kafka acknowledged every letter. The job's result
waits as a `DeadLetterOutcome` until the driver collects it with `completed()` and confirms the
offsets on the partition manager: `dead_lettered(offsets)` when `error` is None (the letters are
durable, the offsets finished), `dead_letter_failed(offsets)` otherwise (handed out again later;
when Kafka refused the principal the write or the payloads' fetch, `refused` carries the error
that stops the run).

Thread model:

* The driver thread calls `start`, `submit`, `completed`, `pending`, `wait` and `close`. Only
  the driver thread applies outcomes to its partition managers, which are not thread-safe: the
  worker never sees one, it only reads the immutable tickets it was given.
* One daemon worker thread owns the fetcher and the writer (confluent-kafka clients) from
  `start` on, runs one job at a time in submission order, and closes both clients when it ends.
* The two share a queue of jobs and a list of finished outcomes under one lock, held only for
  bookkeeping, never across I/O: `submit` and `completed` never block on Kafka.

Every submitted ticket gets exactly one outcome. A failure of the fetch or the write fails only
its job (all its offsets, with the error); the thread goes on with the next. `close` lets the job
in hand finish (for at most `close_timeout` seconds), abandons the queued ones and reports them
failed with `CLOSED`; unconfirmed offsets are never committed past, so they are dead-lettered
again after a restart. A job that finishes after `close` gave up on it is still reported failed,
even if its letters reached Kafka: a dead letter may be written twice, never lost.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kspout.config import TopicConfig
from kspout.errors import KafkaRefused
from kspout.kafka import DeadLetter, DeadLetterWriter, PartitionFetcher, Record
from kspout.kafka.deadletter import FLUSH_MARGIN
from kspout.lifecycle import Lifecycle
from kspout.outcomes import describe_error
from kspout.partition_manager import DeadLetterTicket
from kspout.ranges import runs

log = logging.getLogger(__name__)

CLOSED = "dead-letter writer closed"  # the error of tickets abandoned by `close`
# Fetches per job: the first learns Kafka's (low, high) when an offset is out of range, the
# second reads what is left inside it, a third covers retention moving low in between. Each is
# bounded by fetch_timeout.
MAX_FETCHES = 3


@dataclass(frozen=True, slots=True)
class DeadLetterOutcome:
    """What became of one submission: `error` None means every letter is written and durable."""

    partition: int
    offsets: tuple[int, ...]  # ascending, each once
    error: str | None
    refused: KafkaRefused | None = None  # with `error`: a refusal no retry cures


def offset_runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Offsets (any order, repeats allowed) as sorted, disjoint half-open runs `[lo, hi)`."""
    return list(runs(sorted(set(offsets))))


@dataclass(slots=True)
class _Job:
    partition: int
    tickets: tuple[DeadLetterTicket, ...]  # ascending by offset, one per offset
    tracebacks: Mapping[int, str]  # by offset, where user code raised
    settled: bool = False  # its outcome has been posted (exactly once)

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(t.offset for t in self.tickets)


class DeadLetterWorker(Lifecycle):
    """Writes dead letters on a background thread; the driver submits tickets and collects
    outcomes without waiting for Kafka.

    Construct (no I/O), `start()` (starts the clients and the thread), `submit()` per partition,
    `completed()` every step, `wait()` to drain before a final commit, `close()`.

    States of a job, each moved under the lock:

    * queued: `submit` appended it; `close` turns it into a failed outcome (`CLOSED`).
    * in hand: the thread took it and fetches, then writes, without the lock.
    * finished: its outcome (written, or the error) waits in the outcome list. If `close` gave
      up waiting for it, its outcome was already posted as `CLOSED` and the late one is dropped.
    * reported: `completed()` returned it; it no longer counts in `pending`.

    `fetcher` and `writer` default to real clients of `config`; tests inject others.
    `close_timeout` bounds how long `close` waits for the job in hand (default: one
    `fetch_timeout` plus the writer's flush margin).
    """

    def __init__(
        self,
        config: TopicConfig,
        *,
        fetcher: PartitionFetcher | None = None,
        writer: DeadLetterWriter | None = None,
        close_timeout: float | None = None,
    ) -> None:
        self._config = config
        self._fetcher = fetcher if fetcher is not None else PartitionFetcher(config)
        self._writer = writer if writer is not None else DeadLetterWriter(config)
        self._close_timeout = (
            close_timeout if close_timeout is not None else config.fetch_timeout + FLUSH_MARGIN
        )
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._current: _Job | None = None
        self._outcomes: list[DeadLetterOutcome] = []
        self._pending = 0  # tickets submitted, not yet returned by completed()
        self._unsettled = 0  # tickets submitted with no outcome yet
        self._thread: threading.Thread | None = None
        self._closing = False
        self._stopped: str | None = None  # set when the thread ended: why

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the fetcher, the writer and the worker thread (again: no effect)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("DeadLetterWorker was closed; create a new one")
            if self._thread is not None:
                return
        self._fetcher.start()
        self._writer.start()
        thread = threading.Thread(
            target=self._work, name=f"kspout-dead-letters-{self._config.topic}", daemon=True
        )
        self._thread = thread
        thread.start()

    def close(self) -> None:
        """Stop: finish the job in hand (at most `close_timeout` seconds), abandon queued ones.

        Abandoned tickets are reported failed (`CLOSED`) by the next `completed()`. When the job
        in hand outlasts `close_timeout` (Kafka unreachable), it is reported failed too and the
        thread finishes it in the background, then closes the clients itself.
        """
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._abandon_queued(CLOSED)
            self._cond.notify_all()
            thread = self._thread
        if thread is None:  # never started (or start failed half-way): close what exists
            self._close_clients()
            return
        thread.join(self._close_timeout)
        if thread.is_alive():
            with self._cond:
                if self._current is not None:
                    self._post(self._current, CLOSED)
            log.warning(
                "%s: a dead-letter write still runs after %.1fs; its offsets are reported "
                "failed and written again later; the write finishes in the background",
                self._config.topic,
                self._close_timeout,
            )

    # -- the driver's side -------------------------------------------------------------------

    def submit(
        self,
        partition: int,
        tickets: Sequence[DeadLetterTicket],
        tracebacks: Mapping[int, str] | None = None,
    ) -> None:
        """Queue one partition's tickets for writing, with the tracebacks of those whose user
        code raised (by offset); returns at once, never raises.

        After `close` (or if the worker thread died) the tickets are reported failed at once.
        """
        if not tickets:
            return
        by_offset: dict[int, DeadLetterTicket] = {}
        for ticket in tickets:
            by_offset.setdefault(ticket.offset, ticket)
        job = _Job(partition, tuple(by_offset[o] for o in sorted(by_offset)), tracebacks or {})
        with self._cond:
            self._pending += len(job.tickets)
            self._unsettled += len(job.tickets)
            if self._closing or self._stopped is not None:
                self._post(job, self._stopped or CLOSED)
                return
            self._queue.append(job)
            self._cond.notify_all()

    def completed(self) -> list[DeadLetterOutcome]:
        """The outcomes finished since the last call, in the order they finished; never blocks
        on Kafka. The caller confirms each on its partition manager."""
        with self._cond:
            done, self._outcomes = self._outcomes, []
            self._pending -= sum(len(o.offsets) for o in done)
        return done

    @property
    def pending(self) -> int:
        """Tickets submitted and not yet returned by `completed()`."""
        with self._cond:
            return self._pending

    def wait(self, timeout: float) -> bool:
        """Block until every submitted ticket has an outcome ready for `completed()`, or
        `timeout` seconds passed; True when nothing is left to write."""
        with self._cond:
            return self._cond.wait_for(lambda: self._unsettled == 0, timeout)

    # -- the worker thread -------------------------------------------------------------------

    def _work(self) -> None:
        reason = CLOSED
        job: _Job | None = None
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._closing:
                        self._cond.wait()
                    if self._closing:
                        return
                    job = self._current = self._queue.popleft()
                error, refused = self._write(job)
                with self._cond:
                    self._post(job, error, refused)
                    self._current = job = None
        except BaseException as exc:  # a bug: fail everything rather than hang the driver
            reason = f"dead-letter worker stopped: {describe_error(exc)}"
            log.exception("%s: the dead-letter worker stopped", self._config.topic)
        finally:
            with self._cond:
                self._stopped = reason
                if job is not None:
                    self._post(job, reason)
                self._current = None
                self._abandon_queued(reason)
            self._close_clients()

    def _write(self, job: _Job) -> tuple[str | None, KafkaRefused | None]:
        """Fetch the job's payloads and write its letters: None when durable, else the error
        (and the error itself when it is a refusal)."""
        topic = self._config.topic
        try:
            payloads = self._payloads(job.partition, job.offsets)
            self._writer.write(
                [
                    DeadLetter(
                        topic,
                        job.partition,
                        t.offset,
                        t.attempts,
                        f"{t.reason.value if t.reason else 'deferred'} ({t.cause})",
                        t.error,
                        payloads.get(t.offset),
                        job.tracebacks.get(t.offset),
                    )
                    for t in job.tickets
                ]
            )
        except Exception as exc:
            log.debug("%s[%d]: dead letters failed", topic, job.partition, exc_info=True)
            return describe_error(exc), exc if isinstance(exc, KafkaRefused) else None
        log.debug(
            "%s[%d]: %d dead letters written to %s",
            topic,
            job.partition,
            len(job.tickets),
            self._config.dlq_topic,
        )
        return None, None

    def _payloads(self, partition: int, offsets: tuple[int, ...]) -> dict[int, Record]:
        """The records Kafka still has for `offsets`, by offset.

        Normally one fetch of the contiguous runs. A fetch stops at the first offset outside
        Kafka's `[low, high)` and reports the bounds; offsets inside them that it did not reach
        are fetched again, so one deleted offset does not cost the others their payload.
        """
        topic = self._config.topic
        found: dict[int, Record] = {}
        wanted = list(offsets)
        for _ in range(MAX_FETCHES):
            result = self._fetcher.fetch(topic, partition, offset_runs(wanted))
            found.update((r.offset, r) for r in result.records)
            if result.out_of_range is None:
                break
            low, high = result.out_of_range
            gone = {o for lo, hi in result.missing for o in range(lo, hi)}
            rest = [o for o in wanted if low <= o < high and o not in found and o not in gone]
            if not rest or len(rest) == len(wanted):  # nothing left, or no progress
                break
            wanted = rest
        return found

    # -- helpers (callers hold the lock) -----------------------------------------------------

    def _post(self, job: _Job, error: str | None, refused: KafkaRefused | None = None) -> None:
        if job.settled:
            return
        job.settled = True
        self._outcomes.append(DeadLetterOutcome(job.partition, job.offsets, error, refused))
        self._unsettled -= len(job.tickets)
        self._cond.notify_all()

    def _abandon_queued(self, error: str) -> None:
        while self._queue:
            self._post(self._queue.popleft(), error)

    def _close_clients(self) -> None:
        for client in (self._fetcher, self._writer):
            try:
                client.close()
            except Exception as exc:
                log.warning(
                    "%s: closing the dead-letter %s failed: %s",
                    self._config.topic,
                    type(client).__name__,
                    describe_error(exc),
                )

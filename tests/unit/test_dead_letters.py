"""DeadLetterWorker's orchestration with a fake fetcher and writer: coalescing, one failed job
among good ones, a blocked writer that must not block the driver, bounded wait and close.

Writing real letters to a real DLQ is in tests/integration/test_dead_letters.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from kspout.config import TopicConfig, parse_config
from kspout.driver.dead_letters import CLOSED, DeadLetterOutcome, DeadLetterWorker, offset_runs
from kspout.errors import FetchTimeout
from kspout.kafka import DeadLetter, DeadLetterWriter, FetchResult, PartitionFetcher, Record
from kspout.outcomes import FailReason
from kspout.partition_manager import DeadLetterTicket

TOPIC = "orders"
WAIT = 5.0  # seconds any wait for the worker thread may take before the test fails


@pytest.fixture
def config() -> TopicConfig:
    return parse_config({"topic": TOPIC, "spout_id": "s", "fetch_timeout": 1.0})


def record(partition: int, offset: int) -> Record:
    return Record(TOPIC, partition, offset, b"k%d" % offset, b"v%d" % offset, 7, ())


def ticket(offset: int, *, attempts: int = 4, reason: FailReason | None = None) -> DeadLetterTicket:
    return DeadLetterTicket(
        offset, attempts, reason or FailReason.EXCEPTION, f"ValueError: {offset}", "exhausted"
    )


def tickets(*offsets: int) -> list[DeadLetterTicket]:
    return [ticket(o) for o in offsets]


class FakeFetcher(PartitionFetcher):
    """Kafka holds offsets `[low, high)` of every partition, except those in `holes`."""

    def __init__(
        self, config: TopicConfig, *, low: int = 0, high: int = 100, holes: Sequence[int] = ()
    ) -> None:
        super().__init__(config)
        self.low, self.high, self.holes = low, high, set(holes)
        self.calls: list[tuple[int, list[tuple[int, int]]]] = []
        self.fail_partitions: set[int] = set()
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True

    def fetch(self, topic: str, partition: int, spans: Sequence[tuple[int, int]]) -> FetchResult:
        assert topic == TOPIC
        self.calls.append((partition, list(spans)))
        if partition in self.fail_partitions:
            raise FetchTimeout(topic, partition, spans[0][0], 1.0)
        records: list[Record] = []
        missing: list[tuple[int, int]] = []
        for start, end in spans:
            for o in range(start, end):
                if not self.low <= o < self.high:  # a real fetch stops here
                    return FetchResult(records, missing, (self.low, self.high))
                if o in self.holes:
                    missing.append((o, o + 1))
                else:
                    records.append(record(partition, o))
        return FetchResult(records, missing)


class FakeWriter(DeadLetterWriter):
    """Records every write; `gate` (when set up) holds writes until released; writes with a
    letter of a partition in `fail_partitions` raise."""

    def __init__(self, config: TopicConfig) -> None:
        super().__init__(config)
        self.writes: list[list[DeadLetter]] = []
        self.fail_partitions: set[int] = set()
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.started = self.closed = False

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True

    def write(self, letters: Sequence[DeadLetter]) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait()
        if any(letter.partition in self.fail_partitions for letter in letters):
            raise RuntimeError("DLQ broker on fire")
        self.writes.append(list(letters))


@pytest.fixture
def fetcher(config: TopicConfig) -> FakeFetcher:
    return FakeFetcher(config)


@pytest.fixture
def writer(config: TopicConfig) -> Iterator[FakeWriter]:
    w = FakeWriter(config)
    yield w
    if w.gate is not None:
        w.gate.set()  # let a blocked worker thread end


@pytest.fixture
def make_worker(
    config: TopicConfig, fetcher: FakeFetcher, writer: FakeWriter
) -> Iterator[Callable[..., DeadLetterWorker]]:
    made: list[DeadLetterWorker] = []

    def make(**kwargs: float) -> DeadLetterWorker:
        worker = DeadLetterWorker(config, fetcher=fetcher, writer=writer, **kwargs)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


def drained(worker: DeadLetterWorker) -> list[DeadLetterOutcome]:
    assert worker.wait(WAIT)
    return worker.completed()


# -- pure helpers ---------------------------------------------------------------------------


def test_offset_runs_coalesces_contiguous_offsets() -> None:
    assert offset_runs([]) == []
    assert offset_runs([9, 3, 5, 4, 4, 10, 20]) == [(3, 6), (9, 11), (20, 21)]


# -- orchestration --------------------------------------------------------------------------


def test_contiguous_tickets_are_fetched_as_one_span_and_become_letters(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    fetcher.holes = {10}  # compacted away: a letter without its record
    worker = make_worker()
    with worker:
        deferred = DeadLetterTicket(4, 2, None, None, "behind")
        worker.submit(2, [ticket(9), ticket(5), deferred, ticket(3), ticket(10)])
        assert worker.pending == 5
        outcomes = drained(worker)

    assert outcomes == [DeadLetterOutcome(2, (3, 4, 5, 9, 10), None)]
    assert worker.pending == 0
    assert fetcher.calls == [(2, [(3, 6), (9, 11)])]
    assert writer.writes == [
        [
            DeadLetter(TOPIC, 2, 3, 4, "exception (exhausted)", "ValueError: 3", record(2, 3)),
            DeadLetter(TOPIC, 2, 4, 2, "deferred (behind)", None, record(2, 4)),
            DeadLetter(TOPIC, 2, 5, 4, "exception (exhausted)", "ValueError: 5", record(2, 5)),
            DeadLetter(TOPIC, 2, 9, 4, "exception (exhausted)", "ValueError: 9", record(2, 9)),
            DeadLetter(TOPIC, 2, 10, 4, "exception (exhausted)", "ValueError: 10", None),
        ]
    ]


def test_a_failed_write_fails_exactly_its_job_and_later_jobs_succeed(
    make_worker: Callable[..., DeadLetterWorker], writer: FakeWriter
) -> None:
    writer.fail_partitions = {1}
    with make_worker() as worker:
        worker.submit(0, tickets(1, 2))
        worker.submit(1, tickets(5, 6, 7))
        worker.submit(2, tickets(8))
        first = drained(worker)
        worker.submit(0, tickets(3))  # the thread is still alive
        second = drained(worker)

    assert first == [
        DeadLetterOutcome(0, (1, 2), None),
        DeadLetterOutcome(1, (5, 6, 7), "RuntimeError: DLQ broker on fire"),
        DeadLetterOutcome(2, (8,), None),
    ]
    assert second == [DeadLetterOutcome(0, (3,), None)]
    assert [[(w.partition, w.offset) for w in letters] for letters in writer.writes] == [
        [(0, 1), (0, 2)],
        [(2, 8)],
        [(0, 3)],
    ]


def test_a_failed_fetch_fails_its_job_without_writing(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    fetcher.fail_partitions = {3}
    with make_worker() as worker:
        worker.submit(3, tickets(1))
        worker.submit(4, tickets(1))
        outcomes = drained(worker)

    assert outcomes[0].partition == 3 and outcomes[0].offsets == (1,)
    assert outcomes[0].error is not None and outcomes[0].error.startswith("FetchTimeout: ")
    assert outcomes[1] == DeadLetterOutcome(4, (1,), None)
    assert [letters[0].partition for letters in writer.writes] == [4]


def test_offsets_past_an_out_of_range_one_still_get_their_records(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    """A fetch stops at the first offset outside [low, high); the rest is fetched again."""
    fetcher.low, fetcher.high = 10, 20
    with make_worker() as worker:
        worker.submit(0, tickets(2, 12, 13, 25))
        assert drained(worker) == [DeadLetterOutcome(0, (2, 12, 13, 25), None)]

    assert fetcher.calls == [(0, [(2, 3), (12, 14), (25, 26)]), (0, [(12, 14)])]
    records = {letter.offset: letter.record for letter in writer.writes[0]}
    assert records == {2: None, 12: record(0, 12), 13: record(0, 13), 25: None}


def test_submit_and_completed_do_not_block_while_the_writer_is_blocked(
    make_worker: Callable[..., DeadLetterWorker], writer: FakeWriter
) -> None:
    writer.gate = threading.Event()
    with make_worker() as worker:
        worker.submit(0, tickets(1, 2))
        assert writer.entered.wait(WAIT)  # the thread is inside write(), held by the gate
        began = time.monotonic()
        worker.submit(1, tickets(3))
        worker.submit(0, tickets(4))
        assert worker.completed() == []
        assert worker.pending == 4
        assert time.monotonic() - began < 0.5
        assert not worker.wait(0.05)

        writer.gate.set()
        assert drained(worker) == [
            DeadLetterOutcome(0, (1, 2), None),
            DeadLetterOutcome(1, (3,), None),
            DeadLetterOutcome(0, (4,), None),
        ]
        assert worker.pending == 0
        assert worker.wait(0)


def test_wait_and_close_are_bounded_and_abandoned_tickets_are_reported_failed(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    writer.gate = threading.Event()  # a DLQ that never answers
    worker = make_worker(close_timeout=0.2)
    worker.start()
    worker.submit(0, tickets(1))
    assert writer.entered.wait(WAIT)
    worker.submit(1, tickets(2, 3))

    began = time.monotonic()
    assert not worker.wait(0.2)
    worker.close()
    assert time.monotonic() - began < 2.0
    worker.submit(2, tickets(4))  # after close: failed at once, no exception

    assert worker.pending == 4
    assert worker.completed() == [
        DeadLetterOutcome(1, (2, 3), CLOSED),  # queued: abandoned
        DeadLetterOutcome(0, (1,), CLOSED),  # in hand, outlived close_timeout
        DeadLetterOutcome(2, (4,), CLOSED),
    ]
    assert worker.pending == 0
    assert worker.wait(0)
    assert not fetcher.closed  # the thread still uses them

    writer.gate.set()  # the late write finishes: the thread closes the clients, reports nothing
    deadline = time.monotonic() + WAIT
    while not (fetcher.closed and writer.closed) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fetcher.closed and writer.closed
    assert worker.completed() == []


def test_close_finishes_the_job_in_hand_and_closes_the_clients(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    writer.gate = threading.Event()
    worker = make_worker()
    worker.start()
    assert fetcher.started and writer.started
    worker.submit(0, tickets(1))
    assert writer.entered.wait(WAIT)
    worker.submit(0, tickets(2))
    threading.Timer(0.1, writer.gate.set).start()
    worker.close()

    assert worker.completed() == [
        DeadLetterOutcome(0, (2,), CLOSED),
        DeadLetterOutcome(0, (1,), None),
    ]
    assert fetcher.closed and writer.closed
    worker.close()  # again: no effect
    with pytest.raises(RuntimeError, match="closed"):
        worker.start()


def test_a_worker_never_started_reports_submissions_failed_on_close(
    make_worker: Callable[..., DeadLetterWorker], fetcher: FakeFetcher, writer: FakeWriter
) -> None:
    worker = make_worker()
    worker.submit(0, [])  # nothing to do
    worker.submit(0, tickets(1))
    assert worker.pending == 1
    assert not worker.wait(0.01)
    worker.close()
    assert worker.completed() == [DeadLetterOutcome(0, (1,), CLOSED)]
    assert fetcher.closed and writer.closed and not fetcher.started

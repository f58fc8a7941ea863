"""The outcome channel over real loopback sockets: a `TaskReporter` beating to an `OutcomeChannel`.

No Spark and no servers: the listener runs in this process, the reporter's thread beats every
few milliseconds, and every wait is a short bounded poll.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from kspout.bolts import Tuple
from kspout.channel import reporter as reporter_module
from kspout.channel.beacon import thread_beacon
from kspout.channel.listener import OutcomeChannel
from kspout.channel.reporter import TaskReporter
from kspout.contract import Beat, ChannelAddress, Final, Message, TaskId, TaskResult
from kspout.outcomes import FailReason, Outcome, OutcomeKind

# A regression that blocks a handshake must fail the test, not hang the run.
pytestmark = pytest.mark.timeout(30)

INTERVAL = 0.01
WAIT = 5.0  # upper bound for anything to arrive; normally milliseconds
TASK = TaskId(4, 0, 1)
P = 3


@dataclass(frozen=True)
class At:
    """What executor code puts in its beacon: anything with a partition and an offset."""

    partition: int
    offset: int


@pytest.fixture
def channel() -> Iterator[OutcomeChannel]:
    ch = OutcomeChannel("127.0.0.1")
    ch.start()
    yield ch
    # The Python worker this test plays goes away: its cached link hangs up first, as a worker
    # process exiting would, so the listener's readers end on EOF before the listener closes.
    link = reporter_module._links.pop(address_of(ch))
    if link is not None and link._conn is not None:
        link._conn.close()
    deadline = time.monotonic() + 1.0
    while ch._connections and time.monotonic() < deadline:
        time.sleep(0.002)
    ch.close()
    thread_beacon().current = None


class Inbox:
    """Everything the channel received, gathered by bounded polls."""

    def __init__(self, channel: OutcomeChannel) -> None:
        self.channel = channel
        self.messages: list[Message] = []

    def until(self, what: str, done: Callable[[Message], bool]) -> Message:
        """Poll until a message satisfying `done` arrives; fail after WAIT seconds."""
        deadline = time.monotonic() + WAIT
        seen = len(self.messages)
        while True:
            self.messages.extend(self.channel.drain())
            for message in self.messages[seen:]:
                if done(message):
                    return message
            seen = len(self.messages)
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {WAIT}s; got {self.messages[-5:]}")
            time.sleep(0.002)

    def beat(self, what: str, done: Callable[[Beat], bool]) -> Beat:
        found = self.until(what, lambda m: isinstance(m, Beat) and done(m))
        assert isinstance(found, Beat)
        return found

    def beats(self) -> list[Beat]:
        return [m for m in self.messages if isinstance(m, Beat)]


def address_of(channel: OutcomeChannel) -> ChannelAddress:
    assert channel.address is not None
    return channel.address


def test_beats_name_the_root_and_how_long_the_task_has_been_on_it(
    channel: OutcomeChannel,
) -> None:
    inbox = Inbox(channel)
    with TaskReporter(address_of(channel), TASK, P, interval=INTERVAL):
        first = inbox.beat("beat", lambda b: True)
        assert first.task == TASK
        assert first.partition == P
        assert first.current is None
        assert first.upto is None, "no outcomes to stream before the fetch"

        thread_beacon().current = At(P, 17)
        on_17 = inbox.beat("beat on 17", lambda b: b.current == (P, 17))
        later = inbox.beat("a later beat on 17", lambda b: b.current == (P, 17) and b is not on_17)
        time.sleep(0.05)
        latest = inbox.beat("a beat 50ms later", lambda b: b.busy_for >= on_17.busy_for + 0.04)
        assert latest.current == (P, 17)
        assert on_17.busy_for < later.busy_for < latest.busy_for, "busy_for grows on one root"

        # A bolt's tuple: its (first) root names the record it descends from.
        thread_beacon().current = Tuple(("x",), ("word",), {(P, 23): 0x1234})
        on_23 = inbox.beat("beat on the tuple's root", lambda b: b.current == (P, 23))
        assert on_23.busy_for < latest.busy_for, "a new root starts counting from zero"

        thread_beacon().current = Tuple(("x",), ("word",), {})
        inbox.beat("beat on an unanchored tuple", lambda b: b.current is None)
    last = inbox.beat("last beat", lambda b: b.done)
    assert last.current is None
    assert inbox.beats()[-1] is last, "nothing follows the last beat"
    assert thread_beacon().current is None


def test_outcomes_stream_below_the_current_root_and_the_final_arrives(
    channel: OutcomeChannel,
) -> None:
    inbox = Inbox(channel)
    outcomes: list[Outcome] = []
    boom = Outcome(12, OutcomeKind.FAIL, 1, FailReason.EXCEPTION, "ValueError: boom")
    also = Outcome(15, OutcomeKind.FAIL, 1, FailReason.EXCEPTION, "KeyError: 'id'")
    with TaskReporter(address_of(channel), TASK, P, interval=INTERVAL) as reporter:
        reporter.fetched([(20, 22)], outcomes)
        thread_beacon().current = At(P, 10)
        at_10 = inbox.beat("beat at 10", lambda b: b.upto == 10)
        assert at_10.failures == ()

        # Records 10 and 11 done, 12 raised, 13 and 14 done; the task is on 15.
        outcomes.append(Outcome(10, OutcomeKind.ACK, 1, count=2))
        outcomes.append(boom)
        outcomes.append(Outcome(13, OutcomeKind.ACK, 1, count=2))
        thread_beacon().current = At(P, 15)
        inbox.beat("beat at 15", lambda b: b.upto == 15)

        # 15 raised; the task moves to 16, then to 23 (20, 21 are missing in Kafka).
        outcomes.append(also)
        thread_beacon().current = At(P, 16)
        inbox.beat("beat at 16", lambda b: b.upto == 16)
        outcomes.append(Outcome(16, OutcomeKind.ACK, 1, count=4))
        outcomes.append(Outcome(22, OutcomeKind.ACK, 1))
        thread_beacon().current = At(P, 23)
        inbox.beat("beat at 23", lambda b: b.upto == 23)

        thread_beacon().current = None
        result = TaskResult("orders", P, 0, [*outcomes, Outcome(23, OutcomeKind.ACK, 1)])
        reporter.final([result])
        final = inbox.until("final", lambda m: isinstance(m, Final))
        assert final == Final(TASK.batch, (result,))
    inbox.beat("last beat", lambda b: b.done)

    beats = inbox.beats()
    streamed = [f for b in beats for f in b.failures]
    assert streamed == [boom, also], "each failure below upto is reported exactly once"
    for b in beats:
        assert all(f.offset < (b.upto or 0) for f in b.failures), "failures lie below upto"
    uptos = [b.upto for b in beats if b.upto is not None]
    assert uptos == sorted(uptos)
    missing = [b.missing for b in beats if b.missing is not None]
    assert missing == [((20, 22),)], "missing ranges are sent once"
    assert beats[-1].done
    assert beats[-1].upto is None


def test_a_client_with_the_wrong_key_is_refused_and_the_listener_keeps_working(
    channel: OutcomeChannel,
) -> None:
    address = address_of(channel)
    with pytest.raises(AuthenticationError, match="digest sent was rejected"):
        intruder = Client((address.host, address.port), authkey=b"not the key")
        intruder.send(Final(99, ()))
    time.sleep(0.05)
    assert not [m for m in channel.drain() if isinstance(m, Final)]

    inbox = Inbox(channel)
    with TaskReporter(address, TASK, P, interval=INTERVAL):
        thread_beacon().current = At(P, 5)
        inbox.beat("beat after the refusal", lambda b: b.current == (P, 5))
    inbox.beat("last beat", lambda b: b.done)
    assert all(not (isinstance(m, Final) and m.batch == 99) for m in inbox.messages)


def test_a_silent_peer_does_not_block_other_tasks(channel: OutcomeChannel) -> None:
    address = address_of(channel)
    silent = socket.create_connection((address.host, address.port), timeout=1.0)
    try:
        inbox = Inbox(channel)
        deadline = time.monotonic() + 1.0
        with TaskReporter(address, TASK, P, interval=INTERVAL):
            thread_beacon().current = At(P, 5)
            while not channel.drain():
                if time.monotonic() > deadline:
                    silent.close()  # let the listener go on, so the reporter can finish
                    pytest.fail("no beat arrived while a silent peer held the handshake")
                time.sleep(0.005)
        inbox.beat("last beat", lambda b: b.done)
    finally:
        silent.close()


def test_closing_the_channel_under_a_connected_task_ends_its_reader_quietly() -> None:
    ch = OutcomeChannel("127.0.0.1")
    ch.start()
    address = address_of(ch)
    errors: list[threading.ExceptHookArgs] = []
    previous = threading.excepthook
    threading.excepthook = errors.append
    client = Client((address.host, address.port), authkey=address.authkey)
    try:
        client.send(Beat(TASK, P, None, 0.0))
        Inbox(ch).beat("a beat", lambda b: True)
        ch.close()
        client.send(Beat(TASK, P, None, 0.1))  # the task did not notice yet
        deadline = time.monotonic() + 1.0
        while not errors and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        client.close()
        threading.excepthook = previous
    assert [f"{e.exc_type.__name__}: {e.exc_value}" for e in errors] == []


def test_an_unreachable_driver_never_raises_into_the_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = ChannelAddress("127.0.0.1", port, b"k" * 32)
    caplog.set_level(logging.WARNING, logger="kspout.channel.reporter")

    started = time.monotonic()
    reporter = TaskReporter(address, TaskId(7, 0, 0), P, interval=INTERVAL)
    with reporter:
        reporter.fetched([], [])
        thread_beacon().current = At(P, 1)
        deadline = time.monotonic() + WAIT
        while not reporter._link or not reporter._link.broken:
            assert time.monotonic() < deadline, "the link never noticed the driver is gone"
            time.sleep(0.005)
        reporter.final([TaskResult("orders", P, 0, [Outcome(1, OutcomeKind.ACK, 1)])])
    assert time.monotonic() - started < WAIT
    assert reporter._link is not None and reporter._link.broken
    warnings = [r for r in caplog.records if "outcome channel" in r.getMessage()]
    assert len(warnings) == 1, "one warning, not one per beat"
    assert "k" * 32 not in caplog.text, "the key never appears in logs"


def test_each_thread_has_its_own_beacon() -> None:
    """Two in-process executors in one process (two drivers in threads) never read each
    other's records: a reporter reads the beacon of the thread that opened it."""
    mine = thread_beacon()
    theirs: list[object] = []
    thread = threading.Thread(target=lambda: theirs.append(thread_beacon()))
    thread.start()
    thread.join()
    assert theirs == [theirs[0]] and theirs[0] is not mine
    assert thread_beacon() is mine

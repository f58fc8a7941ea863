"""`stop_on_signals` with real signals sent to this process: the first sets `stop`, the second
raises KeyboardInterrupt, the handlers found on entry come back, and a thread installs none."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from kspout.stopping import SIGNALS, stop_on_signals


class Recorder:
    """A handler standing in for the program's own: notes the signals it receives."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.seen.append(signum)


@pytest.fixture
def previous() -> Iterator[Recorder]:
    """The program's handlers before the block: a recorder, so no stray signal kills pytest."""
    recorder = Recorder()
    saved = {signum: signal.signal(signum, recorder) for signum in SIGNALS}
    yield recorder
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_first_signal_stops_second_interrupts_third_meets_the_old_handler(
    previous: Recorder, signum: int
) -> None:
    with stop_on_signals() as stop:
        os.kill(os.getpid(), signum)  # Python runs the handler before the next line
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt, match="again"):
            os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signum)
    assert previous.seen == [signum]
    for each in SIGNALS:
        assert signal.getsignal(each) is previous


def test_the_callers_event_is_the_one_set(previous: Recorder) -> None:
    mine = threading.Event()
    with stop_on_signals(mine) as stop:
        assert stop is mine
        os.kill(os.getpid(), signal.SIGTERM)
    assert mine.is_set() and previous.seen == []


def test_outside_the_main_thread_nothing_is_installed(
    previous: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    """`signal.signal` raises ValueError outside the main thread: the block runs anyway, and a
    log line says that signals are not handled there."""
    found: list[object] = []

    def run() -> None:
        with stop_on_signals() as stop:
            found.extend([stop.is_set(), signal.getsignal(signal.SIGTERM)])

    with caplog.at_level(logging.INFO, logger="kspout.stopping"):
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    assert found == [False, previous]
    assert "SIGTERM and Ctrl-C are not handled" in caplog.text

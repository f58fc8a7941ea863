"""Clean stops on the signals people and cluster managers send: Ctrl-C (SIGINT) and SIGTERM.

YARN and Kubernetes stop a driver with SIGTERM, then SIGKILL after a grace period. The first
SIGTERM or Ctrl-C sets the run's `stop` event: the driver loop plans nothing more, waits for
the batches in flight (an in-process handler stops after the record in hand, releasing the rest
of its batch), writes their dead letters and commits, so a restart replays nothing that
finished. A second one raises KeyboardInterrupt at once: the driver abandons what is in flight
and commits only what was applied (the rest runs again on the next start).

Python lets only the main thread set signal handlers. Elsewhere nothing is installed and a log
line says so; the caller stops the run through its `stop` event.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def stop_on_signals(stop: threading.Event | None = None) -> Iterator[threading.Event]:
    """Within the block, the first SIGINT/SIGTERM sets `stop` (a new event when None) and the
    second raises KeyboardInterrupt; the handlers found on entry are restored on exit."""
    stop = threading.Event() if stop is None else stop
    if threading.current_thread() is not threading.main_thread():
        log.info("not the main thread: SIGTERM and Ctrl-C are not handled; set `stop` to stop")
        yield stop
        return
    # None: a handler not set from Python, which cannot be put back; the default stands in.
    previous = {signum: signal.getsignal(signum) or signal.SIG_DFL for signum in SIGNALS}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            restore()  # a third signal meets the handler the program had before
            raise KeyboardInterrupt(f"{name} again: stopping now")
        stop.set()
        log.warning(
            "%s: stopping after the batches in flight (in-process: after the record in hand), "
            "then committing; send it again to stop now",
            name,
        )

    for signum in SIGNALS:
        signal.signal(signum, handle)
    try:
        yield stop
    finally:
        restore()

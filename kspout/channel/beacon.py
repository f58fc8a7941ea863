"""`thread_beacon().current`: what the executor code of this thread is handling right now.

Executor code sets it to the `Record` or `Tuple` it is about to run user code on, and to
None between records. That is one attribute store per record, no allocation: the task's
reporter thread reads it and works out the root and how long it has been there.

Each thread has its own beacon, so two in-process executors of one process (two drivers in
threads) never read each other's records. Code fetches its thread's beacon once per task or
batch (a thread-local lookup) and sets `current` on it per record; a `TaskReporter` takes the
beacon of the thread that opens it.
"""

from __future__ import annotations

import threading


class Beacon:
    """The one mutable slot shared between a task's thread and its reporter."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: object = None


_local = threading.local()


def thread_beacon() -> Beacon:
    """This thread's beacon, made on first use."""
    found: Beacon | None = getattr(_local, "beacon", None)
    if found is None:
        found = _local.beacon = Beacon()
    return found

"""Keeping CPython's cycle collector off the many long-lived objects a fetch or a stage builds."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cycle collector for the block (a no-op if it is already paused).

    A fetch or a stage keeps every record or tuple it builds, and the collector scans a
    generation for every 700 objects that stay alive: with 100k records those scans took ~45%
    of a fetch's time (measured: 260k vs 450k records/s). Reference counting still frees
    garbage at once; cycles made meanwhile wait until the block ends.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def cyclic_gc_frozen() -> Iterator[None]:
    """Keep the cycle collector running, but off every object alive when the block starts.

    For user code: a bolt that makes reference cycles still has them collected, while the
    task's records and tuples, already built, are not scanned again and again.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

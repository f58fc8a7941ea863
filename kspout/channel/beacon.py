"""`BEACON.current`: what the executor code of this Python worker is handling right now.

Executor code sets it to the `Record` or `Tuple` it is about to run user code on, and to
None between records. That is one attribute store per record, no allocation: the task's
reporter thread reads it and works out the root and how long it has been there.
"""

from __future__ import annotations


class Beacon:
    """The one mutable slot shared between a task's main thread and its reporter."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: object = None


BEACON = Beacon()

"""The driver: plans micro-batches, watches them run, applies outcomes, commits.

`loop.Driver` is the loop itself; each of its jobs is a small component beside it.
"""

from kspout.driver.loop import Driver
from kspout.driver.progress import PartitionView, Progress

__all__ = ["Driver", "PartitionView", "Progress"]

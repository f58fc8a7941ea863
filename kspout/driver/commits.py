"""Commit points to ZooKeeper, and operators' moves of stopped partitions back from it.

Each partition's record is written only when its commit point (or its stop mark) changed,
with compare-and-set on the znode version, so a writer that lost the record cannot overwrite
a newer one. A partition stopped by `out_of_range = "fail"` carries the reason in its record
(`kspout offsets show` prints it with the command that resumes it); the committer reads such
records back every few seconds and reports when an operator moved the offset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kspout.offsets import ZkOffsetStore
from kspout.partition_manager import PartitionManager

log = logging.getLogger(__name__)

# Seconds between two reads of a stopped partition's record (an operator's move is rare).
RESUME_POLL = 2.0


class Committer:
    """Writes commit points; knows the versions and the offsets last written."""

    def __init__(
        self,
        store: ZkOffsetStore,
        clock: Callable[[], float],
        leaders: Callable[[], Mapping[int, tuple[str, int]]],
    ) -> None:
        self._store = store
        self._clock = clock
        self._leaders = leaders
        self.versions: dict[int, int | None] = {}
        self.committed: dict[int, int | None] = {}
        self._marks: dict[int, str | None] = {}
        self._polled_at = float("-inf")

    def track(
        self, partition: int, offset: int | None, version: int | None, stopped: str | None
    ) -> None:
        """A partition's stored record as found on start (None: there is none yet)."""
        self.committed[partition] = offset
        self.versions[partition] = version
        self._marks[partition] = stopped

    def commit(self, pms: Mapping[int, PartitionManager], stopped: Mapping[int, str]) -> None:
        """Write every partition whose commit point or stop mark changed."""
        leaders = self._leaders()
        for p, pm in pms.items():
            offset, mark = pm.commit_point, stopped.get(p)
            if mark == self._marks[p] and (offset == self.committed[p] or mark is not None):
                continue  # unchanged; a stopped record is the operator's to change now
            self.versions[p] = self._store.commit(
                p,
                offset,
                version=self.versions[p],
                broker=leaders.get(p, ("", -1)),
                stopped=mark,
            )
            self.committed[p], self._marks[p] = offset, mark

    def moved(self, stopped: Mapping[int, str]) -> dict[int, int]:
        """Stopped partitions an operator moved since: partition -> the offset to resume at."""
        now = self._clock()
        if not stopped or now - self._polled_at < RESUME_POLL:
            return {}
        self._polled_at = now
        out = {}
        for p in stopped:
            record = self._store.read(p)
            if record is None or record.version == self.versions[p] or record.stopped:
                continue
            out[p] = record.offset
            self.versions[p] = record.version
            self.committed[p] = record.offset
            self._marks[p] = None
            log.warning("partition %d moved to %d by an operator: it runs again", p, record.offset)
        return out

"""Commit points to ZooKeeper, and operators' moves of stopped partitions back from it.

Each partition's record is written only when its commit point, its finished runs above the
commit point, or its stop mark changed, with compare-and-set on the znode version, so a writer
that lost the record cannot overwrite a newer one. The record carries what a restart needs to
replay only what is unfinished, and what the replay window needs (`kspout.offsets`). A
partition stopped by `out_of_range = "fail"` carries the reason in its record (`kspout offsets
show` prints it with the command that resumes it); the committer reads such records back every
few seconds and reports when an operator moved the offset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kspout.errors import OffsetConflict
from kspout.offsets import (
    MAX_DONE_SPANS,
    Checkpoint,
    Range,
    StoredOffset,
    ZkOffsetStore,
    encode_done,
    history_fields,
    next_history,
    now_ms,
)
from kspout.partition_manager import PartitionManager

log = logging.getLogger(__name__)

# Seconds between two reads of a stopped partition's record (an operator's move is rare).
RESUME_POLL = 2.0

# What a record holds beyond its stop mark: commit point, finished runs, where the list was cut.
Held = tuple[int, tuple[Range, ...], int | None]


class Committer:
    """Writes commit points; knows the versions and the offsets last written.

    `window` (seconds) is the chain's replay window: when set, records keep the checkpoints
    that tell how long ago offsets were finished. `fence(partition)` names the claim node every
    commit checks in the same transaction (`kspout.ownership`).
    """

    def __init__(
        self,
        store: ZkOffsetStore,
        clock: Callable[[], float],
        leaders: Callable[[], Mapping[int, tuple[str, int]]],
        window: float | None = None,
        fence: Callable[[int], str] | None = None,
    ) -> None:
        self._store = store
        self._fence = fence
        self._clock = clock
        self._leaders = leaders
        self._window = window
        self.versions: dict[int, int | None] = {}
        self.committed: dict[int, int | None] = {}
        self._marks: dict[int, str | None] = {}
        self._held: dict[int, Held | None] = {}
        self._seen: dict[int, tuple[int, int, int]] = {}  # what `_held` was computed from
        self._advanced_at: dict[int, int] = {}  # wall ms the commit point last moved
        self._history: dict[int, tuple[Checkpoint, ...]] = {}
        # Clock time each record was last written (by a commit, the claim, an operator's move).
        self.written_at: dict[int, float] = {}
        self._polled_at = float("-inf")

    def track(self, partition: int, stored: StoredOffset | None) -> None:
        """A partition's stored record as found on start (None: there is none yet)."""
        self._seen.pop(partition, None)
        self.written_at[partition] = self._clock()  # just written: by a claim, or an operator
        if stored is None:
            self.committed[partition] = self.versions[partition] = None
            self._marks[partition] = self._held[partition] = None
            self._advanced_at[partition] = now_ms()
            self._history[partition] = ()
            return
        self.committed[partition] = stored.offset
        self.versions[partition] = stored.version
        self._marks[partition] = stored.stopped
        self._held[partition] = (stored.offset, stored.done, stored.done_cut)
        self._advanced_at[partition] = stored.advanced_at or now_ms()
        self._history[partition] = stored.history

    def forget(self, partition: int) -> None:
        """The partition left this instance."""
        for known in (self.versions, self.committed, self._marks, self._held, self._seen):
            known.pop(partition, None)
        self._advanced_at.pop(partition, None)
        self._history.pop(partition, None)
        self.written_at.pop(partition, None)

    def commit(
        self, pms: Mapping[int, PartitionManager], stopped: Mapping[int, str]
    ) -> list[tuple[int, OffsetConflict]]:
        """Write every partition whose commit point, finished runs or stop mark changed;
        returns the partitions whose write was refused (another writer owns them now)."""
        refused: list[tuple[int, OffsetConflict]] = []
        leaders = self._leaders()
        for p, pm in pms.items():
            mark = stopped.get(p)
            if mark is not None and mark == self._marks[p]:
                continue  # a stopped record is the operator's to change now
            # Nothing finished and the commit point stood still: the record is as written
            # (saves listing the runs of a thousand quiet partitions every commit).
            seen = (pm.commit_point, pm.epoch, pm.finished_total)
            if mark == self._marks[p] and seen == self._seen.get(p):
                continue
            offset = pm.commit_point
            spans, cut = pm.finished_spans(MAX_DONE_SPANS)
            held: Held = (offset, tuple(spans), cut)
            if mark == self._marks[p] and held == self._held[p]:
                self._seen[p] = seen
                continue
            try:
                self.versions[p] = self._store.commit(
                    p,
                    offset,
                    version=self.versions[p],
                    broker=leaders.get(p, ("", -1)),
                    extra=self._fields(p, pm, spans, cut),
                    stopped=mark,
                    fence=None if self._fence is None else self._fence(p),
                )
            except OffsetConflict as exc:
                refused.append((p, exc))
                continue
            self.committed[p], self._marks[p], self._held[p] = offset, mark, held
            self._seen[p] = seen
            self.written_at[p] = self._clock()
        return refused

    def _fields(
        self, p: int, pm: PartitionManager, spans: list[Range], cut: int | None
    ) -> dict[str, Any]:
        """What the record keeps under `kspout` besides the stamps (module docstring)."""
        now, offset, emitted = now_ms(), pm.commit_point, pm.emitted_to
        if offset != self.committed[p]:
            self._advanced_at[p] = now
        fields = {
            **encode_done(offset, spans, cut),
            "emitted": emitted,
            "advanced_at": self._advanced_at[p],
        }
        if self._window is not None:
            checkpoint = Checkpoint(now, offset, emitted)
            self._history[p] = next_history(self._history[p], checkpoint, self._window)
            fields.update(history_fields(self._history[p], self._window))
        return fields

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
            self.track(p, record)
            log.warning("partition %d moved to %d by an operator: it runs again", p, record.offset)
        return out

"""Commit points to ZooKeeper, and operators' moves of stopped partitions back from it.

Each partition's record is written only when its commit point, its finished runs above the
commit point, or its stop mark changed, with compare-and-set on the znode version, so a writer
that lost the record cannot overwrite a newer one. The records of one commit round go out
together (`ZkOffsetStore.commit_all`): one round trip, each partition fenced on its own. The
record carries what a restart needs to replay only what is unfinished, and what the replay
window needs (`kspout.zk.record`). A partition stopped by `out_of_range = "fail"` carries the
reason in its record (`kspout offsets show` prints it with the command that resumes it); the
committer reads such records back every few seconds and reports when an operator moved the
offset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kspout.driver.owned import OwnedPartition
from kspout.errors import OffsetConflict
from kspout.partition_manager import PartitionManager
from kspout.ranges import Range
from kspout.zk.offsets import OffsetWrite, ZkOffsetStore
from kspout.zk.record import (
    MAX_DONE_SPANS,
    Checkpoint,
    StoredOffset,
    encode_done,
    history_fields,
    next_history,
    now_ms,
)

log = logging.getLogger(__name__)

# Seconds between two reads of a stopped partition's record (an operator's move is rare).
RESUME_POLL = 2.0

# What a record holds beyond its stop mark: commit point, finished runs, where the list was cut.
Held = tuple[int, tuple[Range, ...], int | None]


@dataclass(slots=True)
class _Record:
    """What this instance knows of one partition's record, as last read or written."""

    version: int | None  # the znode version to compare-and-set against (None: no record yet)
    mark: str | None  # the stop mark it holds
    held: Held | None  # commit point, finished runs, cut (None: no record yet)
    advanced_at: int  # wall ms the commit point last moved
    history: tuple[Checkpoint, ...]
    written_at: float  # clock time it was last written (a commit, the claim, an operator)
    seen: tuple[int, int, int] | None = None  # (commit point, generation, finished) `held` is from

    @property
    def offset(self) -> int | None:
        """The commit point it holds."""
        return None if self.held is None else self.held[0]


@dataclass(frozen=True, slots=True)
class _Change:
    """A record to write in this commit round, and what it holds once written."""

    write: OffsetWrite
    mark: str | None
    held: Held
    seen: tuple[int, int, int]


class Committer:
    """Writes commit points; knows, per partition, the record as last read or written.

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
        self._records: dict[int, _Record] = {}
        self._polled_at = float("-inf")

    def track(self, partition: int, stored: StoredOffset | None) -> None:
        """A partition's stored record as found on start or claim (None: there is none)."""
        now = self._clock()  # just written: by a claim, or an operator
        if stored is None:
            self._records[partition] = _Record(None, None, None, now_ms(), (), now)
            return
        self._records[partition] = _Record(
            stored.version,
            stored.stopped,
            (stored.offset, stored.done, stored.done_cut),
            stored.advanced_at or now_ms(),
            stored.history,
            now,
        )

    def forget(self, partition: int) -> None:
        """The partition left this instance."""
        self._records.pop(partition, None)

    def committed(self, partition: int) -> int | None:
        """The commit point the partition's record holds (None: no record yet)."""
        return self._records[partition].offset

    def committed_points(self) -> dict[int, int | None]:
        """Every tracked partition's commit point."""
        return {p: record.offset for p, record in self._records.items()}

    def version(self, partition: int) -> int | None:
        """The znode version last read or written."""
        return self._records[partition].version

    def written_at(self, partition: int) -> float:
        """Clock time the record was last written."""
        return self._records[partition].written_at

    def commit(self, parts: Mapping[int, OwnedPartition]) -> list[tuple[int, OffsetConflict]]:
        """Write every partition whose commit point, finished runs or stop mark changed, all
        in one round trip; returns the partitions whose write was refused (another writer
        owns them now)."""
        leaders = self._leaders()
        changes = [
            change
            for p, part in parts.items()
            if (change := self._change(p, part.manager, part.stopped, leaders)) is not None
        ]
        outcomes = self._store.commit_all([change.write for change in changes])
        refused: list[tuple[int, OffsetConflict]] = []
        for change in changes:
            p = change.write.partition
            outcome = outcomes[p]
            if isinstance(outcome, OffsetConflict):
                refused.append((p, outcome))
                continue
            record = self._records[p]
            record.version, record.mark, record.held = outcome, change.mark, change.held
            record.seen, record.written_at = change.seen, self._clock()
        return refused

    def _change(
        self,
        p: int,
        pm: PartitionManager,
        mark: str | None,
        leaders: Mapping[int, tuple[str, int]],
    ) -> _Change | None:
        """The write partition `p` needs, None when its record already says it all."""
        record = self._records[p]
        if mark is not None and mark == record.mark:
            return None  # a stopped record is the operator's to change now
        # Nothing finished and the commit point stood still: the record is as written
        # (saves listing the runs of a thousand quiet partitions every commit).
        seen = (pm.commit_point, pm.generation, pm.finished_total)
        if mark == record.mark and seen == record.seen:
            return None
        offset = pm.commit_point
        spans, cut = pm.finished_spans(MAX_DONE_SPANS)
        held: Held = (offset, tuple(spans), cut)
        if mark == record.mark and held == record.held:
            record.seen = seen
            return None
        write = OffsetWrite(
            p,
            offset,
            record.version,
            broker=leaders.get(p, ("", -1)),
            extra=self._fields(record, pm, spans, cut),
            stopped=mark,
            fence=None if self._fence is None else self._fence(p),
        )
        return _Change(write, mark, held, seen)

    def _fields(
        self, record: _Record, pm: PartitionManager, spans: list[Range], cut: int | None
    ) -> dict[str, Any]:
        """What the record keeps under `kspout` besides the stamps (module docstring)."""
        now, offset, emitted = now_ms(), pm.commit_point, pm.emitted_to
        if offset != record.offset:
            record.advanced_at = now
        fields = {
            **encode_done(offset, spans, cut),
            "emitted": emitted,
            "advanced_at": record.advanced_at,
        }
        if pm.leader_epoch is not None:
            fields["leader_epoch"] = list(pm.leader_epoch)
        if self._window is not None:
            checkpoint = Checkpoint(now, offset, emitted)
            record.history = next_history(record.history, checkpoint, self._window)
            fields.update(history_fields(record.history, self._window))
        return fields

    def moved(self, parts: Mapping[int, OwnedPartition]) -> dict[int, int]:
        """Stopped partitions an operator moved since: partition -> the offset to resume at."""
        now = self._clock()
        if now - self._polled_at < RESUME_POLL:
            return {}
        stopped = [p for p, part in parts.items() if part.stopped is not None]
        if not stopped:
            return {}
        self._polled_at = now
        out = {}
        for p in stopped:
            record = self._store.read(p)
            if record is None or record.version == self.version(p) or record.stopped:
                continue
            out[p] = record.offset
            self.track(p, record)
            log.warning("partition %d moved to %d by an operator: it runs again", p, record.offset)
        return out

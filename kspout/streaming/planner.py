"""Driver side of the stream: where each batch begins and ends, per partition.

PySpark keeps one stream reader per query in a long-lived Python process on the driver and
asks it, in order: the initial offsets (a new query only), the end of the next batch from the
end of the last one (`latest`, every few milliseconds while idle), and the tasks of a batch
(`ranges`). Spark's checkpoint holds every batch's start and end, so this planner keeps only
caches, and the ZooKeeper copy (`ZkCopy`).

Where a partition's batch begins, per the PartitionManager's policies:

* a new query starts each partition at `startingOffsets` (JSON) where it names one, else at
  the topic file's `start`; a partition added to the topic later starts at its earliest
  offset (all it holds is newer than the query), as in Spark's Kafka source;
* a batch begins where the last one ended, unless an unclean leader election truncated the
  log below that offset: then it begins where the logs part, and the replaced offsets are
  logged with their exact range and counted (`replaced` in the ZooKeeper record), found by the
  leader epoch kept beside each offset in the checkpoint (`truncation`); or unless Kafka no
  longer holds that offset (retention deleted it, or the partition was recreated): then the
  `out_of_range` policy moves it, and the offsets skipped are logged with their exact range and
  counted (`lost` in the ZooKeeper record). Under `fail` the query stops with `StreamStopped`,
  which names the command that moves the partition; an operator's move (`kspout offsets set`)
  is where the query resumes.
  Without a topic file there is no ZooKeeper copy (`NoCopy`), so no count and no move either.

A batch ends at the high watermark, or earlier under a read limit (`maxOffsetsPerTrigger`:
split between partitions by `positions.admit`), or at the high watermark that
`prepare_available_now` saw, for `Trigger.AvailableNow`, which then ends once every partition
reached it. Under `minOffsetsPerTrigger` a batch waits for that many offsets or
`maxTriggerDelay` (`MinTrigger`), except under `Trigger.AvailableNow`, which would wait for
ever, and when the out-of-range policy just moved a partition.

The end of a completed batch is copied to ZooKeeper when the next one is planned: `latest` is
given it as its start, and PySpark asks for it only after the batch's commit log entry was
written. PySpark's own `commit(end)` is no use for this: it comes one batch late, and not at all
while the query is idle, so the last batch before a pause would never be copied.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kspout.errors import PartitionStopped
from kspout.kafka import KafkaMetadata
from kspout.kafka.metadata import Bounds
from kspout.lifecycle import Lifecycle
from kspout.partition_manager import PartitionManager
from kspout.policy import PositionKind
from kspout.streaming.options import EARLIEST, LATEST, SourceSettings
from kspout.streaming.positions import MinTrigger, Offsets, StreamOffsets, admit
from kspout.streaming.read import KafkaRange, Stopped
from kspout.streaming.truncation import EpochCheck
from kspout.streaming.watermarks import ThrottledWatermarks
from kspout.streaming.zk_copy import LOST_KEY, REPLACED_KEY, NoCopy, ZkCopy
from kspout.wording import count

log = logging.getLogger(__name__)


class StreamPlanner(Lifecycle):
    """Plans one query's batches (or a `spark.read`'s one range per partition); connects to
    Kafka in `start()`, to ZooKeeper on first copy (with `zk_copy`). `stopped` makes the error
    that `out_of_range = "fail"` raises."""

    def __init__(
        self,
        settings: SourceSettings,
        stopped: Stopped,
        *,
        zk_copy: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config = self._config = settings.config
        self._settings = settings
        self._stopped = stopped
        self._clock = clock
        self._metadata = KafkaMetadata(config)
        self._watermarks = ThrottledWatermarks(config, self._metadata, clock=clock)
        self._epochs = EpochCheck(config, lambda p, n: self.copy.count(p, REPLACED_KEY, n))
        self.copy: ZkCopy | NoCopy = NoCopy()
        if zk_copy:
            self.copy = ZkCopy(config, lambda: self._metadata.leaders(config.topic), clock=clock)
        self._gate: MinTrigger | None = None
        if settings.min_offsets is not None:
            self._gate = MinTrigger(settings.min_offsets, settings.max_trigger_delay)
        self._target: Offsets | None = None  # Trigger.AvailableNow: where the run ends
        # The last `latest` call: (start, watermarks, limit) -> end, and where each partition
        # of that batch begins, keyed by its start, for `ranges`.
        self._last: tuple[StreamOffsets, Bounds, int | None, StreamOffsets] | None = None
        self._begins: dict[int, tuple[int | None, int]] = {}

    def start(self) -> None:
        self._metadata.start()

    def close(self) -> None:
        """Copy the last completed position (even if ZooKeeper failed moments ago: it may
        be back), then disconnect."""
        try:
            self.copy.flush(final=True)
        finally:
            self.copy.close()
            self._epochs.close()
            self._metadata.close()

    def initial(self) -> StreamOffsets:
        """Where a new query starts: each partition at its `startingOffsets`, or `start`."""
        bounds = self._watermarks.refresh()
        offsets = starts(self._metadata, self._settings, bounds)
        now = self._watermarks.epochs()
        epochs = {p: e for p, e in now.items() if p in offsets and offsets[p] <= bounds[p][1]}
        out = StreamOffsets(offsets, epochs)
        self._epochs.made(out)
        return out

    def prepare_available_now(self) -> None:
        """`Trigger.AvailableNow`: read up to the high watermarks of now, then end."""
        self._target = {p: high for p, (_, high) in self._watermarks.refresh().items()}

    def latest(self, start: StreamOffsets, max_rows: int | None) -> StreamOffsets:
        """The end of the batch after `start` (the end of the last completed batch); `start`
        itself when there is nothing to read. Copies `start` to ZooKeeper."""
        bounds = self._watermarks.get()
        if self._last is not None and self._last[:3] == (start, bounds, max_rows):
            if self._last[3] == start:
                self.copy.flush()  # idle: a copy that failed is tried again
            return self._gated(start, self._last[3])  # nothing changed since the last call
        begins, held = self._begin_all(start, bounds)
        for p in held:  # its leader gave no verdict on its epoch: it waits for the next batch
            del begins[p]
        self._begins = {p: (start.offsets.get(p), b) for p, b in begins.items()}
        highs = {p: high for p, (_, high) in bounds.items()}
        ends = highs
        if self._target is not None:  # partitions added since the run began wait for the next;
            # a truncated log's high may lie below the target: never plan past high
            ends = {p: min(self._target.get(p, begins.get(p, 0)), highs[p]) for p in bounds}
        shares = admit({p: max(0, ends[p] - b) for p, b in begins.items()}, max_rows)
        offsets = start.offsets | {p: b + shares[p] for p, b in begins.items()}
        epochs, now = dict(start.epochs), self._watermarks.epochs()
        for p, b in begins.items():  # what the batch moves is known in the epochs of `bounds`
            if (start.offsets.get(p), offsets[p]) != (b, b):
                epochs.pop(p, None)
                if p in now and offsets[p] <= highs[p]:
                    epochs[p] = now[p]
        end = StreamOffsets(offsets, epochs)
        self._epochs.made(end)
        # Completed: everything below `start`. A partition the policy moved is copied once a
        # batch past the move completed (until then its record may hold an operator's move).
        completed = {p: o for p, o in start.offsets.items() if begins.get(p, o) == o}
        self.copy.offer(completed, now=end == start)
        self._last = None if held else (start, bounds, max_rows, end)  # held: ask again
        moved = any(p in start.offsets and b != start.offsets[p] for p, b in begins.items())
        return end if moved else self._gated(start, end)

    def _gated(self, start: StreamOffsets, end: StreamOffsets) -> StreamOffsets:
        """`end`, or `start` (no batch yet) while `minOffsetsPerTrigger` holds the batch back."""
        if self._gate is None or self._target is not None:
            return end
        available = sum(o - start.offsets.get(p, o) for p, o in end.offsets.items())
        return end if self._gate.ready(available, self._clock()) else start

    def ranges(self, start: StreamOffsets, end: StreamOffsets) -> list[KafkaRange]:
        """The tasks of the batch `[start, end)`: one per partition with offsets to read."""
        begins = {p: b for p, (s, b) in self._begins.items() if s == start.offsets.get(p)}
        unknown = [
            p for p, o in end.offsets.items() if p not in begins and o != start.offsets.get(p)
        ]
        if unknown:  # a batch planned before a restart: Spark runs it again from its offset log
            bounds = self._watermarks.get()  # a partition gone from the topic is left out
            asked = {p: bounds[p] for p in unknown if p in bounds}
            begins.update(self._begin_all(start, asked)[0])  # held ones: unchecked
        tasks = []
        for p, stop in sorted(end.offsets.items()):
            begin = begins.get(p)
            if begin is not None and begin < stop:
                tasks.append(KafkaRange(p, begin, stop))
        return tasks

    def highs(self) -> Offsets:
        """The high watermarks as last asked (no query; {} before the first)."""
        return {p: high for p, (_, high) in self._watermarks.known().items()}

    def _begin_all(self, start: StreamOffsets, asked: Bounds) -> tuple[Offsets, set[int]]:
        """Where each partition of `asked` (its `(low, high)`) begins when the last batch ended
        at `start`: below it where its log was truncated, else as `_begin` says; and the
        partitions whose leader gave no verdict on their epoch (they begin at `start`)."""
        epochs = {p: e for p, e in start.epochs.items() if p in asked}
        anchored = StreamOffsets(start.offsets, epochs)
        cuts, held = self._epochs.truncations(anchored, self._watermarks.epochs())
        begins = {}
        for p, (low, high) in asked.items():
            at = cuts[p].start if p in cuts else start.offsets.get(p)
            begins[p] = self._begin(p, at, low, high)
        return begins, held

    def _begin(self, p: int, start: int | None, low: int, high: int) -> int:
        """Where partition `p`'s batch begins when the last one ended at `start` (None: the
        partition is new to the query)."""
        if start is None:
            return low
        pm = PartitionManager(
            self._config.partition_policy(), start, topic=self._config.topic, partition=p
        )
        if not pm.out_of_range(low, high):
            return start
        position = self._config.out_of_range
        timestamp_offset = None
        if position.kind is PositionKind.TIMESTAMP and position.timestamp_ms is not None:
            timestamp_offset = self._metadata.offset_for_timestamp(
                self._config.topic, p, position.timestamp_ms
            )
        try:
            reset = pm.on_out_of_range(low, high, timestamp_offset=timestamp_offset)  # logs it
        except PartitionStopped:
            return self._resume_or_stop(p, start, low, high)
        assert reset is not None  # out of range, so the policy moved it
        if reset.lost_count:
            self.copy.count(p, LOST_KEY, reset.lost_count)
        return reset.new_start

    def _resume_or_stop(self, p: int, start: int, low: int, high: int) -> int:
        """Under `fail`: resume where an operator moved the partition, or stop the query."""
        moved = self.copy.operator_move(p)
        if moved is not None and low <= moved <= high:
            log.warning(
                "%s[%d]: offset %d is out of range (Kafka holds [%d, %d)); resuming at %d, "
                "where an operator moved it; lost %s [%d, %d)",
                self._config.topic,
                p,
                start,
                low,
                high,
                moved,
                count(max(0, moved - start), "offset"),
                start,
                max(start, moved),
            )
            if moved > start:
                self.copy.count(p, LOST_KEY, moved - start)
            return moved
        self.copy.stop(p, start, f"offset {start} is out of range; Kafka holds [{low}, {high})")
        raise self._stopped(p, start, low, high) from None


def starts(metadata: KafkaMetadata, settings: SourceSettings, bounds: Bounds) -> Offsets:
    """Where each partition of `bounds` starts: at its `startingOffsets` (JSON; -2 earliest,
    -1 latest), or else at the topic config's `start`."""
    topic, position = settings.config.topic, settings.config.start
    offsets: Offsets = {}
    for p, (low, high) in bounds.items():
        given = settings.starting.get(p)
        if given is None:
            offsets[p] = metadata.resolve(position, topic, p, bounds=(low, high))
        else:
            offsets[p] = {EARLIEST: low, LATEST: high}.get(given, given)
    return offsets

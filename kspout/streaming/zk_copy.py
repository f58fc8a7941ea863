"""A copy of the stream's progress in ZooKeeper, so `kspout status`/`lag` and Storm-era tools
see the query.

Spark's checkpoint is the source of truth for a streaming query: this copy is written after the
fact and never read back to decide where the query reads, with one exception, an operator's
move of a partition that `out_of_range = "fail"` stopped (below). Each partition's record is
storm-kafka's, at `<zk_root>/<spout_id>/partition_<n>` of the topic file (`kspout.zk.record`),
written with plain compare-and-set on the znode version: the stream is not an owner
(`kspout.ownership`), takes no claims and registers no instance. Under the record's `kspout`
key it adds `lost`, the offsets this spout id lost to out-of-range resets in total, and
`replaced`, the offsets it had read that an unclean leader election replaced (read again).

States of one partition's record, as this copy moves it:

    (absent or another writer's) --copy--> COPIED(offset)   the end of a completed batch
    COPIED --copy--> COPIED(later offset)       at most every `commit_interval`, and at once
                                                when the query is caught up (idle, or the end
                                                of an `availableNow` run)
    any --stop--> STOPPED(offset, reason)        `out_of_range = "fail"` stopped the query
    STOPPED --`kspout offsets set`--> MOVED(offset)   an operator's move: the query resumes
                                                there when it starts again (`operator_move`)
    MOVED --copy--> COPIED                       once a batch past the move completed

A write that finds the record changed by another writer reads it again and overwrites it, with
a warning: a streaming query and `KafkaSpout.run` must not share a spout id. ZooKeeper being
unreachable never stops the query: the copy waits (`RETRY`) and writes the latest position
then, and the query's end tries the last copy once more (`flush(final=True)`), so an outage that
ended moments before leaves the records at the query's last position.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping

from kspout.config import TopicConfig
from kspout.errors import KafkaUnavailable, OffsetConflict, ZooKeeperUnavailable
from kspout.lifecycle import Lifecycle
from kspout.policy import Backoff
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset
from kspout.zk.session import ZkSession

log = logging.getLogger(__name__)

# Seconds to wait after ZooKeeper (or Kafka, for the leaders) failed before copying again:
# 10 s, doubling while it keeps failing, at most 5 minutes (each try may wait ZK_PATIENCE).
RETRY = Backoff(initial=10.0, multiplier=2.0, max=300.0)
# Seconds one ZooKeeper call may retry, and connecting may take: the copy runs inside Spark's
# planning calls, which must not hang on an outage (the default 30 s would stall the query).
ZK_PATIENCE = 5.0

# Counts under the record's "kspout" key, totals over the spout id's life.
LOST_KEY = "lost"  # offsets lost to out-of-range resets
REPLACED_KEY = "replaced"  # offsets read, then replaced by an unclean leader election
COUNTS = (LOST_KEY, REPLACED_KEY)


class ZkCopy(Lifecycle):
    """Writes one stream's positions to its spout id's records; connects on first use.

    `leaders()` gives each partition's leader, which storm-kafka's record names beside the
    offset.
    """

    def __init__(
        self,
        config: TopicConfig,
        leaders: Callable[[], Mapping[int, tuple[str, int]]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._leaders = leaders
        self._clock = clock
        self._store: ZkOffsetStore | None = None
        self._versions: dict[int, int | None] = {}  # as last read or written
        # (offset, counts) as last written
        self._written: dict[int, tuple[int, dict[str, int]]] = {}
        self._counts_before: dict[int, dict[str, int]] = {}  # `COUNTS` as first read
        self._counts: dict[int, dict[str, int]] = {}  # counted since this copy started
        self._pending: dict[int, int] = {}  # the latest position offered
        self._dirty = False  # something offered or counted is not written yet
        self._written_at = float("-inf")
        self._retry_at = float("-inf")
        self._failures = 0  # copies failed in a row

    def start(self) -> None:
        if self._store is None:
            session = ZkSession(
                self._config, connect_timeout=ZK_PATIENCE, retry_timeout=ZK_PATIENCE
            )
            session.start()
            self._store = ZkOffsetStore(session, instance_id=f"stream-{uuid.uuid4().hex[:12]}")

    def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.session.close()

    def count(self, partition: int, key: str, count: int) -> None:
        """`count` more offsets of `partition` under `key` (`LOST_KEY`: lost to an
        out-of-range reset; `REPLACED_KEY`: replaced by an unclean leader election): the next
        copy adds them to the record's total."""
        counts = self._counts.setdefault(partition, {})
        counts[key] = counts.get(key, 0) + count
        self._dirty = True

    def offer(self, offsets: Mapping[int, int], *, now: bool) -> None:
        """The stream completed everything below `offsets`: copy them when `commit_interval`
        passed since the last copy, or at once with `now`."""
        if any(self._pending.get(p) != o for p, o in offsets.items()):
            self._pending.update(offsets)
            self._dirty = True
        if now or self._clock() - self._written_at >= self._config.commit_interval:
            self.flush()

    def flush(self, *, final: bool = False) -> None:
        """Copy what changed since the last copy (unless ZooKeeper failed moments ago, or with
        `final`: the last copy, at close, is tried anyway); costs nothing when nothing changed."""
        if not self._dirty or (self._clock() < self._retry_at and not final):
            return
        changed = {
            p: o for p, o in self._pending.items() if self._written.get(p) != (o, self._totals(p))
        }
        try:
            if changed:
                leaders = self._leaders()
                for p, offset in changed.items():
                    self._write(p, offset, leaders.get(p, ("", -1)))
        except (ZooKeeperUnavailable, KafkaUnavailable, OffsetConflict) as exc:
            self._failures += 1
            wait = RETRY.delay(self._failures)
            self._retry_at = self._clock() + wait
            log.warning(
                "%s: could not copy the stream's offsets to ZooKeeper (%s); trying again in %gs "
                "(the query goes on: its checkpoint holds its position)",
                self._config.zk_spout_path,
                exc,
                wait,
            )
            return
        if self._failures:
            log.info("%s: the stream's offsets are copied again", self._config.zk_spout_path)
        self._written_at = self._clock()
        self._dirty = False
        self._failures = 0

    def stop(self, partition: int, offset: int, reason: str) -> None:
        """Mark the partition stopped at `offset` (`kspout offsets show`/`status` print the
        reason and the command that resumes it)."""
        try:
            record = self._read(partition)
            if record is not None and record.stopped and record.offset == offset:
                return
            self._commit(partition, offset, ("", -1), stopped=reason)
        except ZooKeeperUnavailable as exc:
            log.warning("could not mark partition %d stopped in ZooKeeper: %s", partition, exc)

    def operator_move(self, partition: int) -> int | None:
        """Where an operator moved the partition's record with `kspout offsets set` since the
        stream last wrote it, or None (no move, or ZooKeeper did not answer)."""
        try:
            record = self._read(partition)
        except ZooKeeperUnavailable as exc:
            log.warning("could not read partition %d's record in ZooKeeper: %s", partition, exc)
            return None
        if record is None or record.stopped is not None:
            return None
        ours = record.data.get("kspout")
        moved = isinstance(ours, dict) and ours.get("source") == "operator"
        return record.offset if moved else None

    def _totals(self, partition: int) -> dict[str, int]:
        before = self._counts_before.get(partition, {})
        now = self._counts.get(partition, {})
        totals = {key: before.get(key, 0) + now.get(key, 0) for key in COUNTS}
        return {key: n for key, n in totals.items() if n}

    def _client(self) -> ZkOffsetStore:
        self.start()
        assert self._store is not None
        return self._store

    def _read(self, partition: int) -> StoredOffset | None:
        """The record as it is now (`TopicMismatch` if another topic's spout owns the id)."""
        record = self._client().read(partition)
        self._versions[partition] = None if record is None else record.version
        if partition not in self._counts_before:
            ours = record.data.get("kspout") if record is not None else None
            found = ours if isinstance(ours, dict) else {}
            self._counts_before[partition] = {
                key: n for key in COUNTS if isinstance(n := found.get(key), int) and n > 0
            }
        return record

    def _write(self, partition: int, offset: int, broker: tuple[str, int]) -> None:
        if partition not in self._versions:
            self._read(partition)
        try:
            self._commit(partition, offset, broker)
        except OffsetConflict:
            record = self._read(partition)
            writer = "someone" if record is None else f"{record.writer_name}/{record.writer_id}"
            log.warning(
                "%s was changed by %s since this stream copied it; overwriting it (a streaming "
                "query's position comes from its checkpoint; a streaming query and "
                "KafkaSpout.run must not share a spout id)",
                self._client().partition_path(partition),
                writer,
            )
            self._commit(partition, offset, broker)

    def _commit(
        self, partition: int, offset: int, broker: tuple[str, int], stopped: str | None = None
    ) -> None:
        totals = self._totals(partition)
        self._versions[partition] = self._client().commit(
            partition,
            offset,
            version=self._versions.get(partition),
            broker=broker,
            extra=totals or None,
            stopped=stopped,
        )
        self._written[partition] = (offset, totals)


class NoCopy:
    """Stands in for `ZkCopy` when the stream has no topic file (Spark's options alone): there
    is no spout id or ZooKeeper to copy to, and no operator's move to read."""

    def close(self) -> None:
        pass

    def count(self, partition: int, key: str, count: int) -> None:
        pass

    def offer(self, offsets: Mapping[int, int], *, now: bool) -> None:
        pass

    def flush(self, *, final: bool = False) -> None:
        pass

    def stop(self, partition: int, offset: int, reason: str) -> None:
        pass

    def operator_move(self, partition: int) -> int | None:
        return None

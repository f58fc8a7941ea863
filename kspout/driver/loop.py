"""The driver loop: one PartitionManager per partition, micro-batches out, outcomes in.

Each step plans every partition (due retries plus new offsets up to `batch_size`), submits
the plans as one micro-batch to an `Executor` (in-process for `kspout run`, Spark for the
Spark backend), keeps up to `max_batches_in_flight` batches running, applies the outcomes
that come back, writes dead letters, and commits each partition's commit point to ZooKeeper
every `commit_interval` seconds and on close.

The driver handles offsets only; payloads stay on the executors (dead letters are the one
exception: their payload is fetched again here, so the DLQ record carries the message).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from types import TracebackType

from kspout.config import TopicConfig
from kspout.errors import TopicNotFound
from kspout.kafka import DeadLetter, DeadLetterWriter, KafkaMetadata, PartitionFetcher
from kspout.lifecycle import Lifecycle
from kspout.offsets import ZkOffsetStore
from kspout.outcomes import describe_error
from kspout.partition_manager import OutOfRangeReset, PartitionManager, Stats
from kspout.policy import PositionKind
from kspout.tasks import Executor, PartitionTask, TaskResult

log = logging.getLogger(__name__)

IDLE_WAIT = 0.05  # seconds to wait when nothing is plannable (retries backing off, no data)
WATERMARK_MAX_AGE = 1.0  # seconds a partition's watermarks are reused while it has a backlog


@dataclass(slots=True)
class PartitionView:
    """One partition as the driver last saw it."""

    partition: int
    stats: Stats
    low: int
    high: int
    committed: int | None  # the offset last written to ZooKeeper

    @property
    def lag(self) -> int:
        """Offsets Kafka holds that are not finished yet."""
        return max(0, self.high - self.stats.commit_point)


@dataclass(slots=True)
class Progress:
    """A snapshot for progress displays and the final report."""

    topic: str
    batches: int
    elapsed: float
    partitions: list[PartitionView]
    resets: list[tuple[int, OutOfRangeReset]] = field(default_factory=list)
    batch_errors: int = 0

    def total(self, name: str) -> int:
        """Sum one `Stats` field over the partitions."""
        return sum(int(getattr(p.stats, name)) for p in self.partitions)

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)


class Driver(Lifecycle):
    """Runs a topic through an executor with Storm's guarantees, committing to ZooKeeper.

    Construct, `start()` (connects, registers, loads stored offsets), `run()` or `step()`,
    `close()` (final commit). Clock and sleep are injectable for tests.
    """

    def __init__(
        self,
        config: TopicConfig,
        executor: Executor,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        on_progress: Callable[[Progress], None] | None = None,
        progress_interval: float = 0.25,
    ) -> None:
        self.config = config
        self._executor = executor
        self._clock = clock
        self._sleep = sleep
        self._on_progress = on_progress
        self._progress_interval = progress_interval
        self._last_progress = float("-inf")
        self._metadata = KafkaMetadata(config)
        self._store = ZkOffsetStore(config)
        self._dlq = DeadLetterWriter(config)
        self._payloads = PartitionFetcher(config)  # re-reads dead letters' payloads
        self._pms: dict[int, PartitionManager] = {}
        self._versions: dict[int, int | None] = {}
        self._committed: dict[int, int | None] = {}
        self._watermarks: dict[int, tuple[int, int]] = {}
        self._watermarks_at: dict[int, float] = {}
        self._leaders: dict[int, tuple[str, int]] = {}
        self._in_flight: list[Future[list[TaskResult]]] = []
        self._resets: list[tuple[int, OutOfRangeReset]] = []
        self._batches = 0
        self._batch_errors = 0
        self._started_at = 0.0
        self._last_commit = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, load stored offsets, create a PartitionManager per partition, register.

        A failed start closes what it opened, so it leaves no live registration behind.
        """
        try:
            self._start()
        except BaseException:
            self._pms.clear()  # nothing to commit: close() after a failed start only disconnects
            self._disconnect()
            raise

    def _start(self) -> None:
        self._started_at = self._last_commit = self._clock()
        self._metadata.start()
        self._store.start()
        self._dlq.start()
        self._payloads.start()
        partitions = self._metadata.partitions(self.config.topic)
        if not partitions:
            raise TopicNotFound(self.config.topic, self.config.brokers)
        policy = self.config.partition_policy()
        for p in partitions:
            stored = self._store.read(p)
            if stored is not None:
                start, version = stored.offset, stored.version
                log.info("%s[%d] resumes at stored offset %d", self.config.topic, p, start)
            else:
                start = self._metadata.resolve(self.config.start, self.config.topic, p)
                version = None
                log.info(
                    "%s[%d] has no stored offset; starts at %s = %d",
                    self.config.topic,
                    p,
                    self.config.start,
                    start,
                )
            self._pms[p] = PartitionManager(
                policy, start, self._clock, topic=self.config.topic, partition=p
            )
            self._versions[p] = version
            self._committed[p] = start if stored is not None else None
        self._leaders = self._metadata.leaders(self.config.topic)
        self._store.register_instance()

    def close(self) -> None:
        """Wait for batches in flight, apply them, commit, and disconnect."""
        try:
            if self._pms:
                self._drain()
        finally:
            self._disconnect()

    def abort(self) -> None:
        """Stop now (a second Ctrl-C): cancel batches in flight, commit what was applied.

        Nothing is lost: offsets of abandoned batches are not committed, so they run again on
        the next start.
        """
        try:
            if self._pms:
                self._collect()
                self.commit()
        finally:
            self._disconnect(cancel=True)

    def _disconnect(self, *, cancel: bool = False) -> None:
        self._executor.close(cancel=cancel)
        self._payloads.close()
        self._dlq.close()
        self._store.close()
        self._metadata.close()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is not None and not issubclass(exc_type, Exception):
            self.abort()  # KeyboardInterrupt, SystemExit: do not wait for running batches
        else:
            self.close()

    # -- the loop ----------------------------------------------------------------------------

    def run(
        self,
        *,
        max_batches: int | None = None,
        until_caught_up: bool = False,
        stop: threading.Event | None = None,
    ) -> Progress:
        """Step until `stop` is set, `max_batches` ran, or (optionally) everything is finished."""
        while not (stop is not None and stop.is_set()):
            if max_batches is not None and self._batches >= max_batches:
                break
            submitted = self.step()
            if until_caught_up and self.caught_up():
                break
            if not submitted:
                self._wait(IDLE_WAIT)
        self._drain()
        return self.progress()

    def step(self) -> bool:
        """Plan and submit one micro-batch if possible, collect finished ones; True if submitted.

        With `max_batches_in_flight` batches running, it waits briefly for one to finish; if
        none does, it only expires offsets past `message_timeout` (a batch may run for longer
        than that: its roots time out and are retried while it still runs, as in Storm).
        """
        if self._full():
            self._wait(IDLE_WAIT)
        self._collect()
        tasks: list[PartitionTask] = []
        if self._full():
            for pm in self._pms.values():
                pm.expire()
        else:
            tasks = self._plan()
        if tasks:
            self._in_flight.append(self._executor.submit(tasks))
            self._batches += 1
        self._collect()
        self._write_dead_letters()
        if self._clock() - self._last_commit >= self.config.commit_interval:
            self.commit()
        now = self._clock()
        if self._on_progress is not None and now - self._last_progress >= self._progress_interval:
            self._last_progress = now
            self._on_progress(self.progress())
        return bool(tasks)

    def caught_up(self) -> bool:
        """True when nothing is in flight and every partition is finished up to its high mark."""
        if self._in_flight:
            return False
        for p, pm in self._pms.items():
            high = self._watermarks.get(p, (0, 0))[1]
            if pm.commit_point < high or pm.emitted_to != pm.commit_point:
                return False
        return True

    def commit(self) -> None:
        """Write every partition's commit point that moved since the last write."""
        self._last_commit = self._clock()
        for p, pm in self._pms.items():
            offset = pm.commit_point
            if offset == self._committed[p]:
                continue
            self._versions[p] = self._store.commit(
                p, offset, version=self._versions[p], broker=self._leaders.get(p, ("", -1))
            )
            self._committed[p] = offset

    def progress(self) -> Progress:
        """A snapshot of every partition's counts, watermarks and commits."""
        views = [
            PartitionView(p, pm.stats(), *self._watermarks.get(p, (0, 0)), self._committed[p])
            for p, pm in self._pms.items()
        ]
        return Progress(
            self.config.topic,
            self._batches,
            self._clock() - self._started_at,
            views,
            list(self._resets),
            self._batch_errors,
        )

    # -- internals ---------------------------------------------------------------------------

    def _full(self) -> bool:
        return len(self._in_flight) >= self.config.max_batches_in_flight

    def _wait(self, timeout: float) -> None:
        """Until a batch in flight finishes, or `timeout` seconds (sleeps when none runs)."""
        if self._in_flight:
            wait(self._in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        else:
            self._sleep(timeout)

    def _drain(self) -> None:
        """Apply every batch still in flight, write pending dead letters, commit."""
        while self._in_flight:
            wait(self._in_flight, return_when=FIRST_COMPLETED)
            self._collect()
        self._write_dead_letters()
        self.commit()

    def _plan(self) -> list[PartitionTask]:
        tasks: list[PartitionTask] = []
        topic = self.config.topic
        now = self._clock()
        for p, pm in self._pms.items():
            low, high = self._watermarks_of(p, pm, now)
            if pm.out_of_range(low, high):
                self._reset(p, pm, low, high)
            plan = pm.plan(high, self.config.batch_size)
            if plan:
                tasks.append(PartitionTask(topic, p, plan))
        return tasks

    def _watermarks_of(self, p: int, pm: PartitionManager, now: float) -> tuple[int, int]:
        """The partition's `(low, high)`, asked of Kafka only when the plan has reached the
        known high mark or the last answer is older than `WATERMARK_MAX_AGE`: a query costs a
        broker round trip, and the loop steps every few milliseconds while batches run."""
        cached = self._watermarks.get(p)
        if (
            cached is not None
            and pm.emitted_to < cached[1]
            and now - self._watermarks_at.get(p, float("-inf")) < WATERMARK_MAX_AGE
        ):
            return cached
        low, high = self._metadata.watermarks(self.config.topic, p)
        self._watermarks[p] = (low, high)
        self._watermarks_at[p] = now
        return low, high

    def _reset(self, p: int, pm: PartitionManager, low: int, high: int) -> None:
        position = pm.policy.out_of_range
        ts_offset = None
        if position.kind is PositionKind.TIMESTAMP and position.timestamp_ms is not None:
            ts_offset = self._metadata.offset_for_timestamp(
                self.config.topic, p, position.timestamp_ms
            )
        reset = pm.on_out_of_range(low, high, timestamp_offset=ts_offset)
        if reset is not None:
            self._resets.append((p, reset))

    def _collect(self) -> None:
        """Apply the results of every finished batch, in whatever order they finished."""
        finished = [f for f in self._in_flight if f.done()]
        for future in finished:
            self._in_flight.remove(future)
            try:
                results = future.result()
            except Exception as exc:
                # The batch's offsets stay in flight; their deadline turns them into TIMEOUT
                # failures, which are retried. Nothing is acked that was not processed.
                self._batch_errors += 1
                log.error("a micro-batch failed and will be retried: %s", describe_error(exc))
                continue
            for result in results:
                self._apply(result)

    def _apply(self, result: TaskResult) -> None:
        pm = self._pms[result.partition]
        pm.apply(result.outcomes, epoch=result.epoch)
        if result.out_of_range is not None:
            low, high = result.out_of_range
            self._watermarks[result.partition] = (low, high)
            self._reset(result.partition, pm, low, high)

    def _write_dead_letters(self) -> None:
        for p, pm in self._pms.items():
            tickets = pm.take_dead_letters()
            if not tickets:
                continue
            offsets = [t.offset for t in tickets]
            try:
                fetched = self._payloads.fetch(self.config.topic, p, [(o, o + 1) for o in offsets])
                payloads = {r.offset: r for r in fetched.records}
                self._dlq.write(
                    [
                        DeadLetter(
                            self.config.topic,
                            p,
                            t.offset,
                            t.attempts,
                            f"{t.reason.value if t.reason else 'deferred'} ({t.cause})",
                            t.error,
                            payloads.get(t.offset),
                        )
                        for t in tickets
                    ]
                )
            except Exception as exc:
                pm.dead_letter_failed(offsets)  # handed out again on the next step
                log.error(
                    "writing %d dead letters failed, will retry: %s",
                    len(offsets),
                    describe_error(exc),
                )
                continue
            pm.dead_lettered(offsets)
            log.warning(
                "%s[%d] dead-lettered %d offsets to %s",
                self.config.topic,
                p,
                len(offsets),
                self.config.dlq_topic,
            )

"""The driver loop: plan, submit, watch, apply, commit.

One PartitionManager per partition decides what to run; each step of the loop

1. takes in what running tasks said over the outcome channel (streamed outcomes, beats) and
   the results of batches that ended, and applies them (`_collect`); what user code raised is
   logged once per kind and partition, then counted and summed up (`FailureLog`);
2. times out the roots tasks are stuck on, holds the records queued behind them, and cancels
   batches whose every open task is stuck (`BatchTracker.watch`);
3. plans and submits the next batch: a group of suspects to run alone if one waits
   (`Isolation`), else due retries and new offsets of every partition whose circuit breaker
   lets it run (`_submit`);
4. hands dead letters to the background writer and confirms the ones it wrote;
5. commits every `commit_interval` seconds (the commit point and the finished runs above it,
   so a restart replays only what is unfinished), watches for commit points stuck against the
   chain's replay window (`window.py`), and resumes stopped partitions an operator moved.

Before that, each step follows the spout's ownership nodes (`kspout.ownership`): it claims the
partitions the assignment gives this instance, releases the ones it moved away (no new plans,
batches in flight finish, a final commit, then the claim goes), honours operators' pauses, and
drops every partition at once when its ZooKeeper session expired (its commits would be refused:
each one checks the claim in the same transaction).

Whose fault a failure is decides what it costs (design.md, "Failures: whose fault"): a
message's own failure spends its retry budget; an infrastructure failure releases the
offsets without spending anything and opens the partition's breaker; a dead worker makes
its task's open offsets suspects until isolation finds the one record that kills workers.

The driver handles offsets only; payloads stay on the executors (dead letters are the one
exception: the writer fetches their payload again, so the DLQ record carries the message).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, wait
from types import MappingProxyType, TracebackType

from kspout.channel.listener import OutcomeChannel
from kspout.config import TopicConfig
from kspout.contract import Executor, PartitionTask, TaskResult
from kspout.driver.batches import BatchTracker, Ended, RunningBatch
from kspout.driver.breaker import BreakerState, CircuitBreaker
from kspout.driver.commits import Committer
from kspout.driver.dead_letters import DeadLetterWorker
from kspout.driver.failure_log import FailureLog
from kspout.driver.failures import JobFailure, classify
from kspout.driver.isolation import Isolation, Suspects
from kspout.driver.metrics import REFRESH, MetricsExporter
from kspout.driver.out_of_range import OutOfRangeHandler
from kspout.driver.progress import InstanceReporter, PartitionView, Progress
from kspout.driver.watermarks import WatermarkCache
from kspout.driver.window import StallWatch, check_start
from kspout.errors import KafkaUnavailable, OffsetConflict, ReplayPastWindow
from kspout.kafka import KafkaMetadata
from kspout.kafka.group_mirror import GroupMirror
from kspout.lifecycle import Lifecycle
from kspout.ordering import KeyOrder, blockers_of
from kspout.outcomes import FailReason, describe_error
from kspout.ownership.membership import Membership
from kspout.partition_manager import PartitionManager, Plan, Span
from kspout.policy import Backoff
from kspout.wording import count
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset
from kspout.zk.registry import InstanceRegistry
from kspout.zk.session import ZkSession

log = logging.getLogger(__name__)

IDLE_WAIT = 0.05  # seconds to wait when nothing is plannable (retries backing off, no data)
# A partition taken again starts this many generations above the last one, so results of batches
# planned before it left are ignored (a partition's own resets add a few generations at most).
GENERATION_STRIDE = 1 << 20
OTHERS_EVERY = 1.0  # seconds between checks of the partitions other instances own (caught_up)
DRAIN_DEAD_LETTERS = 30.0  # seconds close() waits for dead letters still being written


class Driver(Lifecycle):
    """Runs a topic through an executor with Storm's guarantees, committing to ZooKeeper.

    Construct, `start()` (connects, registers, loads stored offsets), `run()` or `step()`,
    `close()` (final commit). Clock and sleep are injectable for tests.

    `replay_window` is the chain's (`Topology.replay_window()`, the dedup bolt's `[dedup]
    ttl`): with it, a start that would replay offsets finished longer ago is refused unless
    `replay_past_window`, and commit points stuck for half of it are reported.

    With `[metrics]`, a Prometheus endpoint shows a snapshot taken every `metrics_interval`
    seconds and at each commit (`metrics.py`); with `consumer_group`, each commit round is
    mirrored to that Kafka consumer group (`kspout.kafka.group_mirror`).
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
        replay_window: float | None = None,
        replay_past_window: bool = False,
        metrics_interval: float = REFRESH,
    ) -> None:
        self.config = config
        self._executor = executor
        self._clock = clock
        self._sleep = sleep
        self._on_progress = on_progress
        self._progress_interval = progress_interval
        self._last_progress = float("-inf")
        self._metadata = KafkaMetadata(config)
        self._zk = ZkSession(config)
        self._store = ZkOffsetStore(self._zk)
        self._registry = InstanceRegistry(self._zk, self._store.instance_id)
        self._dead_letters = DeadLetterWorker(config)
        self._failures = FailureLog(config.topic, clock)
        self._watermarks = WatermarkCache(self._metadata, config.topic, clock)
        self._out_of_range = OutOfRangeHandler(config, self._metadata, self._watermarks)
        self._membership = Membership(
            self._zk,
            self._store,
            self._registry,
            lambda: self._metadata.partitions(config.topic),
            clock,
            config.partition_refresh,
        )
        self._committer = Committer(
            self._store, clock, lambda: self._leaders, replay_window, self._membership.fence
        )
        self._replay_window = replay_window
        self._replay_past_window = replay_past_window
        self._stalls = StallWatch(config.topic, replay_window, clock)
        self._batches = BatchTracker(config.message_timeout)
        self._isolation = Isolation()
        self._channel: OutcomeChannel | None = None
        self._pms: dict[int, PartitionManager] = {}
        self._breakers: dict[int, CircuitBreaker] = {}
        self._dlq_breaker = CircuitBreaker(f"{config.dlq_topic} writes", self._infra_backoff())
        self._leaders: dict[int, tuple[str, int]] = {}
        self._releasing: dict[int, float] = {}  # partitions moving away -> release deadline
        self._pause_acked: set[int] = set()  # paused partitions whose pause this instance acked
        self._next_generation = 0
        self._others_asked_at = float("-inf")
        self._refused = 0  # commits refused: the claim was gone or the record changed
        self._dropped = 0  # partitions dropped because this instance lost them
        self._submitted = 0
        self._batch_errors = 0
        self._started_at = 0.0
        self._last_commit = 0.0
        self._metrics = MetricsExporter(config, clock, metrics_interval)
        self._group_mirror = GroupMirror(config)
        self._reporter = InstanceReporter(self._registry, clock, config.commit_interval)

    def _infra_backoff(self) -> Backoff:
        b = self.config.infra_backoff
        return Backoff(b.initial, b.multiplier, b.max)

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
        self._zk.start()
        self._dead_letters.start()
        self._metrics.start()  # first: a port taken is a config error, found before any claim
        self._group_mirror.start()
        topic = self.config.topic
        self._metadata.require_topic(topic)
        self._membership.start()
        self._membership.poll()
        records = self._claim(self._membership.mine())
        if self._replay_window is not None:
            check_start(topic, records, self._replay_window, allow=self._replay_past_window)
        self._leaders = self._metadata.leaders(topic)
        host = self._executor.channel_host()
        if host is not None:
            self._channel = OutcomeChannel(host)
            self._channel.start()
            assert self._channel.address is not None
            self._executor.attach(self._channel.address)
        if self._metrics.url is not None:  # in this instance's node, for `kspout status`
            self._registry.report({"metrics": self._metrics.url})

    def _claim(self, partitions: Iterable[int]) -> dict[int, StoredOffset]:
        """Claim and take on the partitions in `partitions` that no other instance holds."""
        topic, out = self.config.topic, {}
        for p in sorted(set(partitions) - self._pms.keys()):
            start = functools.partial(self._metadata.resolve, self.config.start, topic, p)
            try:
                stored = self._membership.claim(p, start)
            except KafkaUnavailable as exc:  # its start position: claimed at a later poll
                log.warning("%s[%d] not claimed yet: %s", topic, p, exc)
                continue
            if stored is not None:  # None: its last owner has not released it yet
                self._adopt(p, stored)
                out[p] = stored
        return out

    def _adopt(self, p: int, stored: StoredOffset) -> None:
        """Start running a claimed partition from its record."""
        topic = self.config.topic
        log.info(
            "%s[%d] claimed: resumes at offset %d, skipping %s finished above it",
            topic,
            p,
            stored.offset,
            count(sum(hi - lo for lo, hi in stored.done), "offset"),
        )
        if stored.stopped:
            self._out_of_range.stopped[p] = stored.stopped
            log.error("%s[%d] is stopped: %s", topic, p, stored.stopped)
        self._next_generation += GENERATION_STRIDE
        self._pms[p] = PartitionManager(
            self.config.partition_policy(),
            stored.offset,
            self._clock,
            topic=topic,
            partition=p,
            finished=stored.done,
            generation=self._next_generation,
        )
        self._committer.track(p, stored)
        self._seed_stall(p, stored)
        self._breakers[p] = CircuitBreaker(f"{topic}[{p}]", self._infra_backoff(), self._clock)

    def _drop(self, p: int) -> None:
        """Forget a partition this instance no longer owns (results still coming are ignored)."""
        self._pms.pop(p, None)
        self._breakers.pop(p, None)
        self._releasing.pop(p, None)
        self._pause_acked.discard(p)
        self._out_of_range.stopped.pop(p, None)
        self._isolation.drop_partition(p)
        self._committer.forget(p)
        self._failures.drop(p)

    def _seed_stall(self, p: int, stored: StoredOffset | None) -> None:
        """A stall the record shows (unfinished offsets above a commit point that has not
        moved since `advanced_at`) goes on across the restart."""
        if stored is None or stored.advanced_at is None:
            return
        if (stored.emitted or 0) > stored.offset:
            self._stalls.seed(p, stored.offset, stored.advanced_at)

    def close(self) -> None:
        """Wait for batches in flight, apply them, write pending dead letters, commit, and
        disconnect."""
        try:
            if self._pms:
                self.drain()
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
        self._dead_letters.close()
        if self._channel is not None:
            self._channel.close()
        self._zk.close()
        self._metadata.close()
        self._group_mirror.close()
        self._metrics.close()

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
        max_failures: int | None = None,
    ) -> Progress:
        """Step until `stop` is set, `max_batches` ran, more than `max_failures` records failed
        for their own fault (user code raised), or (optionally) everything is finished.

        On `stop` or `max_failures`, the executor stops soon (an in-process batch releases
        the records it has not started); then what runs is applied and committed.
        """
        while not (stop is not None and stop.is_set()):
            if max_batches is not None and self._submitted >= max_batches:
                break
            if max_failures is not None and self._failures.records > max_failures:
                log.error(
                    "%s: %s failed, more than max_failures=%d allows: stopping",
                    self.config.topic,
                    count(self._failures.records, "record"),
                    max_failures,
                )
                self._executor.stop_soon()
                break
            submitted = self.step()
            if until_caught_up and self.caught_up():
                break
            if not submitted:
                self._wait(IDLE_WAIT)
        else:  # `stop` was set
            self._executor.stop_soon()
        self.drain()
        progress = self.progress()
        self._failures.tick(final=True)
        self._warn_if_all_failed(progress)
        return progress

    def _warn_if_all_failed(self, progress: Progress) -> None:
        """Say loudly when no record succeeded and some failed: a broken handler must not
        look like a run that went through."""
        if not progress.failures or progress.total("acked") + progress.total("duplicates"):
            return
        kinds = "; ".join(
            f"{f.failure} ({f.records} {'record' if f.records == 1 else 'records'})"
            for f in progress.failures[:3]
        )
        log.error(
            "%s: EVERY RECORD FAILED in this run, none succeeded: %s. Fix the handler (the "
            "traceback is logged above); failed records are retried, then dead-lettered to %s "
            "(`kspout dlq show`) or skipped, per on_exhausted",
            self.config.topic,
            kinds,
            self.config.dlq_topic,
        )

    def step(self) -> bool:
        """One turn of the loop (see the module docstring); True if a batch was submitted."""
        if self._full():
            self._wait(IDLE_WAIT)
        self._collect()
        self._follow_ownership()
        submitted = False
        if self._full():
            for pm in self._pms.values():
                pm.expire()  # the fallback for batches whose tasks are silent
        else:
            submitted = self._submit()
            self._collect()  # an executor that runs a batch inside `submit` is done with it
        self._write_dead_letters()
        self._failures.tick()
        snapshot = None  # one progress snapshot per step, shared by whoever wants one
        if self._clock() - self._last_commit >= self.config.commit_interval:
            snapshot = self.commit()
        now = self._clock()
        if self._on_progress is not None and now - self._last_progress >= self._progress_interval:
            self._last_progress = now
            snapshot = self.progress() if snapshot is None else snapshot
            self._on_progress(snapshot)
        if self._metrics.due(now):
            self._metrics.publish(self.progress() if snapshot is None else snapshot)
        return submitted

    def caught_up(self) -> bool:
        """True when nothing runs or waits, every partition this instance runs is finished up
        to its high mark, and so is every other partition of the topic by its stored commit
        point (a stopped or paused partition waits for an operator, not for the loop). The
        rest of the topic matters when another instance owns it, or still holds it after a
        crash until its session expires: a run `until_caught_up` leaves nothing behind."""
        if len(self._batches) or len(self._isolation) or self._dead_letters.pending:
            return False
        if self._releasing or self._membership.mine() - self._pms.keys():
            return False  # partitions still moving
        for p, pm in self._pms.items():
            if p in self._out_of_range.stopped or p in self._membership.paused:
                continue
            high = self._watermarks.known(p)[1]
            if pm.commit_point < high or pm.emitted_to != pm.commit_point:
                return False
        return self._others_finished()

    def _others_finished(self) -> bool:
        """The partitions this instance does not run are committed up to their high marks
        (asked at most every `OTHERS_EVERY` seconds: one pipelined ZooKeeper read of their
        records and one batched Kafka query, each a round trip for all of them)."""
        now = self._clock()
        if now - self._others_asked_at < OTHERS_EVERY:
            return False
        self._others_asked_at = now
        partitions = self._membership.assignment.partitions
        try:
            others = set(partitions or self._metadata.partitions(self.config.topic))
        except KafkaUnavailable:
            return False
        others -= self._pms.keys()
        if self._watermarks.ask(others):  # some have no answer: not known to be finished
            return False
        records = self._store.read_many(others)
        for p in others:
            record = records.get(p)
            if record is None or (
                record.stopped is None and record.offset < self._watermarks.known(p)[1]
            ):
                return False
        return True

    def commit(self) -> Progress:
        """Resume stopped partitions an operator moved; write every commit point that moved.
        Returns the progress snapshot it reported (the step shares it)."""
        self._last_commit = self._clock()
        stopped = self._out_of_range.stopped
        for p, offset in self._committer.moved(stopped).items():
            abandoned = self._pms[p].restart_at(offset)
            self._out_of_range.resumed(p)
            self._isolation.drop_partition(p)
            if abandoned:
                log.warning(
                    "%s[%d]: unfinished offsets %s left behind by the move",
                    self.config.topic,
                    p,
                    abandoned,
                )
        for p, refused in self._committer.commit(self._pms, stopped):
            self._refuse(p, refused)
        self._stalls.observe({p: pm for p, pm in self._pms.items() if p not in stopped})
        for p, pm in self._pms.items():
            self._isolation.forget_below(p, pm.commit_point)
        self._failures.finished_below({p: pm.commit_point for p, pm in self._pms.items()})
        progress = self.progress()
        self._reporter.report(progress)  # when it changed, or as a heartbeat
        self._metrics.publish(progress)
        self._group_mirror.mirror(self._committer.committed_points())
        return progress

    # -- ownership ---------------------------------------------------------------------------

    def _follow_ownership(self) -> None:
        """Claim, release, pause and drop partitions as the ownership nodes say."""
        m = self._membership
        if m.take_lost():
            self._lose_all()
        if m.poll():
            mine = m.mine()
            deadline = self._clock() + 2 * self.config.message_timeout
            for p in self._pms.keys() - mine - self._releasing.keys():
                log.info("%s[%d] moves to another instance: releasing it", self.config.topic, p)
                self._releasing[p] = deadline
            for p in mine & self._releasing.keys():
                del self._releasing[p]  # assigned back before it went
            self._claim_running(mine)
        for p, deadline in list(self._releasing.items()):
            if self._quiet(p) or self._clock() >= deadline:
                self._let_go(p)
        self._follow_pauses()

    def _claim_running(self, partitions: set[int]) -> None:
        """`_claim` while running: a partition whose replay would pass the window stops."""
        window, topic = self._replay_window, self.config.topic
        for p, record in self._claim(partitions).items():
            if window is None:
                continue
            try:
                check_start(topic, {p: record}, window, allow=self._replay_past_window)
            except ReplayPastWindow as exc:
                self._out_of_range.stopped[p] = f"{exc} (`kspout offsets set` resumes it)"
                log.error("%s[%d] stopped: %s", topic, p, exc)

    def _quiet(self, p: int) -> bool:
        """Nothing of partition `p` runs or waits to run alone, no dead letter is unwritten."""
        if any(p in b.tasks and p not in b.finished for b in self._batches):
            return False
        if any(group.partition == p for group in self._isolation.waiting()):
            return False
        return not self._dead_letters.pending

    def _let_go(self, p: int) -> None:
        """Release a partition that moved away: final commit, then the claim goes."""
        pm = self._pms[p]
        for _, refused in self._committer.commit({p: pm}, self._out_of_range.stopped):
            self._refuse(p, refused)
            return
        self._membership.release(p)
        self._drop(p)
        log.info("%s[%d] released at offset %d", self.config.topic, p, pm.commit_point)

    def _refuse(self, p: int, exc: OffsetConflict) -> None:
        """A commit of `p` was refused: another instance (or an operator) owns it now."""
        self._refused += 1
        self._dropped += 1
        log.error("%s[%d]: commit refused (%s); dropping it", self.config.topic, p, exc)
        self._membership.release(p)  # if the claim is still ours, it is claimed afresh
        self._drop(p)

    def _lose_all(self) -> None:
        """The session expired: every claim is gone; try the final commits (each is refused,
        counted and logged, unless the partition is still unclaimed and unchanged), drop all."""
        log.error(
            "ZooKeeper session expired: the claims on partitions %s are gone; dropping them "
            "(what ran since the last commit runs again on their next owner)",
            sorted(self._pms),
        )
        for p, refused in self._committer.commit(self._pms, self._out_of_range.stopped):
            self._refuse(p, refused)
        for p in list(self._pms):
            self._dropped += 1
            self._drop(p)

    def _follow_pauses(self) -> None:
        """Ack pauses once nothing runs there; reload a resumed partition an operator moved."""
        m = self._membership
        for p in self._pause_acked - m.paused.keys():
            self._pause_acked.discard(p)
            self._reload_if_moved(p)
        for p in (m.paused.keys() & self._pms.keys()) - self._pause_acked:
            if not self._quiet(p):
                continue
            pm = self._pms[p]
            for _, refused in self._committer.commit({p: pm}, self._out_of_range.stopped):
                self._refuse(p, refused)
                break
            else:
                m.ack_pause(p, pm.commit_point)
                self._pause_acked.add(p)
                log.warning("%s[%d] paused at offset %d", self.config.topic, p, pm.commit_point)

    def _reload_if_moved(self, p: int) -> None:
        """Start over from the record if an operator moved it while the partition was paused."""
        record = self._store.read(p)
        if record is None or record.version == self._committer.version(p):
            log.warning("%s[%d] resumed", self.config.topic, p)
            return
        abandoned = self._pms[p].restart_at(record.offset)
        self._committer.track(p, record)
        self._isolation.drop_partition(p)
        log.warning(
            "%s[%d] resumed at offset %d (moved while paused; left behind: %s)",
            self.config.topic,
            p,
            record.offset,
            abandoned,
        )

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this driver (the bound port, for `port = 0`); None when
        it serves no metrics or has not started."""
        return self._metrics.url

    @property
    def partition_managers(self) -> Mapping[int, PartitionManager]:
        """The partitions this driver runs, read-only (for tools and benchmarks)."""
        return MappingProxyType(self._pms)

    def progress(self) -> Progress:
        """A snapshot of every partition's counts, watermarks, breakers and commits."""
        views = []
        for p, pm in self._pms.items():
            breaker = self._breakers[p]
            views.append(
                PartitionView(
                    p,
                    pm.stats(),
                    *self._watermarks.known(p),
                    self._committer.committed(p),
                    None if breaker.state is BreakerState.CLOSED else breaker.view(),
                    self._out_of_range.stopped.get(p),
                    self._stalls.stalls.get(p, 0),
                    self._stalls.stuck_for(p, pm),
                    p in self._membership.paused,
                    p in self._releasing,
                    committed_at=self._committer.written_at(p),
                )
            )
        return Progress(
            self.config.topic,
            self._submitted,
            self._clock() - self._started_at,
            views,
            list(self._out_of_range.resets),
            self._batch_errors,
            self._batches.cancelled,
            self._isolation.runs,
            self._membership.instance_id,
            self._refused,
            self._dropped,
            self._failures.summary(),
        )

    # -- collecting --------------------------------------------------------------------------

    def _full(self) -> bool:
        return len(self._batches) >= self.config.max_batches_in_flight

    def _wait(self, timeout: float) -> None:
        """Until a batch in flight finishes, or `timeout` seconds (sleeps when none runs)."""
        futures = self._batches.futures()
        if futures:
            wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        else:
            self._sleep(timeout)

    def drain(self) -> None:
        """Wait for every batch still in flight and apply it, write pending dead letters,
        commit (`run` and `close` end so; a test stepping a fake clock calls it after `step`)."""
        while len(self._batches):
            self._wait(IDLE_WAIT)
            self._collect()
        self._write_dead_letters()
        if self._dead_letters.pending and not self._dead_letters.wait(DRAIN_DEAD_LETTERS):
            log.error("dead letters still unwritten at close: their offsets stay uncommitted")
        self._write_dead_letters()
        self.commit()

    def _collect(self) -> None:
        """Apply what tasks streamed and what ended batches returned; watch the rest."""
        now = self._clock()
        messages = self._channel.drain() if self._channel is not None else []
        for batch, result in self._batches.absorb(messages, now):
            self._apply(batch, result)
        for ended in self._batches.ended():
            self._end(ended)
        for batch_id in self._batches.watch(self._pms, now):
            log.warning("batch %d: every task left in it is stuck; cancelling it", batch_id)
            self._executor.cancel(batch_id)
        for group in self._isolation.waiting():
            self._batches.hold_group(group, self._pms[group.partition], now)

    def _apply(self, batch: RunningBatch, result: TaskResult) -> None:
        p = result.partition
        pm = self._pms.get(p)
        if pm is None:
            return
        if result.attempt_died:  # Spark ran the task again after its worker died
            self._crashed(batch, p, "an earlier attempt of the task died")
            return
        pm.apply(result.outcomes, generation=result.generation)
        self._failures.record(p, result.outcomes)
        breaker = self._breakers[p]
        if result.infra_error is not None:
            breaker.failure(result.infra_error)
        else:
            breaker.success()
        if result.out_of_range is not None:
            try:
                self._out_of_range.hint(p, pm, result.generation)
            except KafkaUnavailable as exc:  # asked again when the partition is planned
                breaker.failure(describe_error(exc))

    def _end(self, ended: Ended) -> None:
        """A batch's job is over: apply its results, or decide what its failure costs."""
        batch = ended.batch
        self._metrics.batch_ended(self._clock() - batch.started_at)
        for result in ended.results:
            self._apply(batch, result)
        if ended.error is None:
            return
        open_partitions = [p for p in batch.tasks if p not in batch.finished]
        if batch.cancelled:
            for p in open_partitions:
                self._release(batch, p, "its batch was cancelled: another record in it hung")
            for p in ended.hung_partitions & self._breakers.keys():
                self._breakers[p].failure("a task hung outside any record (a dependency?)")
            return
        self._batch_errors += 1
        error = ended.error.strip().splitlines()[0][:300]
        if classify(ended.error) is JobFailure.CRASH:
            log.warning(
                "batch %d: a worker died (%s); isolating what it left open", batch.id, error
            )
            for p in open_partitions:
                self._crashed(batch, p, error)
        else:
            log.error("batch %d failed outside any message (%s); retrying it", batch.id, error)
            for p in open_partitions:
                self._release(batch, p, error)
                if p in self._breakers:
                    self._breakers[p].failure(error)

    def _open(self, batch: RunningBatch, p: int) -> list[Span]:
        """What `batch` left unsettled in partition `p`, at the attempts it ran them."""
        pm, generation = self._pms.get(p), batch.tasks[p].plan.generation
        if pm is None or pm.generation != generation:
            return []
        return [
            Span(lo, hi, span.attempt)
            for span in batch.open_spans(p)
            for lo, hi in pm.unsettled(span.start, span.end, span.attempt)
        ]

    def _release(self, batch: RunningBatch, p: int, error: str) -> None:
        for span in self._open(batch, p):
            self._pms[p].release(span.start, span.end, span.attempt, error)

    def _crashed(self, batch: RunningBatch, p: int, error: str) -> None:
        """A task of `batch` died: its open offsets become suspects, or, for a record that
        died alone, the culprit fails with CRASH."""
        if p not in self._pms:
            return  # it moved: its next owner runs what was open
        open_spans = self._open(batch, p)
        generation = batch.tasks[p].plan.generation
        group = batch.group
        if group is None or group.partition != p:
            self._isolation.suspect(p, generation, open_spans)
            return
        culprit = self._isolation.died(group, open_spans, batch.last_seen(p))
        if culprit is not None:
            attempt = batch.tasks[p].plan.attempt_of(culprit)
            reason = f"killed its Python worker when run alone ({error})"
            log.warning("%s[%d] offset %d %s", self.config.topic, p, culprit, reason)
            self._pms[p].fail(culprit, FailReason.CRASH, reason, attempt, generation=generation)

    # -- planning ----------------------------------------------------------------------------

    def _submit(self) -> bool:
        """Submit one batch: a group of suspects to run alone, or the next regular plan."""
        group = self._isolation.next()
        if group is not None:
            task = self._isolated(group)
            if task is None:
                return False
            self._start_batch([task], group)
            return True
        tasks = self._plan()
        if tasks:
            self._start_batch(tasks, None)
        return bool(tasks)

    def _start_batch(self, tasks: list[PartitionTask], group: Suspects | None) -> None:
        batch = self._submitted
        self._submitted += 1
        started = self._clock()
        future = self._executor.submit(batch, tasks)
        self._batches.add(batch, tasks, future, group, started_at=started)

    def _isolated(self, group: Suspects) -> PartitionTask | None:
        """The task that runs `group` alone, limited to what is still open in it."""
        pm = self._pms.get(group.partition)
        if pm is None or pm.generation != group.generation:
            return None
        spans = tuple(
            Span(lo, hi, span.attempt)
            for span in group.spans
            for lo, hi in pm.unsettled(span.start, span.end, span.attempt)
        )
        if not spans:
            return None
        return self._task(group.partition, Plan(spans, group.generation), pm)

    def _task(self, p: int, plan: Plan, pm: PartitionManager) -> PartitionTask:
        """The task for `plan`; with `ordering = key`, with the offsets that can hold back
        its records' keys (kspout.ordering)."""
        if self.config.ordering == "none":
            return PartitionTask(self.config.topic, p, plan)
        ranges = plan.ranges()
        blockers = blockers_of(pm.unfinished_below(ranges[-1][1]), ranges)
        return PartitionTask(self.config.topic, p, plan, KeyOrder(blockers))

    def _runnable(self) -> dict[int, PartitionManager]:
        """The partitions to plan now: not stopped, moving away or paused, the claims sure
        (ZooKeeper connected); with `ordering = key`, the last task over (a record in flight is
        never overtaken); and the breaker lets them run (a half-open one only while its probe
        batch is not out yet). What blocks every partition is looked up once per step."""
        m = self._membership
        if m.suspended:
            return {}
        blocked = self._out_of_range.stopped.keys() | self._releasing.keys() | m.paused.keys()
        keyed = self.config.ordering != "none"
        running, breakers = self._batches.running, self._breakers
        return {
            p: pm
            for p, pm in self._pms.items()
            if p not in blocked and not (keyed and running(p)) and breakers[p].allow()
        }

    def _plan(self) -> list[PartitionTask]:
        tasks: list[PartitionTask] = []
        runnable = self._runnable()
        # One batched watermark query for every partition that needs fresh ones.
        failed = self._watermarks.refresh({p: pm.emitted_to for p, pm in runnable.items()})
        for p, pm in runnable.items():
            breaker = self._breakers[p]
            if p in failed:  # no leader, broker down: this partition waits
                breaker.failure(describe_error(failed[p]))
                continue
            low, high = self._watermarks.known(p)
            self._out_of_range.check(p, pm, low, high)
            if p in self._out_of_range.stopped:
                continue
            plan = pm.plan(high, self.config.batch_size)
            if not plan:
                if breaker.state is BreakerState.HALF_OPEN:
                    breaker.success()  # nothing to probe with: the next batch is the probe
                continue
            plan, alone = self._isolation.carve(p, plan)
            self._isolation.queue_front(alone)
            if plan:
                tasks.append(self._task(p, plan, pm))
        return tasks

    # -- dead letters ------------------------------------------------------------------------

    def _write_dead_letters(self) -> None:
        """Confirm what the writer finished; hand it what the partitions gave up since."""
        for outcome in self._dead_letters.completed():
            pm = self._pms.get(outcome.partition)
            if pm is None:
                continue  # it moved: its next owner runs those offsets again
            if outcome.error is None:
                pm.dead_lettered(outcome.offsets)
                self._failures.dead_lettered(outcome.partition, outcome.offsets)
                self._dlq_breaker.success()
                log.warning(
                    "%s[%d] dead-lettered %s to %s",
                    self.config.topic,
                    outcome.partition,
                    count(len(outcome.offsets), "offset"),
                    self.config.dlq_topic,
                )
            else:
                pm.dead_letter_failed(outcome.offsets)  # handed out again later
                self._dlq_breaker.failure(outcome.error)
        breaker = self._dlq_breaker
        if breaker.state is BreakerState.OPEN:
            return  # the dead-letter topic keeps failing: wait, do not hammer it
        for p, pm in self._pms.items():
            tickets = pm.take_dead_letters()
            if not tickets:
                continue
            if breaker.state is BreakerState.HALF_OPEN and not breaker.allow():
                pm.dead_letter_failed([t.offset for t in tickets])  # after the probe's answer
                return
            offsets = [t.offset for t in tickets]
            self._dead_letters.submit(p, tickets, self._failures.tracebacks(p, offsets))

"""The driver loop: plan, submit, watch, apply, commit.

Each partition this instance owns is one `OwnedPartition` (`owned.py`): the PartitionManager
that decides what to run, its circuit breaker, and its state (running, stopped, paused,
releasing). Each step of the loop

1. takes in what running tasks said over the outcome channel (streamed outcomes, beats) and
   the results of batches that ended, and applies them (`_collect`); what user code raised is
   logged once per kind and partition, then counted and summed up (`FailureLog`);
2. times out the roots tasks are stuck on, holds the records queued behind them, and cancels
   batches whose every open task is stuck (`BatchTracker.watch`);
3. plans and submits the next batch (`Planner`): a group of suspects to run alone if one
   waits (`Isolation`), else due retries and new offsets of every running partition whose
   circuit breaker lets it run;
4. hands dead letters to the background writer and confirms the ones it wrote
   (`DeadLetterHandoff`);
5. commits every `commit_interval` seconds (the commit point and the finished runs above it,
   so a restart replays only what is unfinished), watches for commit points stuck against the
   chain's replay window (`window.py`), and resumes stopped partitions an operator moved.

Before that, each step follows the spout's ownership nodes (`Ownership`, `ownership.py`): it
claims the partitions the assignment gives this instance, releases the ones it moved away,
honours operators' pauses, and drops partitions this instance lost. That, the commits and the
instance's report are the loop's ZooKeeper work: during an outage it is held off and nothing new
is planned (`ZooKeeperOutage`, `zk_outage.py`); the run waits for ZooKeeper instead of ending.

Whose fault a failure is decides what it costs (design.md, "Failures: whose fault";
`FailureCosts`): a message's own failure spends its retry budget; an infrastructure failure
releases the offsets without spending anything and opens the partition's breaker; a dead
worker makes its task's open offsets suspects until isolation finds the one record that kills
workers.

The driver handles offsets only; payloads stay on the executors (dead letters are the one
exception: the writer fetches their payload again, so the DLQ record carries the message).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, wait
from types import TracebackType

from kspout.channel.listener import OutcomeChannel
from kspout.config import TopicConfig
from kspout.contract import Executor, TaskResult
from kspout.driver.batches import BatchTracker, Ended, RunningBatch
from kspout.driver.cluster_checks import check_cluster
from kspout.driver.commits import Committer
from kspout.driver.dead_letter_handoff import DeadLetterHandoff
from kspout.driver.dead_letters import DeadLetterWorker
from kspout.driver.failure_log import FailureLog
from kspout.driver.failures import FailureCosts
from kspout.driver.isolation import Isolation
from kspout.driver.metrics import REFRESH
from kspout.driver.out_of_range import OutOfRangeHandler
from kspout.driver.outlets import ProgressOutlets
from kspout.driver.owned import Managers
from kspout.driver.ownership import Ownership
from kspout.driver.planner import Planner
from kspout.driver.progress import (
    Progress,
    partition_views,
    warn_if_every_record_failed,
)
from kspout.driver.run_limits import Ending, RunLimits
from kspout.driver.truncation import TruncationCheck
from kspout.driver.watermarks import WatermarkCache
from kspout.driver.window import StallWatch, check_start
from kspout.driver.zk_outage import PATIENCE, ZooKeeperOutage
from kspout.errors import KafkaRefused, KafkaUnavailable
from kspout.kafka import EpochProbe, KafkaMetadata
from kspout.kafka.transactions import TransactionWatch
from kspout.lifecycle import Lifecycle
from kspout.outcomes import describe_error
from kspout.ownership.membership import Membership
from kspout.partition_manager import PartitionManager
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.registry import InstanceRegistry
from kspout.zk.session import ZkSession

log = logging.getLogger(__name__)

IDLE_WAIT = 0.05  # seconds to wait when nothing is plannable (retries backing off, no data)
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
        self._metadata = KafkaMetadata(config)
        self._zk = ZkSession(config, retry_timeout=PATIENCE)
        self._store = ZkOffsetStore(self._zk)
        self._registry = InstanceRegistry(self._zk, self._store.instance_id)
        self._dead_letters = DeadLetterWorker(config)
        self._failures = FailureLog(config.topic, clock)
        self._watermarks = WatermarkCache(self._metadata, config.topic, clock)
        self._out_of_range = OutOfRangeHandler(config, self._metadata, self._watermarks)
        self._truncation = TruncationCheck(EpochProbe(config))
        self._membership = Membership(
            self._zk,
            self._store,
            self._registry,
            lambda: self._metadata.partitions(config.topic),
            clock,
            config.partition_refresh,
        )
        self._outage = ZooKeeperOutage(config.zookeeper, self._membership, clock)
        self._committer = Committer(
            self._store, clock, lambda: self._leaders, replay_window, self._membership.fence
        )
        self._replay_window = replay_window
        self._replay_past_window = replay_past_window
        self._stalls = StallWatch(config.topic, replay_window, clock)
        self._batches = BatchTracker(config.message_timeout)
        self._isolation = Isolation()
        self._ownership = Ownership(
            config,
            self._membership,
            self._store,
            self._metadata,
            self._watermarks,
            self._committer,
            self._isolation,
            self._failures,
            self._stalls,
            self._batches,
            self._dead_letters,
            clock,
            replay_window,
            replay_past_window,
        )
        self._parts = self._ownership.partitions  # partition -> OwnedPartition
        self._managers = Managers(self._parts)
        self._planner = Planner(
            config,
            self._parts,
            self._isolation,
            self._watermarks,
            self._out_of_range,
            self._truncation,
            lambda: self._outage.away,
            self._batches.running,
        )
        self._costs = FailureCosts(config.topic, self._parts, self._isolation)
        self._handoff = DeadLetterHandoff(config, self._dead_letters, self._failures, self._parts)
        self._channel: OutcomeChannel | None = None
        self._leaders: dict[int, tuple[str, int]] = {}
        self._submitted = 0
        self._started_at = 0.0
        self._last_commit = 0.0
        self._outlets = ProgressOutlets(
            config, self._registry, clock, on_progress, progress_interval, metrics_interval
        )
        self._transactions = TransactionWatch(config, clock, self._metadata)
        self._refused: KafkaRefused | None = None  # the first refusal a task reported

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, load stored offsets, create a PartitionManager per partition, register.

        A failed start closes what it opened, so it leaves no live registration behind.
        """
        try:
            self._start()
        except BaseException:
            self._parts.clear()  # nothing to commit: close() after a failed start only disconnects
            self._disconnect()
            raise

    def _start(self) -> None:
        self._started_at = self._last_commit = self._clock()
        self._metadata.start()
        self._zk.start()
        self._dead_letters.start()
        self._outlets.start()  # first: a port taken is a config error, found before any claim
        self._transactions.start()
        topic = self.config.topic
        check_cluster(self.config, self._metadata)
        self._membership.start()
        self._membership.poll()
        records = self._ownership.claim(self._membership.mine())
        if self._replay_window is not None:
            check_start(topic, records, self._replay_window, allow=self._replay_past_window)
        self._leaders = self._metadata.leaders(topic)
        host = self._executor.channel_host()
        if host is not None:
            self._channel = OutcomeChannel(host)
            self._channel.start()
            assert self._channel.address is not None
            self._executor.attach(self._channel.address)
        self._outlets.announce()

    def close(self) -> None:
        """Wait for batches in flight, apply them, write pending dead letters, commit, and
        disconnect."""
        try:
            if self._parts:
                self.drain()
        finally:
            self._disconnect()

    def abort(self) -> None:
        """Stop now (a second Ctrl-C): cancel batches in flight, commit what was applied.

        Nothing is lost: offsets of abandoned batches are not committed, so they run again on
        the next start.
        """
        try:
            if self._parts:
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
        self._truncation.close()
        self._transactions.close()
        self._outlets.close()

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
        for their own fault (user code raised), Kafka refused this principal (`refused`), or
        (optionally) everything is finished.

        On `stop`, `max_failures` or a refusal, the executor stops soon (an in-process batch
        releases the records it has not started); then what runs is applied and committed, and
        a refusal is raised (`KafkaAccessDenied` naming the ACL to grant).
        """
        limits = RunLimits(max_batches, max_failures)
        while not (stop is not None and stop.is_set()):
            ending = limits.ending(
                self.config.topic, self._submitted, self._failures.records, self.refused
            )
            if ending is not None:
                if ending is Ending.SOON:
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
        if self.refused is not None:
            raise self.refused
        warn_if_every_record_failed(progress, self.config.dlq_topic)
        return progress

    @property
    def refused(self) -> KafkaRefused | None:
        """What Kafka refused this principal mid-run (a revoked ACL: a fetch, a dead-letter
        write, a handler's output), which no retry cures; None while nothing was."""
        return self._refused or self._handoff.refused

    def step(self) -> bool:
        """One turn of the loop (see the module docstring); True if a batch was submitted."""
        if self._full():
            self._wait(IDLE_WAIT)
        self._collect()
        self._outage.guard("following the ownership nodes", self._ownership.follow)
        submitted = False
        if self._full():
            for part in self._parts.values():
                part.manager.expire()  # the fallback for batches whose tasks are silent
        else:
            submitted = self._submit()
            self._collect()  # an executor that runs a batch inside `submit` is done with it
        self._handoff.exchange()
        self._failures.tick()
        snapshot = None  # one progress snapshot per step, shared by whoever wants one
        if self._clock() - self._last_commit >= self.config.commit_interval:
            snapshot = self.commit()
        self._outlets.step(snapshot, self.progress)
        return submitted

    def caught_up(self) -> bool:
        """True when nothing runs or waits and every partition of the topic is finished
        (`Ownership.caught_up`). The rest of the topic matters when another instance owns
        it, or still holds it after a crash until its session expires: a run
        `until_caught_up` leaves nothing behind."""
        return bool(self._outage.guard("checking the commit points", self._ownership.caught_up))

    def commit(self) -> Progress:
        """Resume stopped partitions an operator moved; write every commit point that moved.
        Returns the progress snapshot it reported (the step shares it)."""
        self._last_commit = self._clock()
        parts = self._parts
        self._outage.guard("committing", self._ownership.commit)
        self._stalls.observe({p: part.manager for p, part in parts.items() if part.stopped is None})
        highs = {p: self._watermarks.known(p)[1] for p in parts}
        self._transactions.observe(
            {p: high for p, high in highs.items() if parts[p].manager.commit_point >= high}
        )
        for p, part in parts.items():
            self._isolation.forget_below(p, part.manager.commit_point)
        self._failures.finished_below({p: part.manager.commit_point for p, part in parts.items()})
        progress = self.progress()
        self._outlets.committed(progress, self._committer.committed_points(), self._outage.guard)
        return progress

    @property
    def metrics_url(self) -> str | None:
        """Where Prometheus scrapes this driver (the bound port, for `port = 0`); None when
        it serves no metrics or has not started."""
        return self._outlets.metrics.url

    @property
    def partition_managers(self) -> Mapping[int, PartitionManager]:
        """The partitions this driver runs, read-only (for tools and benchmarks)."""
        return self._managers

    def progress(self) -> Progress:
        """A snapshot of every partition's counts, watermarks, breakers and commits."""
        views = partition_views(
            self._parts,
            self._watermarks,
            self._committer,
            self._stalls,
            self._membership.paused,
            self._transactions.waiting,
        )
        ownership = self._ownership
        return Progress(
            self.config.topic,
            self._submitted,
            self._clock() - self._started_at,
            views,
            list(self._out_of_range.resets),
            self._costs.errors,
            self._batches.cancelled,
            self._isolation.runs,
            self._membership.instance_id,
            ownership.refused,
            ownership.dropped,
            self._failures.summary(),
            self._outage.away_for(),
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
        self._handoff.exchange()
        if self._dead_letters.pending and not self._dead_letters.wait(DRAIN_DEAD_LETTERS):
            log.error("dead letters still unwritten at close: their offsets stay uncommitted")
        self._handoff.exchange()
        self.commit()
        self._outage.warn_unwritten()

    def _collect(self) -> None:
        """Apply what tasks streamed and what ended batches returned; watch the rest."""
        now = self._clock()
        messages = self._channel.drain() if self._channel is not None else []
        for batch, result in self._batches.absorb(messages, now):
            self._apply(batch, result)
        for ended in self._batches.ended():
            self._end(ended)
        for batch_id in self._batches.watch(self._managers, now):
            log.warning("batch %d: every task left in it is stuck; cancelling it", batch_id)
            self._executor.cancel(batch_id)
        for group in self._isolation.waiting():
            self._batches.hold_group(group, self._parts[group.partition].manager, now)

    def _apply(self, batch: RunningBatch, result: TaskResult) -> None:
        p = result.partition
        part = self._parts.get(p)
        if part is None:
            return
        if result.attempt_died:  # Spark ran the task again after its worker died
            self._costs.crashed(batch, p, "an earlier attempt of the task died")
            return
        if result.leader_epoch is not None:  # first: a rollback makes these outcomes stale
            self._truncation.fetched(part, result.generation, result.leader_epoch)
        part.manager.apply(result.outcomes, generation=result.generation)
        self._failures.record(p, result.outcomes)
        breaker = part.breaker
        self._refused = self._refused or result.refused
        if result.infra_error is not None:
            breaker.failure(result.infra_error)
        else:
            breaker.success()
        if result.out_of_range is not None:
            try:
                if not self._truncation.check([(part, result.out_of_range[1])]):
                    self._out_of_range.hint(part, result.generation)
            except KafkaUnavailable as exc:  # asked again when the partition is planned
                breaker.failure(describe_error(exc))

    def _end(self, ended: Ended) -> None:
        """A batch's job is over: apply its results, or decide what its failure costs."""
        batch = ended.batch
        self._outlets.metrics.batch_ended(self._clock() - batch.started_at)
        for result in ended.results:
            self._apply(batch, result)
        if ended.error is not None:
            self._costs.charge(ended, ended.error)

    # -- planning ----------------------------------------------------------------------------

    def _submit(self) -> bool:
        """Submit one batch: a group of suspects to run alone, or the next regular plan."""
        tasks, group = self._planner.next()
        if not tasks:
            return False
        batch = self._submitted
        self._submitted += 1
        started = self._clock()
        future = self._executor.submit(batch, tasks)
        self._batches.add(batch, tasks, future, group, started_at=started)
        return True

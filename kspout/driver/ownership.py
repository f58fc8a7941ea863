"""The driver's side of sharing a spout's partitions (`kspout.ownership`): which it runs.

Each loop turn (`follow`) takes in what the ownership nodes say:

* claims the partitions the assignment gives this instance and takes each on from its record
  (`claim`); one whose replay would pass the replay window stops instead of running;
* releases the ones assigned away: no new plans, batches in flight finish, a final commit,
  then the claim goes (after `2 * message_timeout` at the latest); one assigned back in time
  is kept;
* honours operators' pauses: once nothing runs there, a commit, then the pause is acked; a
  partition resumed after its ack starts over from its record if an operator moved it;
* drops every partition at once when the ZooKeeper session expired (its commits would be
  refused: each one checks the claim in the same transaction), and one whose commit was
  refused (another instance or an operator owns it now).

It keeps the driver's partition map (`partitions`): the one place a partition is added and
dropped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable

from kspout.config import TopicConfig
from kspout.driver.batches import BatchTracker
from kspout.driver.breaker import CircuitBreaker
from kspout.driver.commits import Committer
from kspout.driver.dead_letters import DeadLetterWorker
from kspout.driver.failure_log import FailureLog
from kspout.driver.isolation import Isolation
from kspout.driver.owned import OwnedPartition, PartitionState
from kspout.driver.watermarks import WatermarkCache
from kspout.driver.window import StallWatch, check_start
from kspout.errors import KafkaUnavailable, OffsetConflict, ReplayPastWindow
from kspout.kafka import KafkaMetadata
from kspout.ownership.membership import Membership
from kspout.partition_manager import PartitionManager
from kspout.wording import count
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset

log = logging.getLogger(__name__)

# A partition taken again starts this many generations above the last one, so results of batches
# planned before it left are ignored (a partition's own resets add a few generations at most).
GENERATION_STRIDE = 1 << 20
OTHERS_EVERY = 1.0  # seconds between checks of the partitions other instances own (caught_up)


class Ownership:
    """Claims, releases, pauses and drops the driver's partitions as the ownership nodes say.

    It reads the batches in flight, the isolation queue and the dead-letter writer to tell
    when a partition is quiet; `replay_window` and `replay_past_window` are the driver's
    (`check_start`).
    """

    def __init__(
        self,
        config: TopicConfig,
        membership: Membership,
        store: ZkOffsetStore,
        metadata: KafkaMetadata,
        watermarks: WatermarkCache,
        committer: Committer,
        isolation: Isolation,
        failures: FailureLog,
        stalls: StallWatch,
        batches: BatchTracker,
        dead_letters: DeadLetterWorker,
        clock: Callable[[], float],
        replay_window: float | None,
        replay_past_window: bool,
    ) -> None:
        self._config = config
        self._topic = config.topic
        self._membership = membership
        self._store = store
        self._metadata = metadata
        self._watermarks = watermarks
        self._committer = committer
        self._isolation = isolation
        self._failures = failures
        self._stalls = stalls
        self._batches = batches
        self._dead_letters = dead_letters
        self._clock = clock
        self._window = replay_window
        self._past_window = replay_past_window
        self.partitions: dict[int, OwnedPartition] = {}
        self._next_generation = 0
        self._others_asked_at = float("-inf")
        self.refused = 0  # commits refused: the claim was gone or the record changed
        self.dropped = 0  # partitions dropped because this instance lost them

    def caught_up(self) -> bool:
        """True when nothing runs or waits, no partition is on its way in or out, every
        partition this instance runs is finished up to its high mark, and so is every other
        partition of the topic by its stored commit point (a stopped or paused partition
        waits for an operator, not for the loop)."""
        if len(self._batches) or len(self._isolation) or self._dead_letters.pending:
            return False
        if any(part.state is PartitionState.RELEASING for part in self.partitions.values()):
            return False
        if self._membership.mine() - self.partitions.keys():
            return False  # assigned, not claimed yet
        paused = self._membership.paused
        for p, part in self.partitions.items():
            if part.stopped is not None or p in paused:
                continue
            pm, high = part.manager, self._watermarks.known(p)[1]
            if pm.commit_point < high or pm.emitted_to != pm.commit_point:
                return False
        return self._others_finished()

    # -- claiming ----------------------------------------------------------------------------

    def claim(self, partitions: Iterable[int]) -> dict[int, StoredOffset]:
        """Claim and take on the partitions in `partitions` that no other instance holds."""
        topic, out = self._topic, {}
        for p in sorted(set(partitions) - self.partitions.keys()):
            start = functools.partial(self._metadata.resolve, self._config.start, topic, p)
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
        topic = self._topic
        log.info(
            "%s[%d] claimed: resumes at offset %d, skipping %s finished above it",
            topic,
            p,
            stored.offset,
            count(sum(hi - lo for lo, hi in stored.done), "offset"),
        )
        self._next_generation += GENERATION_STRIDE
        manager = PartitionManager(
            self._config.partition_policy(),
            stored.offset,
            self._clock,
            topic=topic,
            partition=p,
            finished=stored.done,
            generation=self._next_generation,
            leader_epoch=stored.leader_epoch,
        )
        breaker = CircuitBreaker.waiting_as(
            f"{topic}[{p}]", self._config.infra_backoff, self._clock
        )
        part = OwnedPartition(p, manager, breaker)
        if stored.stopped:
            part.stop(stored.stopped)
            log.error("%s[%d] is stopped: %s", topic, p, stored.stopped)
        self.partitions[p] = part
        self._committer.track(p, stored)
        if stored.advanced_at is not None and (stored.emitted or 0) > stored.offset:
            # A stall the record shows (unfinished offsets above a commit point that has not
            # moved since `advanced_at`) goes on across the restart.
            self._stalls.seed(p, stored.offset, stored.advanced_at)

    def _claim_running(self, partitions: set[int]) -> None:
        """`claim` while running: a partition whose replay would pass the window stops."""
        window, topic = self._window, self._topic
        for p, record in self.claim(partitions).items():
            if window is None:
                continue
            try:
                check_start(topic, {p: record}, window, allow=self._past_window)
            except ReplayPastWindow as exc:
                self.partitions[p].stop(f"{exc} (`kspout offsets set` resumes it)")
                log.error("%s[%d] stopped: %s", topic, p, exc)

    # -- following the nodes -----------------------------------------------------------------

    def follow(self) -> None:
        """Claim, release, pause and drop partitions as the ownership nodes say."""
        m = self._membership
        if m.take_lost():
            self._lose_all()
        if m.poll():
            mine = m.mine()
            deadline = self._clock() + 2 * self._config.message_timeout
            for p, part in self.partitions.items():
                releasing = part.state is PartitionState.RELEASING
                if p not in mine and not releasing:
                    log.info("%s[%d] moves to another instance: releasing it", self._topic, p)
                    part.release(deadline)
                elif p in mine and releasing:
                    part.keep()  # assigned back before it went
            self._claim_running(mine)
        for p, part in list(self.partitions.items()):
            by = part.release_by
            if by is not None and (self._quiet(p) or self._clock() >= by):
                self._let_go(part)
        self._follow_pauses()

    def _let_go(self, part: OwnedPartition) -> None:
        """Release a partition that moved away: final commit, then the claim goes."""
        p = part.number
        for _, refused in self._committer.commit({p: part}):
            self.refuse(p, refused)
            return
        self._membership.release(p)
        self._drop(p)
        log.info("%s[%d] released at offset %d", self._topic, p, part.manager.commit_point)

    def _follow_pauses(self) -> None:
        """Ack pauses once nothing runs there; reload a resumed partition an operator moved."""
        paused = self._membership.paused
        for p, part in self.partitions.items():
            if part.state is PartitionState.PAUSED and p not in paused and part.resume():
                self._reload_if_moved(part)
        for p, part in self.partitions.items():
            if p in paused and part.state in (PartitionState.RUNNING, PartitionState.STOPPED):
                part.pause()
        for p, part in list(self.partitions.items()):
            if part.state is not PartitionState.PAUSED or part.pause_acked or not self._quiet(p):
                continue
            for _, refused in self._committer.commit({p: part}):
                self.refuse(p, refused)
                break
            else:
                offset = part.manager.commit_point
                self._membership.ack_pause(p, offset)
                part.ack_pause()
                log.warning("%s[%d] paused at offset %d", self._topic, p, offset)

    def _reload_if_moved(self, part: OwnedPartition) -> None:
        """Start over from the record if an operator moved it while the partition was paused."""
        p = part.number
        record = self._store.read(p)
        if record is None or record.version == self._committer.version(p):
            log.warning("%s[%d] resumed", self._topic, p)
            return
        abandoned = part.manager.restart_at(record.offset)
        self._committer.track(p, record)
        self._isolation.drop_partition(p)
        log.warning(
            "%s[%d] resumed at offset %d (moved while paused; left behind: %s)",
            self._topic,
            p,
            record.offset,
            abandoned,
        )

    def _quiet(self, p: int) -> bool:
        """Nothing of partition `p` runs or waits to run alone, no dead letter is unwritten."""
        if any(p in b.tasks and p not in b.finished for b in self._batches):
            return False
        if any(group.partition == p for group in self._isolation.waiting()):
            return False
        return not self._dead_letters.pending

    # -- committing --------------------------------------------------------------------------

    def commit(self) -> None:
        """Resume stopped partitions an operator moved; write every commit point that moved
        (`Committer.commit`); drop the partitions whose commit was refused."""
        parts = self.partitions
        for p, offset in self._committer.moved(parts).items():
            part = parts[p]
            abandoned = part.manager.restart_at(offset)
            part.moved()
            self._isolation.drop_partition(p)
            if abandoned:
                log.warning(
                    "%s[%d]: unfinished offsets %s left behind by the move",
                    self._topic,
                    p,
                    abandoned,
                )
        for p, refused in self._committer.commit(parts):
            self.refuse(p, refused)

    # -- losing ------------------------------------------------------------------------------

    def refuse(self, p: int, exc: OffsetConflict) -> None:
        """A commit of `p` was refused: another instance (or an operator) owns it now."""
        self.refused += 1
        self.dropped += 1
        log.error("%s[%d]: commit refused (%s); dropping it", self._topic, p, exc)
        self._membership.release(p)  # if the claim is still ours, it is claimed afresh
        self._drop(p)

    def _lose_all(self) -> None:
        """The session expired: every claim is gone; try the final commits (each is refused,
        counted and logged, unless the partition is still unclaimed and unchanged), drop all."""
        log.error(
            "ZooKeeper session expired: the claims on partitions %s are gone; dropping them "
            "(what ran since the last commit runs again on their next owner)",
            sorted(self.partitions),
        )
        try:
            for p, refused in self._committer.commit(self.partitions):
                self.refuse(p, refused)
        finally:  # dropped even when ZooKeeper went away again before the commits were sent
            for p in list(self.partitions):
                self.dropped += 1
                self._drop(p)

    def _drop(self, p: int) -> None:
        """Forget a partition this instance no longer owns (results still coming are ignored)."""
        del self.partitions[p]
        self._isolation.drop_partition(p)
        self._committer.forget(p)
        self._failures.drop(p)

    # -- the other instances' partitions -----------------------------------------------------

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
            others = set(partitions or self._metadata.partitions(self._topic))
        except KafkaUnavailable:
            return False
        others -= self.partitions.keys()
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

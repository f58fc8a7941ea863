"""Truncated logs: find offsets an unclean leader election replaced, and plan them again.

The way Kafka's consumer does it (KIP-320): each partition's manager keeps an anchor, the
leader epoch of the highest record fetched, stored beside the commit point. The anchor is
validated against the partition's leader (`EpochProbe`, OffsetForLeaderEpoch) when

* a partition starts from a stored anchor (a restart, or a claim from another instance),
* a fetch returns a record of a newer leader epoch than the anchor's (a new leader wrote),
* the partition's next offsets lie above the high watermark (a new leader with a shorter log
  that nothing was written to since), found by planning or by a task's fetch: before the
  `out_of_range` policy, which would skip.

When the leader's end of the anchor's epoch lies below the anchor, the manager rolls back
(`PartitionManager.on_truncation`): the replaced range is logged at WARNING and counted, and the
new messages at those offsets are processed; none is skipped. A check the leader does not
answer opens the partition's breaker; it is asked again when the partition is planned next.
"""

from __future__ import annotations

import logging
import weakref

from kspout.driver.owned import OwnedPartition
from kspout.errors import KafkaUnavailable
from kspout.kafka import EpochProbe
from kspout.outcomes import describe_error
from kspout.partition_manager import PartitionManager, Truncation

log = logging.getLogger(__name__)


class TruncationCheck:
    """Validates partitions' leader-epoch anchors; keeps every rollback for `progress`."""

    def __init__(self, probe: EpochProbe) -> None:
        self._probe = probe
        # Managers whose anchor needs no check at planning: validated, or set by this run.
        self._checked: weakref.WeakSet[PartitionManager] = weakref.WeakSet()
        self.truncations: list[tuple[int, Truncation]] = []

    def close(self) -> None:
        self._probe.close()

    def check(self, part: OwnedPartition, high: int) -> bool:
        """Before planning, or before the out-of-range policy acts on a task's hint: validate
        the anchor of a partition that starts from a stored one, or whose next offsets lie
        above `high`. False when the leader did not answer (the breaker opened: leave the
        partition alone this round)."""
        pm = part.manager
        anchor = pm.leader_epoch
        if anchor is None:
            return True
        if pm in self._checked and pm.emitted_to <= high:
            return True
        if self._validate(part, None):
            self._checked.add(pm)
            return True
        return False

    def fetched(self, part: OwnedPartition, generation: int, seen: tuple[int, int]) -> None:
        """A task of `generation` fetched up to `seen` (`TaskResult.leader_epoch`): a newer
        epoch than the anchor's is validated first; then the anchor moves up."""
        pm = part.manager
        if generation != pm.generation:
            return  # fetched before a rollback or reset: says nothing about the log now
        anchor = pm.leader_epoch
        if anchor is None:
            self._checked.add(pm)  # the first record this run fetched: nothing to validate
        elif seen[1] > anchor[1]:
            if not self._validate(part, seen[1]):
                return  # asked again on the next newer record or plan
            if pm.generation != generation:
                return  # rolled back: what this task fetched lies above the new start
        pm.saw_epoch(*seen)

    def _validate(self, part: OwnedPartition, new_epoch: int | None) -> bool:
        """Ask the leader about the anchor and roll back if it was truncated; False when the
        leader did not answer."""
        pm = part.manager
        anchor = pm.leader_epoch
        assert anchor is not None
        try:
            end = self._probe.end_of_epoch(part.number, *anchor)
        except KafkaUnavailable as exc:
            part.breaker.failure(describe_error(exc))
            return False
        if end is not None:
            cut = pm.on_truncation(*end, new_epoch)
            if cut is not None:
                self.truncations.append((part.number, cut))
        return True

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
The partitions a plan starts are checked in one question (`EpochProbe.ends_of_epochs`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from kspout.driver.owned import OwnedPartition
from kspout.kafka import EpochProbe
from kspout.kafka.epochs import VERDICT_TIMEOUT
from kspout.partition_manager import PartitionManager


class TruncationCheck:
    """Validates partitions' leader-epoch anchors (the rollbacks count in each partition's
    `Stats.replaced`)."""

    def __init__(self, probe: EpochProbe) -> None:
        self._probe = probe
        # Managers whose anchor needs no check at planning: validated, or set by this run.
        self._checked: weakref.WeakSet[PartitionManager] = weakref.WeakSet()

    def close(self) -> None:
        self._probe.close()

    def check(self, parts: Iterable[tuple[OwnedPartition, int]]) -> set[int]:
        """Before planning, or before the out-of-range policy acts on a task's hint: validate,
        in one question, the anchors of the partitions (with their high watermarks) that start
        from a stored one, or whose next offsets lie above high. Returns the partitions whose
        leader did not answer: their breakers opened, leave them alone this round."""
        due = [part for part, high in parts if self._due(part.manager, high)]
        if not due:
            return set()
        unanswered = self._validate(due, None)
        for part in due:
            if part.number not in unanswered:
                self._checked.add(part.manager)
        return unanswered

    def _due(self, pm: PartitionManager, high: int) -> bool:
        return pm.leader_epoch is not None and (pm not in self._checked or pm.emitted_to > high)

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
            if self._validate([part], seen[1]):
                return  # asked again on the next newer record or plan
            if pm.generation != generation:
                return  # rolled back: what this task fetched lies above the new start
        pm.saw_epoch(*seen)

    def _validate(self, parts: list[OwnedPartition], new_epoch: int | None) -> set[int]:
        """Ask the leaders about the partitions' anchors and roll back those truncated;
        returns the partitions whose leader did not answer (their breakers opened)."""
        anchors = {}
        for part in parts:
            anchor = part.manager.leader_epoch
            assert anchor is not None
            anchors[part.number] = anchor
        verdicts = self._probe.ends_of_epochs(anchors)
        unanswered = set()
        for part in parts:
            p = part.number
            if p not in verdicts:
                part.breaker.failure(
                    f"{part.manager.topic}[{p}]: no answer to a leader epoch check (offset "
                    f"{anchors[p][0]}, epoch {anchors[p][1]}) within {VERDICT_TIMEOUT:g}s; "
                    "check that the partition has a live leader (asked again)"
                )
                unanswered.add(p)
                continue
            end = verdicts[p]
            if end is not None:
                part.manager.on_truncation(*end, new_epoch)
        return unanswered

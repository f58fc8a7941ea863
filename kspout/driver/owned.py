"""One partition this instance owns: its manager, its breaker, and where it stands.

States, and the transitions with their reasons:

    RUNNING     planned as usual (while its breaker allows)
    STOPPED     `out_of_range = "fail"` found its next offsets gone from Kafka, or a claim's
                replay would pass the replay window: nothing is planned until an operator
                moves its offset
    PAUSED      an operator paused it (`kspout pause`): nothing new is planned; once nothing
                runs there, the driver commits and acks the pause
    RELEASING   the assignment gave it to another instance: nothing new is planned; batches in
                flight finish, a final commit, then the claim goes (at `release_by` at the
                latest)

    RUNNING    --stop(why)-->     STOPPED     its offsets are gone, or the replay passes the window
    STOPPED    --moved()-->       RUNNING     an operator moved its offset
    RUNNING    --pause()-->       PAUSED      an operator's pause node appeared
    STOPPED    --pause()-->       PAUSED      (the stop reason is kept)
    PAUSED     --ack_pause()-->   PAUSED, acked    nothing ran there, its commit went through
    PAUSED     --resume()-->      RUNNING, or STOPPED if it was stopped: the pause node is gone
    RUNNING, STOPPED, PAUSED --release(by)--> RELEASING    assigned to another instance
    RELEASING  --keep()-->        RUNNING, or STOPPED if it was stopped: assigned back in time

`stopped` is the reason its record carries as its stop mark. It outlives STOPPED while the
partition is paused or released, so the final commit keeps the mark and a resume returns to
STOPPED; a stop found there (a late out-of-range hint) is kept the same way, an operator's
move there clears it, and a second stop replaces the reason. Any other transition raises
`IllegalTransition`. Pure logic: the driver and its ownership collaborator call the
transitions, the ZooKeeper and Kafka work is theirs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping

from kspout.driver.breaker import CircuitBreaker
from kspout.partition_manager import PartitionManager


class PartitionState(enum.Enum):
    """Where an owned partition stands; see `OwnedPartition`."""

    RUNNING = "running"
    STOPPED = "stopped"
    PAUSED = "paused"
    RELEASING = "releasing"


class IllegalTransition(RuntimeError):
    """A transition its state does not allow: a bug in the driver, not in the setup."""

    def __init__(self, partition: int, state: PartitionState, transition: str) -> None:
        self.partition = partition
        self.state = state
        self.transition = transition
        super().__init__(
            f"partition {partition}: `{transition}` is not allowed while {state.value} "
            "(a bug in kspout's driver: please report it with this log)"
        )


class OwnedPartition:
    """A partition this instance claimed: the rules that plan it, its breaker, its state."""

    __slots__ = ("_acked", "_release_by", "_state", "_stopped", "breaker", "manager", "number")

    def __init__(self, number: int, manager: PartitionManager, breaker: CircuitBreaker) -> None:
        self.number = number
        self.manager = manager
        self.breaker = breaker
        self._state = PartitionState.RUNNING
        self._stopped: str | None = None
        self._release_by: float | None = None
        self._acked = False

    @property
    def state(self) -> PartitionState:
        return self._state

    @property
    def stopped(self) -> str | None:
        """Why it stopped (its record's stop mark); None when it is not stopped."""
        return self._stopped

    @property
    def release_by(self) -> float | None:
        """While RELEASING: the clock time the claim goes even if something still runs."""
        return self._release_by

    @property
    def pause_acked(self) -> bool:
        """While PAUSED: this instance told the operator nothing runs there any more."""
        return self._acked

    @property
    def runnable(self) -> bool:
        """Planned as usual (its breaker still has a say)."""
        return self._state is PartitionState.RUNNING

    def stop(self, why: str) -> None:
        """Its next offsets are gone (`out_of_range = "fail"`), or a replay would pass the
        window: it waits for an operator's move."""
        self._stopped = why
        if self._state is PartitionState.RUNNING:
            self._state = PartitionState.STOPPED

    def moved(self) -> None:
        """An operator moved the stopped partition's offset: it runs again."""
        self._require(self._stopped is not None, "moved")
        self._stopped = None
        if self._state is PartitionState.STOPPED:
            self._state = PartitionState.RUNNING

    def pause(self) -> None:
        """An operator paused it: plan nothing new, ack once quiet."""
        self._require(self._state in (PartitionState.RUNNING, PartitionState.STOPPED), "pause")
        self._state = PartitionState.PAUSED
        self._acked = False

    def ack_pause(self) -> None:
        """Nothing runs there and its commit went through: the pause is acked."""
        self._require(self._state is PartitionState.PAUSED and not self._acked, "ack_pause")
        self._acked = True

    def resume(self) -> bool:
        """The operator's pause is gone: back to where it was. True when the pause had been
        acked (an operator may have moved the offset meanwhile)."""
        self._require(self._state is PartitionState.PAUSED, "resume")
        acked, self._acked = self._acked, False
        self._state = self._left_alone()
        return acked

    def release(self, by: float) -> None:
        """Assigned to another instance: finish what runs, commit, let the claim go by `by`."""
        self._require(self._state is not PartitionState.RELEASING, "release")
        self._state = PartitionState.RELEASING
        self._release_by = by
        self._acked = False

    def keep(self) -> None:
        """Assigned back to this instance before it went."""
        self._require(self._state is PartitionState.RELEASING, "keep")
        self._release_by = None
        self._state = self._left_alone()

    def _left_alone(self) -> PartitionState:
        """The state with no pause and no release: stopped or running."""
        return PartitionState.RUNNING if self._stopped is None else PartitionState.STOPPED

    def _require(self, allowed: bool, transition: str) -> None:
        if not allowed:
            raise IllegalTransition(self.number, self._state, transition)


class Managers(Mapping[int, PartitionManager]):
    """The partition managers of a partition map, as a read-only view (no copy)."""

    def __init__(self, partitions: Mapping[int, OwnedPartition]) -> None:
        self._partitions = partitions

    def __getitem__(self, partition: int) -> PartitionManager:
        return self._partitions[partition].manager

    def __iter__(self) -> Iterator[int]:
        return iter(self._partitions)

    def __len__(self) -> int:
        return len(self._partitions)

"""OwnedPartition: one state per owned partition, its transitions, and the illegal ones refused.

Pure logic: a real PartitionManager and CircuitBreaker, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kspout.config import TopicConfig
from kspout.driver.breaker import CircuitBreaker
from kspout.driver.owned import IllegalTransition, Managers, OwnedPartition, PartitionState
from kspout.partition_manager import PartitionManager

RUNNING, STOPPED = PartitionState.RUNNING, PartitionState.STOPPED
PAUSED, RELEASING = PartitionState.PAUSED, PartitionState.RELEASING
WHY = "offset 0 is out of range; Kafka holds [150, 400)"


def owned(partition: int = 3) -> OwnedPartition:
    config = TopicConfig(topic="orders", spout_id="s1")
    pm = PartitionManager(
        config.partition_policy(), 0, lambda: 0.0, topic="orders", partition=partition
    )
    breaker = CircuitBreaker.waiting_as(f"orders[{partition}]", config.infra_backoff)
    return OwnedPartition(partition, pm, breaker)


def in_state(state: PartitionState) -> OwnedPartition:
    """A partition brought to `state` by legal transitions (STOPPED: with `WHY`)."""
    part = owned()
    if state is STOPPED:
        part.stop(WHY)
    elif state is PAUSED:
        part.pause()
    elif state is RELEASING:
        part.release(by=10.0)
    assert part.state is state
    return part


def test_a_claimed_partition_runs() -> None:
    part = owned()
    assert (part.state, part.runnable, part.stopped) == (RUNNING, True, None)
    assert (part.release_by, part.pause_acked) == (None, False)


def test_a_stop_waits_for_the_operators_move() -> None:
    part = owned()
    part.stop(WHY)
    assert (part.state, part.runnable, part.stopped) == (STOPPED, False, WHY)
    part.stop("the replay passes the window")
    assert (part.state, part.stopped) == (STOPPED, "the replay passes the window")
    part.moved()
    assert (part.state, part.runnable, part.stopped) == (RUNNING, True, None)


def test_a_pause_is_acked_once_and_a_resume_says_whether_it_was() -> None:
    part = owned()
    part.pause()
    assert (part.state, part.runnable, part.pause_acked) == (PAUSED, False, False)
    part.ack_pause()
    assert part.pause_acked
    assert part.resume() is True, "acked: the operator may have moved it meanwhile"
    assert (part.state, part.runnable, part.pause_acked) == (RUNNING, True, False)
    part.pause()
    assert part.resume() is False, "resumed before its ack: nothing can have moved it"
    assert part.state is RUNNING


def test_a_stopped_partition_paused_and_resumed_is_still_stopped() -> None:
    part = in_state(STOPPED)
    part.pause()
    assert (part.state, part.stopped) == (PAUSED, WHY), "the final commit keeps the stop mark"
    part.ack_pause()
    assert part.resume() is True
    assert (part.state, part.stopped) == (STOPPED, WHY)


def test_a_stop_found_while_paused_shows_after_the_resume() -> None:
    part = in_state(PAUSED)
    part.stop(WHY)  # a late out-of-range hint of a batch that was still running
    assert (part.state, part.stopped) == (PAUSED, WHY)
    part.resume()
    assert part.state is STOPPED


@pytest.mark.parametrize("before", [RUNNING, STOPPED, PAUSED])
def test_a_release_leaves_and_a_keep_comes_back(before: PartitionState) -> None:
    part = in_state(before)
    if before is PAUSED:
        part.ack_pause()
    part.release(by=42.0)
    assert (part.state, part.runnable, part.release_by) == (RELEASING, False, 42.0)
    assert not part.pause_acked
    part.keep()  # assigned back in time: a pause is followed afresh from the nodes
    assert part.state is (STOPPED if before is STOPPED else RUNNING)
    assert part.release_by is None


def test_a_stop_while_releasing_is_kept_for_the_final_commit() -> None:
    part = in_state(RELEASING)
    part.stop(WHY)
    assert (part.state, part.stopped) == (RELEASING, WHY)
    part.keep()
    assert part.state is STOPPED


def test_an_operators_move_while_releasing_clears_the_stop() -> None:
    part = in_state(STOPPED)
    part.release(by=1.0)
    part.moved()
    assert (part.state, part.stopped) == (RELEASING, None)
    part.keep()
    assert part.state is RUNNING


TRANSITIONS: dict[str, Callable[[OwnedPartition], object]] = {
    "moved": lambda part: part.moved(),
    "pause": lambda part: part.pause(),
    "ack_pause": lambda part: part.ack_pause(),
    "resume": lambda part: part.resume(),
    "release": lambda part: part.release(by=5.0),
    "keep": lambda part: part.keep(),
}
# Which transition each state allows (`stop` is allowed in every state).
ALLOWED = {
    RUNNING: {"pause", "release"},
    STOPPED: {"moved", "pause", "release"},
    PAUSED: {"ack_pause", "resume", "release"},
    RELEASING: {"keep"},
}


@pytest.mark.parametrize("state", list(PartitionState))
@pytest.mark.parametrize("transition", list(TRANSITIONS))
def test_every_transition_a_state_does_not_allow_is_an_error(
    state: PartitionState, transition: str
) -> None:
    part = in_state(state)
    if transition in ALLOWED[state]:
        TRANSITIONS[transition](part)
        return
    with pytest.raises(IllegalTransition) as caught:
        TRANSITIONS[transition](part)
    assert (caught.value.partition, caught.value.state) == (3, state)
    assert f"`{transition}` is not allowed while {state.value}" in str(caught.value)
    assert part.state is state, "a refused transition changes nothing"


def test_an_acked_pause_is_not_acked_twice() -> None:
    part = in_state(PAUSED)
    part.ack_pause()
    with pytest.raises(IllegalTransition):
        part.ack_pause()


def test_the_managers_view_follows_the_partition_map() -> None:
    parts = {3: owned(3)}
    managers = Managers(parts)
    assert dict(managers) == {3: parts[3].manager}
    parts[5] = owned(5)
    assert list(managers) == [3, 5] and len(managers) == 2
    del parts[3]
    assert 3 not in managers and managers[5] is parts[5].manager

"""The replay window: how far back a replay may reach before the dedup bolt has forgotten.

The dedup bolt keeps a message's DONE record `[dedup] ttl` seconds; replayed later, the
message applies its effect again. The chain declares that window (`Bolt.replay_window`), and
the driver then

* refuses to start when the restart would process again offsets that may have been finished
  longer ago than the window and are not recorded as finished (`check_start`; the caller may
  override it), and
* warns loudly, once per episode and partition, when a commit point has stood still for more
  than half the window with unfinished offsets above it, and counts those episodes
  (`StallWatch`): a restart or an operator's move then would soon replay past the window.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kspout.errors import ReplayPastWindow
from kspout.partition_manager import (
    UNPLANNED,
    DeadLetterPending,
    InFlight,
    PartitionManager,
    Waiting,
)
from kspout.wording import count
from kspout.zk.record import StoredOffset, describe_replay, now_ms

log = logging.getLogger(__name__)


def check_start(
    topic: str, stored: Mapping[int, StoredOffset], window: float, *, allow: bool
) -> None:
    """Raise `ReplayPastWindow` when a restart at the stored offsets would process again
    offsets that may have been finished more than `window` seconds ago; with `allow`, log it."""
    now = now_ms()
    details = []
    for record in stored.values():
        ranges = record.replay_past_window(record.offset, window, now, keep_done=True)
        if ranges:
            details.append(describe_replay(record, ranges, now))
    if not details:
        return
    error = ReplayPastWindow(
        topic,
        window,
        details,
        "pass --replay-past-window to `kspout run`, or replay_past_window=True to KafkaSpout",
    )
    if not allow:
        raise error
    log.warning("starting anyway (replay past the window allowed): %s", error)


@dataclass(slots=True)
class _Episode:
    commit_point: int
    since: float  # clock value the commit point has stood still since
    warned: bool = False


class StallWatch:
    """Commit points stuck with unfinished offsets above them, against the replay window."""

    def __init__(self, topic: str, window: float | None, clock: Callable[[], float]) -> None:
        self._topic = topic
        self._window = window
        self._clock = clock
        self._episodes: dict[int, _Episode] = {}
        self.stalls: dict[int, int] = {}  # episodes past half the window, per partition

    def seed(self, partition: int, commit_point: int, advanced_at: int) -> None:
        """A partition resumed at `commit_point`, which has stood there since `advanced_at`
        (wall ms, from its record): a stall goes on across a restart."""
        stood = max(0.0, (now_ms() - advanced_at) / 1000)
        self._episodes[partition] = _Episode(commit_point, self._clock() - stood)
        self.stalls[partition] = 0

    def stuck_for(self, partition: int, pm: PartitionManager) -> float | None:
        """Seconds the commit point has stood still with unfinished offsets above it."""
        episode = self._episodes.get(partition)
        if episode is None or pm.commit_point != episode.commit_point:
            return None
        if pm.emitted_to == pm.commit_point:
            return None
        return self._clock() - episode.since

    def observe(self, pms: Mapping[int, PartitionManager]) -> None:
        """Start, end or report each partition's episode (called at each commit)."""
        now = self._clock()
        for p, pm in pms.items():
            episode = self._episodes.get(p)
            if episode is None or self.stuck_for(p, pm) is None:
                self._episodes[p] = _Episode(pm.commit_point, now)
                self.stalls.setdefault(p, 0)
                continue
            stood = now - episode.since
            if self._window is None or episode.warned or stood <= self._window / 2:
                continue
            episode.warned = True
            self.stalls[p] += 1
            log.warning(
                "%s[%d]: the commit point has been stuck at %d for %.0fs, more than half the "
                "dedup window (%gs), with %s above it; held by %s. A restart replays "
                "only what is unfinished, but an operator's move back past it, or a stall "
                "longer than the window, would apply effects again: fix what holds it",
                self._topic,
                p,
                pm.commit_point,
                stood,
                self._window,
                count(pm.emitted_to - pm.commit_point, "offset"),
                holder(pm),
            )


def holder(pm: PartitionManager) -> str:
    """What keeps the commit point where it is: the state of the offset at it."""
    offset = pm.commit_point
    state = pm.state_of(offset)
    if isinstance(state, InFlight):
        return f"offset {offset}, in flight (attempt {state.attempt})"
    if isinstance(state, Waiting):
        why = "deferred" if state.reason is None else f"{state.reason.value}: {state.error}"
        return f"offset {offset}, waiting for attempt {state.attempt + 1} ({why})"
    if isinstance(state, DeadLetterPending):
        return f"offset {offset}, waiting for its dead-letter write ({state.cause}: {state.error})"
    if state is UNPLANNED:
        return f"offset {offset}, not replayed yet"
    return f"offset {offset}"

"""The stream's offsets as Spark checkpoints them, and how a read limit splits between partitions.

Pure logic, no I/O. Offsets are JSON in the shape of Spark's own Kafka source,
`{"<topic>": {"<partition>": <next offset>}}`: Spark writes them to the checkpoint's offset log
and shows them in the query's progress. The topic is kept so that a checkpoint reused for
another topic is refused instead of applying one topic's offsets to another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kspout.streaming.errors import CheckpointTopicMismatch

Offsets = dict[int, int]  # partition -> next offset to read


def encode(topic: str, offsets: Mapping[int, int]) -> dict[str, dict[str, int]]:
    """Offsets as the JSON Spark checkpoints: `{topic: {"<partition>": offset}}`."""
    return {topic: {str(p): offsets[p] for p in sorted(offsets)}}


def decode(topic: str, offsets: Mapping[str, object]) -> Offsets:
    """The partitions' offsets from checkpointed JSON; `CheckpointTopicMismatch` when the JSON
    is another topic's."""
    found = offsets.get(topic)
    if not isinstance(found, dict) or len(offsets) != 1:
        raise CheckpointTopicMismatch(sorted(offsets), topic)
    return {int(p): int(o) for p, o in found.items()}


def admit(backlog: Mapping[int, int], max_rows: int | None) -> Offsets:
    """How many of each partition's `backlog` offsets a batch takes under `max_rows` (None: all).

    The shares add up to exactly `min(max_rows, total backlog)`. Each partition with a backlog
    gets one offset first (when `max_rows` allows), so a small partition beside a busy one is
    never starved by rounding down; the rest is split in proportion to the backlogs, as Spark's
    Kafka source splits `maxOffsetsPerTrigger`, the rounding leftovers going to the largest
    remainders (ties: the lowest partition).
    """
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return dict(backlog)
    waiting = sum(1 for n in backlog.values() if n > 0)
    first = 1 if max_rows >= waiting else 0
    shares = {p: min(n, first) for p, n in backlog.items()}
    rest = {p: n - shares[p] for p, n in backlog.items()}
    budget, rest_total = max_rows - sum(shares.values()), total - sum(shares.values())
    for p, n in rest.items():
        shares[p] += n * budget // rest_total
    left = max_rows - sum(shares.values())
    by_remainder = sorted(rest, key=lambda p: (-(rest[p] * budget % rest_total), p))
    for p in by_remainder[:left]:
        shares[p] += 1
    return shares


@dataclass
class MinTrigger:
    """`minOffsetsPerTrigger` with `maxTriggerDelay`, as in Spark's Kafka source: a batch waits
    until `min_rows` offsets are available, or until `max_delay` seconds passed since the last
    batch and some are."""

    min_rows: int
    max_delay: float
    last: float = float("-inf")  # when the last batch was let through: the first never waits

    def ready(self, available: int, now: float) -> bool:
        """True when a batch of `available` offsets may run now (and it counts as run)."""
        if available == 0:
            return False
        if available < self.min_rows and now - self.last < self.max_delay:
            return False
        self.last = now
        return True

"""The stream's offsets as Spark checkpoints them, and how a read limit splits between partitions.

Pure logic, no I/O. Offsets are JSON in the shape of Spark's own Kafka source,
`{"<topic>": {"<partition>": <next offset>}}`: Spark writes them to the checkpoint's offset log
and shows them in the query's progress. The topic is kept so that a checkpoint reused for
another topic is refused instead of applying one topic's offsets to another. Beside the topic,
under `EPOCHS_KEY` (not a legal topic name), each partition's Kafka leader epoch at its offset::

    {"orders": {"0": 120, "1": 97}, "kspout:leader_epochs": {"0": 3, "1": 3}}

The record below offset 120 was in partition 0's log in leader epoch 3 (KIP-320), which is how
the next batch finds out that an unclean leader election truncated the log below it
(`kspout.streaming.truncation`). Checkpoints written before kspout kept epochs, and partitions
whose leader sent none, have no epoch: they are not checked until a batch has given them one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kspout.streaming.errors import CheckpointTopicMismatch

Offsets = dict[int, int]  # partition -> next offset to read
Epochs = dict[int, int]  # partition -> the leader epoch its offset was known in
EPOCHS_KEY = "kspout:leader_epochs"  # ':' is not allowed in a topic name


@dataclass(frozen=True, slots=True)
class StreamOffsets:
    """Where each partition's next batch begins, and for the partitions it is known of, the
    leader epoch in which the leader's log held every record below that offset."""

    offsets: Offsets
    epochs: Epochs = field(default_factory=dict)

    def anchors(self) -> dict[int, tuple[int, int]]:
        """`(offset, epoch)` of each partition with an epoch: what a leader is asked about."""
        return {p: (self.offsets[p], e) for p, e in self.epochs.items() if p in self.offsets}


def encode(topic: str, offsets: StreamOffsets) -> dict[str, Any]:
    """Offsets as the JSON Spark checkpoints: `{topic: {"<partition>": offset}}`, and the
    epochs beside (left out when there are none)."""
    out: dict[str, Any] = {topic: {str(p): offsets.offsets[p] for p in sorted(offsets.offsets)}}
    if offsets.epochs:
        out[EPOCHS_KEY] = {str(p): offsets.epochs[p] for p in sorted(offsets.epochs)}
    return out


def decode(topic: str, offsets: Mapping[str, object]) -> StreamOffsets:
    """The partitions' offsets (and epochs, where present) from checkpointed JSON;
    `CheckpointTopicMismatch` when the JSON is another topic's."""
    found = offsets.get(topic)
    topics = [name for name in offsets if name != EPOCHS_KEY]
    if not isinstance(found, dict) or len(topics) != 1:
        raise CheckpointTopicMismatch(sorted(topics), topic)
    epochs = offsets.get(EPOCHS_KEY)
    return StreamOffsets(
        {int(p): int(o) for p, o in found.items()},
        {int(p): int(e) for p, e in epochs.items()} if isinstance(epochs, dict) else {},
    )


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

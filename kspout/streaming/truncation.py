"""Truncated logs under a stream: find offsets an unclean leader election replaced below where a
batch begins, and read them again.

Each partition's offset in the checkpoint carries the leader epoch that its leader sent with the
high watermark the batch was planned from (`positions`): the leader's log then held every
record below the offset, in that epoch or an earlier one. That is an anchor as `KafkaSpout.run`
keeps one (`kspout.partition_manager.truncation`), and it is validated the same way
(`EpochProbe`: OffsetForLeaderEpoch, as Kafka's consumer does after a position from ListOffsets,
KIP-320) when

* a batch begins from an anchor this planner did not make or validate (a query started again
  from its checkpoint),
* the partition's leader sends a newer leader epoch than the one the anchor is known valid in
  (a new leader took over since).

When the leader's log ends the anchor's epoch below the anchor, an unclean election truncated
it: the batch begins at that end instead, the replaced range is logged with both epochs
(`partition_manager.truncation.report`, as for `KafkaSpout.run`), the planner counts it
(`replaced` in the ZooKeeper copy), and the new messages at those offsets are read; none is
skipped. A leader that gives no verdict within `VERDICT_TIMEOUT` keeps its partition out of
the next batch, and is asked again (a batch that Spark runs again from its offset log after a
restart reads its range unchecked: its end is checked with the batch after it). Offsets without
an epoch (checkpoints written before kspout kept them, a broker that sent none) are not
checked: the `out_of_range` policy sees them as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kspout.config import TopicConfig
from kspout.kafka import EpochProbe
from kspout.kafka.epochs import VERDICT_TIMEOUT
from kspout.partition_manager.truncation import Anchor, Truncation, cut_at, report
from kspout.streaming.positions import StreamOffsets

log = logging.getLogger(__name__)


class EpochCheck:
    """Validates the anchors a stream's batches begin from; `replaced(partition, count)` is
    told of each truncation once. `close()` closes the probe (which connects on its first
    question)."""

    def __init__(
        self,
        config: TopicConfig,
        replaced: Callable[[int, int], None],
        probe: EpochProbe | None = None,
    ) -> None:
        self._config = config
        self._replaced = replaced
        self._probe = probe if probe is not None else EpochProbe(config)
        # Per partition: an anchor known to stand, and the newest leader epoch it stood in.
        self._valid: dict[int, tuple[Anchor, int]] = {}
        # Per partition: an anchor found truncated, the epoch it was asked in, and the cut
        # (Spark may ask for the same batch again: it is not counted twice).
        self._cut: dict[int, tuple[Anchor, int, Truncation]] = {}

    def close(self) -> None:
        self._probe.close()

    def made(self, offsets: StreamOffsets) -> None:
        """`offsets` were planned from watermarks the leaders sent with those epochs: their
        anchors stand until a newer leader takes over."""
        for p, anchor in offsets.anchors().items():
            if self._valid.get(p, (None, 0))[0] != anchor:
                self._valid[p] = (anchor, anchor[1])

    def truncations(
        self, start: StreamOffsets, epochs: Mapping[int, int]
    ) -> tuple[dict[int, Truncation], set[int]]:
        """The partitions of `start` whose log was truncated below their offset (their
        `Truncation.start` is where the batch begins), and the partitions whose leader gave no
        verdict. `epochs`: the leader epochs the leaders sent with the latest watermarks."""
        cuts: dict[int, Truncation] = {}
        due: dict[int, Anchor] = {}
        for p, anchor in start.anchors().items():
            epoch, known = epochs.get(p), self._cut.get(p)
            if known is not None and known[0] == anchor and (epoch or 0) <= known[1]:
                cuts[p] = known[2]
            elif self._due(p, anchor, epoch):
                due[p] = anchor
        if not due:
            return cuts, set()
        verdicts = self._probe.ends_of_epochs(due)
        unanswered: set[int] = set()
        for p, anchor in due.items():
            if p not in verdicts:
                log.warning(
                    "%s[%d]: no answer to a leader epoch check (offset %d, epoch %d) within "
                    "%gs; asked again with the next batch (check that the partition has a live "
                    "leader)",
                    self._config.topic,
                    p,
                    *anchor,
                    VERDICT_TIMEOUT,
                )
                unanswered.add(p)
                continue
            now = epochs.get(p, anchor[1])
            end = verdicts[p]
            if end is None:
                self._valid[p] = (anchor, now)
                continue
            cut = cut_at(anchor, end[0], now)
            if cut is not None:
                report(self._config.topic, p, cut)
                cuts[p] = cut
                self._cut[p] = (anchor, now, cut)
                self._replaced(p, cut.replaced)
        return cuts, unanswered

    def _due(self, p: int, anchor: Anchor, epoch: int | None) -> bool:
        known = self._valid.get(p)
        if known is None or known[0] != anchor:
            return True
        return epoch is not None and epoch > known[1]

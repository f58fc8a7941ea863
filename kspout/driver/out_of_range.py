"""When the next offsets of a partition are no longer in Kafka: apply its `out_of_range` policy.

Two things trigger it: planning sees the partition's offsets outside the watermarks, or a task
comes back with an out-of-range hint from its fetch. A hint can be stale (planned before a
reset the driver has done since, or before the watermarks moved back into range), so hints of
an older generation are dropped and the watermarks are asked again before anything is reset.

Under `out_of_range = "fail"` only that partition stops (`OwnedPartition.stop`, with the
reason) until an operator moves its offset; the other partitions keep running and committing.
"""

from __future__ import annotations

import logging

from kspout.config import TopicConfig
from kspout.driver.owned import OwnedPartition
from kspout.driver.watermarks import WatermarkCache
from kspout.errors import PartitionStopped
from kspout.kafka import KafkaMetadata
from kspout.partition_manager import OutOfRangeReset
from kspout.policy import PositionKind

log = logging.getLogger(__name__)


class OutOfRangeHandler:
    """Resets partitions per policy, records what was lost, stops partitions under "fail"."""

    def __init__(
        self, config: TopicConfig, metadata: KafkaMetadata, watermarks: WatermarkCache
    ) -> None:
        self._config = config
        self._metadata = metadata
        self._watermarks = watermarks
        self.resets: list[tuple[int, OutOfRangeReset]] = []

    def check(self, part: OwnedPartition, low: int, high: int) -> None:
        """Planning found the partition's offsets outside `[low, high)`: apply the policy."""
        if part.manager.out_of_range(low, high):
            self._reset(part, low, high)

    def hint(self, part: OwnedPartition, generation: int) -> None:
        """A task's fetch found offsets out of range: act on fresh watermarks, if still so."""
        if generation != part.manager.generation or part.stopped is not None:
            return  # planned before a reset since: the hint says nothing about now
        low, high = self._watermarks.fresh(part.number)
        self.check(part, low, high)

    def _reset(self, part: OwnedPartition, low: int, high: int) -> None:
        partition, pm = part.number, part.manager
        position = pm.policy.out_of_range
        ts_offset = None
        if position.kind is PositionKind.TIMESTAMP and position.timestamp_ms is not None:
            ts_offset = self._metadata.offset_for_timestamp(
                self._config.topic, partition, position.timestamp_ms
            )
        try:
            reset = pm.on_out_of_range(low, high, timestamp_offset=ts_offset)
        except PartitionStopped as stop:
            part.stop(
                f"offset {stop.offset} is out of range; Kafka holds [{stop.low}, {stop.high})"
            )
            log.error("%s", stop)
            return
        if reset is not None:
            self.resets.append((partition, reset))

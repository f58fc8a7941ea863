"""`KspoutBatchReader`: `spark.read.format("kspout")`, the records from `startingOffsets` to
`endingOffsets` of every partition, as Spark's Kafka source reads them in a batch query.

    spark.read.format("kspout").option("config", "orders.toml")
        .option("startingOffsets", '{"orders": {"0": 100}}').option("endingOffsets", "latest")
        .load()

PySpark asks `partitions()` on the driver (in a planning process) and calls `read()` in
executors. Where each partition's range begins is the stream's rule (`StreamPlanner`):
`startingOffsets`, else the topic config's `start` (default earliest); an offset Kafka no
longer holds follows `out_of_range` (`failOnDataLoss`): `fail` raises `ReadStopped`, the others
move the start and log the offsets skipped. A range ends at `endingOffsets` (default latest),
at most at the high watermark of the moment `partitions()` ran: records written later are not
read. A batch read writes nothing to ZooKeeper.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from functools import partial

from pyspark.sql.datasource import DataSourceReader, InputPartition

from kspout.errors import ConfigError, KspoutError
from kspout.streaming.errors import ReadStopped
from kspout.streaming.options import LATEST, WHERE, Offsets, SourceSettings
from kspout.streaming.planner import StreamPlanner
from kspout.streaming.positions import StreamOffsets
from kspout.streaming.read import KafkaRange, read_range
from kspout.streaming.schema import Batch

log = logging.getLogger(__name__)


class KspoutBatchReader(DataSourceReader):
    """One `spark.read` of a topic: one task per partition with records in range."""

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self._stopped = partial(ReadStopped, settings.config.topic)

    def partitions(self) -> list[InputPartition]:
        """On the driver: each partition's range, from the watermarks of now."""
        try:
            with StreamPlanner(self._settings, self._stopped, zk_copy=False) as planner:
                start = planner.initial()
                end = ends(self._settings.ending or {}, planner.highs(), start.offsets)
                return list(planner.ranges(start, StreamOffsets(end)))
        except KspoutError as exc:
            raise exc.with_traceback(None) from None  # one frame in Spark's message

    def read(self, partition: InputPartition) -> Iterator[Batch]:
        """In an executor: the records of one partition's range."""
        assert isinstance(partition, KafkaRange)
        return read_range(self._settings.config, partition, self._stopped)


def ends(ending: Mapping[int, int], highs: Mapping[int, int], start: Mapping[int, int]) -> Offsets:
    """Where each partition's range ends: its `endingOffsets` (-1: latest), at most its high
    watermark; a ConfigError when an end lies before the partition's start."""
    out: Offsets = {}
    for p, high in highs.items():
        given = ending.get(p, LATEST)
        end = high if given == LATEST else min(given, high)
        if given != LATEST and given > high:
            log.warning(
                "partition %d: endingOffsets %d is past the high watermark %d; reading to %d",
                p,
                given,
                high,
                high,
            )
        if end < start[p]:
            raise ConfigError(
                WHERE,
                "endingOffsets",
                f"partition {p} ends at {end}, before its start at {start[p]} (startingOffsets)",
            )
        out[p] = end
    return out

"""`KspoutStreamReader`: what PySpark's Python Data Source API calls, handed to the parts that
do the work.

PySpark makes this object more than once: in the driver's long-lived stream process, which
plans every batch (`StreamPlanner`, connected there on first use), and in a planning process
that pickles it, inside the read function, to the executors, which only call `read`
(`read_range`). So it holds settings only until the driver side first needs its clients, and
pickles without them.

Admission control: `getDefaultReadLimit` is `ReadMaxRows(maxOffsetsPerTrigger)` when that
option is set; PySpark passes it back to `latestOffset` for each batch (also under
`Trigger.AvailableNow`, which then runs several batches), or `ReadAllAvailable` where a trigger
wants everything.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kspout.streaming.errors import StreamStopped
from kspout.streaming.options import SourceSettings
from kspout.streaming.planner import StreamPlanner
from kspout.streaming.positions import StreamOffsets, decode, encode
from kspout.streaming.read import KafkaRange, read_range
from kspout.streaming.schema import Batch

Json = dict[str, Any]


class KspoutStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """One streaming query's reader over its topic."""

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self._config = settings.config
        # With a topic file, `out_of_range = "fail"` names the command that moves the partition.
        self._stopped = partial(StreamStopped, self._config.topic, config_path=settings.config_path)
        self._planner: StreamPlanner | None = None

    def _driver(self) -> StreamPlanner:
        if self._planner is None:
            zk_copy = self._settings.config_path is not None
            planner = StreamPlanner(self._settings, self._stopped, zk_copy=zk_copy)
            planner.start()
            self._planner = planner
        return self._planner

    def initialOffset(self) -> Json:
        """Where a new query starts: `startingOffsets`, or `start`, in every partition."""
        return encode(self._config.topic, self._driver().initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        """`ReadMaxRows(maxOffsetsPerTrigger)` when the option is set, else everything."""
        if self._settings.max_offsets is None:
            return ReadAllAvailable()
        return ReadMaxRows(self._settings.max_offsets)

    def latestOffset(self, start: Json, limit: ReadLimit) -> Json:
        """The end of the next batch, at most `limit` offsets past `start`."""
        if isinstance(limit, ReadMaxRows):
            max_rows: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            max_rows = None
        else:
            raise TypeError(f"kspout's stream knows ReadMaxRows and ReadAllAvailable, not {limit}")
        topic = self._config.topic
        return encode(topic, self._driver().latest(decode(topic, start), max_rows))

    def reportLatestOffset(self) -> Json | None:
        """The high watermarks as last asked, for the query's progress (None before any)."""
        highs = self._driver().highs()
        return encode(self._config.topic, StreamOffsets(highs)) if highs else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an `availableNow` run: the high watermarks of now."""
        self._driver().prepare_available_now()

    def partitions(self, start: Json, end: Json) -> list[InputPartition]:
        """The batch's tasks: one per partition with offsets to read."""
        topic = self._config.topic
        return list(self._driver().ranges(decode(topic, start), decode(topic, end)))

    def read(self, partition: InputPartition) -> Iterator[Batch]:
        """In an executor: the records of one task's range."""
        assert isinstance(partition, KafkaRange)
        return read_range(self._config, partition, self._stopped)

    def stop(self) -> None:
        """The query ended: copy its last completed position to ZooKeeper, disconnect."""
        planner, self._planner = self._planner, None
        if planner is not None:
            planner.close()

    def __getstate__(self) -> dict[str, Any]:
        """Settings only: the driver's clients stay on the driver."""
        return {**self.__dict__, "_planner": None}

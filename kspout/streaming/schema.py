"""Records as Arrow record batches of Spark's Kafka source's columns (`columns`).

Executors hand Spark Arrow record batches built column by column: PySpark's own conversion of
Python tuples checks and converts every value one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.pandas.types import to_arrow_schema

from kspout.kafka import Record
from kspout.streaming.columns import SCHEMA

# What PySpark checks each batch against (its planner converts SCHEMA the same way).
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
_TYPES = [field.type for field in ARROW_SCHEMA]

Batch: TypeAlias = pa.RecordBatch  # what executors hand Spark


def to_batch(records: Sequence[Record]) -> Batch:
    """One Arrow record batch of SCHEMA's columns for `records` (of one partition)."""
    n = len(records)
    first = records[0]
    columns = [
        [r.key for r in records],
        [r.value for r in records],
        [first.topic] * n,
        [first.partition] * n,
        [r.offset for r in records],
        [r.timestamp * 1000 if r.timestamp >= 0 else None for r in records],  # ms -> us
        [r.timestamp_type for r in records],
        [r.headers for r in records],
    ]
    arrays = [pa.array(values, type=kind) for values, kind in zip(columns, _TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

"""The stream's columns, those of Spark's Kafka source in its order, and records as Arrow batches.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int, headers array<struct<key string, value binary>>

Every column is nullable, as in Spark's Kafka source. `timestamp` is null for a message
without one. `timestampType` is always null: kspout's fetch does not keep the type Kafka
reports (create time or log-append time) in its records (`kspout.kafka.records.Record`).

Executors hand Spark Arrow record batches built column by column: PySpark's own conversion of
Python tuples checks and converts every value one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kspout.kafka import Record

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)

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
        [None] * n,
        [r.headers for r in records],
    ]
    arrays = [pa.array(values, type=kind) for values, kind in zip(columns, _TYPES, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)

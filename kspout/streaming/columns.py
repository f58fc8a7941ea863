"""The columns of Spark's Kafka source, in its order and with its names and types: the one
schema of `KafkaSpout.foreach_batch` frames, `spark.readStream.format("kspout")` streams and
`spark.read.format("kspout")` reads.

    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int, headers array<struct<key string, value binary>>

Every column is nullable, as in Spark's Kafka source. `timestamp` is null for a message
without one. `timestampType` is Kafka's id of what the timestamp means, as Spark shows it:
0 the producer's create time, 1 the broker's log-append time (the topic's
`message.timestamp.type`), -1 none. `headers` is always there (Spark's source adds it with
`includeHeaders`).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Row
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

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_row(record: Record) -> tuple[object, ...]:
    """`record` as a row of SCHEMA, for `createDataFrame`."""
    timestamp = (
        _EPOCH + dt.timedelta(milliseconds=record.timestamp) if record.timestamp >= 0 else None
    )
    return (
        record.key,
        record.value,
        record.topic,
        record.partition,
        record.offset,
        timestamp,
        record.timestamp_type,
        [Row(key=k, value=v) for k, v in record.headers],
    )

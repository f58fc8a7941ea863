"""A topic as a Structured Streaming source, `spark.readStream.format("kspout")`, and as a
batch read, `spark.read.format("kspout")`.

    kspout.register(spark)            # once per session; `kspout.spark.spark_session()` does it
    df = spark.readStream.format("kspout").option("config", "orders.toml").load()

Built on PySpark's Python Data Source API (PySpark 4.2 or later, with pyarrow). One module per
job: `source` (the data source), `options` (its options: the topic file and Spark's Kafka-source
names), `reader` (what PySpark calls for a stream), `batch` (for a batch read), `planner` (the
driver side: batches' offsets, out-of-range policies, admission control), `truncation` (the
leader epochs kept in the checkpoint, checked: a truncated log is read again), `watermarks`
(asked at a bounded rate), `zk_copy` (the query's progress copied to ZooKeeper), `read` (the
executor side: fetching a batch's ranges), `columns` (Spark's Kafka source's columns, which
`foreach_batch` frames share), `schema` (those columns as Arrow batches),
`positions` (offsets as Spark checkpoints them, `minOffsetsPerTrigger`). Spark's checkpoint is
the source of truth for a query: it is at least once, and exactly-once effects come from
`dedup.batch` in `foreachBatch`. Per-message retries and dead letters are what
`KafkaSpout.run` is for.

This package is imported without PySpark; `register` loads the source.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

from kspout.errors import KspoutError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NEEDS = (4, 2)  # PySpark's `latestOffset(start, limit)` (admission control) came with 4.2


def supported() -> bool:
    """True when this PySpark can run the source: 4.2 or later, and pyarrow installed."""
    import pyspark

    major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
    return (major, minor) >= NEEDS and importlib.util.find_spec("pyarrow") is not None


def register(spark: SparkSession) -> None:
    """Make `format("kspout")` available to `spark.readStream` and `spark.read`; a relative
    `config` path is read from the current working directory."""
    if not supported():
        import pyspark

        raise KspoutError(
            f"the kspout streaming source needs PySpark {'.'.join(map(str, NEEDS))} or later and "
            f"pyarrow (found PySpark {pyspark.__version__}): pip install 'kspout[spark]' "
            "'pyspark>=4.2'"
        )
    from kspout.streaming.source import KspoutDataSource

    # A subclass made here travels to Spark's Python workers by value, with the driver's
    # working directory, so `.option("config", "orders.toml")` means this directory's file.
    here = type(KspoutDataSource.__name__, (KspoutDataSource,), {"workdir": os.getcwd()})
    spark.dataSource.register(here)

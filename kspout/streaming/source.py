"""`KspoutDataSource`: the `kspout` format of `spark.readStream` and `spark.read`.

    spark.readStream.format("kspout").option("config", "orders.toml").load()
    spark.read.format("kspout").option("kafka.bootstrap.servers", "k1:9092")
        .option("subscribe", "orders").option("endingOffsets", "latest").load()

Options: kspout's topic file (`config`) and Spark's Kafka-source option names where they map
onto it (`kspout.streaming.options`); any other option is refused with one line saying what to
use instead, so a misspelt one is not silently ignored.

PySpark creates the data source once, when `load()` runs, asks its schema, and ships it
pickled to where the query runs; so the options and the topic file are read and validated
then, on the driver (a relative path is resolved in the driver's working directory), and a bad
one fails `load()`. Spark wraps what a Python data source raises in its own error, with the
Python traceback; the error is raised afresh in the method Spark calls, so that traceback is
one frame long and the last line is kspout's message. Secrets the file reads from files or the
environment travel with the settings.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from kspout.errors import ConfigError, KspoutError
from kspout.streaming.batch import KspoutBatchReader
from kspout.streaming.columns import SCHEMA
from kspout.streaming.options import WHERE, SourceSettings
from kspout.streaming.reader import KspoutStreamReader


class KspoutDataSource(DataSource):
    """A topic as a stream or a batch read with the columns of Spark's Kafka source."""

    @classmethod
    def name(cls) -> str:
        return "kspout"

    _settings: SourceSettings | None = None  # PySpark asks not to override __init__
    # Where a relative `config` path starts: the driver program's working directory, which
    # `kspout.register` records (Spark runs this class in a Python worker of its JVM, whose
    # working directory may differ).
    workdir: str | None = None

    def settings(self) -> SourceSettings:
        """The options, checked, and the topic file, loaded on the first call (and pickled
        with the data source from then on)."""
        if self._settings is None:
            self._settings = SourceSettings.of(self.options, self.workdir)
        return self._settings

    def schema(self) -> StructType:
        """Spark's Kafka source's columns. Called when `load()` runs, so the options and the
        topic file are checked there."""
        try:
            self.settings()
        except KspoutError as exc:
            raise exc.with_traceback(None) from None  # one frame in Spark's message
        return SCHEMA

    def streamReader(self, schema: StructType) -> KspoutStreamReader:
        try:
            return KspoutStreamReader(self._checked(schema).for_stream())
        except KspoutError as exc:
            raise exc.with_traceback(None) from None

    def reader(self, schema: StructType) -> KspoutBatchReader:
        try:
            return KspoutBatchReader(self._checked(schema).for_batch())
        except KspoutError as exc:
            raise exc.with_traceback(None) from None

    def _checked(self, schema: StructType) -> SourceSettings:
        if schema != SCHEMA:
            raise ConfigError(
                WHERE,
                "schema",
                "the columns are Spark's Kafka source's; select or cast them after load() "
                "instead of passing a schema",
            )
        return self.settings()

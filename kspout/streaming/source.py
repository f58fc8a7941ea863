"""`KspoutDataSource`: the `kspout` format of `spark.readStream`.

    spark.readStream.format("kspout").option("config", "orders.toml").load()

Options: `config`, the topic file (required); `maxOffsetsPerTrigger`, the most offsets one
batch reads over all partitions (as in Spark's Kafka source; default: everything available).
Any other option is refused, so a misspelt one is not silently ignored.

PySpark creates the data source once, when `load()` runs, asks its schema, and ships it
pickled to where the query runs; so the topic file is read and validated then, on the driver
(a relative path is resolved in the driver's working directory), and a bad file fails `load()`
with an error that names it. Secrets the file reads from files or the environment travel with
the settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from kspout.config import TopicConfig, load_config
from kspout.errors import ConfigError
from kspout.streaming.reader import KspoutStreamReader
from kspout.streaming.schema import SCHEMA

OPTIONS = ("config", "maxOffsetsPerTrigger")
WHERE = "spark.readStream.format('kspout')"  # how option errors name their source


def _max_offsets(options: Mapping[str, str]) -> int | None:
    raw = options.get("maxOffsetsPerTrigger")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(WHERE, "maxOffsetsPerTrigger", f"must be an integer > 0 (got {raw!r})")
    return value


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """The options of one `load()`, checked, with the topic file they name loaded."""

    config_path: str
    config: TopicConfig
    max_offsets: int | None  # maxOffsetsPerTrigger

    @classmethod
    def of(cls, options: Mapping[str, str]) -> StreamSettings:
        """Check the options (case-insensitive, as Spark's) and load the topic file."""
        unknown = sorted(set(map(str.lower, options)) - {o.lower() for o in OPTIONS})
        if unknown:
            raise ConfigError(WHERE, unknown[0], f"unknown option; allowed: {', '.join(OPTIONS)}")
        path = options.get("config")
        if not path:
            raise ConfigError(WHERE, "config", "required: .option('config', '<topic file>')")
        return cls(path, load_config(path), _max_offsets(options))


class KspoutDataSource(DataSource):
    """A topic, per its topic file, as a stream with the columns of Spark's Kafka source."""

    @classmethod
    def name(cls) -> str:
        return "kspout"

    _settings: StreamSettings | None = None  # PySpark asks not to override __init__

    def settings(self) -> StreamSettings:
        """The options, checked, and the topic file, loaded on the first call (and pickled
        with the data source from then on)."""
        if self._settings is None:
            self._settings = StreamSettings.of(self.options)
        return self._settings

    def schema(self) -> StructType:
        """Spark's Kafka source's columns. Called when `load()` runs, so the options and the
        topic file are checked there."""
        self.settings()
        return SCHEMA

    def streamReader(self, schema: StructType) -> KspoutStreamReader:
        if schema != SCHEMA:
            raise ConfigError(
                WHERE,
                "schema",
                "the stream's columns are Spark's Kafka source's; select or cast them after "
                "load() instead of passing a schema",
            )
        settings = self.settings()
        return KspoutStreamReader(settings.config, settings.config_path, settings.max_offsets)

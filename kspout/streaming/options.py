"""The options of `format("kspout")`: kspout's topic file, and Spark's Kafka-source option names
where they map onto kspout's settings. Pure logic (and the topic file's reading), no Kafka.

    config                      the topic file; without it, `subscribe` names the topic
    subscribe                   one topic                     -> `topic`
    kafka.bootstrap.servers     the brokers                   -> `brokers`
    kafka.<name>                a librdkafka setting          -> `[kafka] <name>`
    startingOffsets             earliest, latest or JSON      -> `start` (JSON: per partition)
    startingTimestamp           ms since the epoch            -> `start = "timestamp:<ms>"`
    failOnDataLoss              true / false                  -> `out_of_range`: fail / earliest
    kafkaConsumer.pollTimeoutMs milliseconds                  -> `fetch_timeout` (seconds)
    endingOffsets               latest or JSON                   (spark.read only)
    maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay  (streams only)
    includeHeaders              true (the rows always have headers)

With a topic file, the options it maps override the file's keys (and `subscribe` must name the
file's topic); everything else comes from the file. Without one, kspout's defaults apply (not
Spark's: `start` is earliest, `out_of_range` earliest), the brokers come from
`kafka.bootstrap.servers` or `KSPOUT_BROKERS`, and the stream keeps no ZooKeeper copy (there is
no spout id to keep it under). Any other option is refused with one line saying what to use
instead, so a Spark habit that kspout does not follow is never silently ignored.

Names are case-insensitive, as Spark's. In `startingOffsets`/`endingOffsets` JSON, -2 is the
earliest offset and -1 the latest, as in Spark; partitions the JSON leaves out start at
`start` and end at the latest offset.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kspout.config import TopicConfig, load_config, parse_config
from kspout.errors import ConfigError
from kspout.policy import Position, PositionKind

WHERE = "format('kspout')"  # how option errors name their source

EARLIEST, LATEST = -2, -1  # offsets in startingOffsets/endingOffsets JSON, as in Spark

Offsets = dict[int, int]  # partition -> offset

# Spark's default for maxTriggerDelay: 15 minutes.
DEFAULT_TRIGGER_DELAY = 15 * 60.0

OPTIONS = (
    "config",
    "subscribe",
    "kafka.bootstrap.servers",
    "kafka.<librdkafka setting>",
    "startingOffsets",
    "startingTimestamp",
    "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "includeHeaders",
)
_KNOWN = {name.lower(): name for name in OPTIONS if "<" not in name}

STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")

_NO_GROUP = (
    "kspout assigns partitions itself and joins no consumer group (a topic file's "
    "consumer_group mirrors progress to one); remove the option"
)
# Spark options (and kafka.* settings) kspout does not take, with what to use instead.
REFUSED = {
    "subscribePattern": "kspout reads one topic per source: use subscribe with one topic, and "
    "one query per topic",
    "assign": "kspout reads every partition of its topic: use subscribe and filter on the "
    "partition column",
    "startingOffsetsByTimestamp": "use startingTimestamp (one timestamp for every partition)",
    "startingOffsetsByTimestampStrategy": "kspout starts a partition with no record at or after "
    "startingTimestamp at its end (Spark's 'latest'); remove the option",
    "endingTimestamp": "use endingOffsets",
    "endingOffsetsByTimestamp": "use endingOffsets",
    "minPartitions": "kspout reads one task per Kafka partition: .repartition(n) after load()",
    "groupIdPrefix": _NO_GROUP,
    "kafka.group.id": _NO_GROUP,
    "fetchOffset.numRetries": "kspout has no such setting; remove the option",
    "fetchOffset.retryIntervalMs": "kspout has no such setting; remove the option",
    "kafka.auto.offset.reset": "use startingOffsets (where a new query starts) and "
    "failOnDataLoss (offsets Kafka no longer holds)",
    "kafka.enable.auto.commit": "kspout commits no offsets to Kafka; remove the option",
    "kafka.key.deserializer": "key is a binary column: cast or decode it after load()",
    "kafka.value.deserializer": "value is a binary column: cast or decode it after load()",
}
_REFUSED = {name.lower(): name for name in REFUSED}


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """The options of one `load()`, checked, with the topic config they make."""

    config: TopicConfig
    config_path: str | None  # the topic file; None: Spark's options alone (no ZooKeeper copy)
    starting: Offsets = field(default_factory=dict)  # startingOffsets JSON; others at `start`
    ending: Offsets | None = None  # endingOffsets JSON; None: the latest offset everywhere
    max_offsets: int | None = None  # maxOffsetsPerTrigger
    min_offsets: int | None = None  # minOffsetsPerTrigger
    max_trigger_delay: float = DEFAULT_TRIGGER_DELAY  # seconds
    given: frozenset[str] = frozenset()  # the option names given, as OPTIONS spells them

    @classmethod
    def of(cls, options: Mapping[str, str], workdir: str | None = None) -> SourceSettings:
        """Check `options` (Spark's `DataSource.options`) and load the topic file, a relative
        path from `workdir` (else this process's working directory)."""
        opts = {name.lower(): value for name, value in options.items()}
        for name in opts:
            _check_known(name)
        path = opts.get("config") or None
        if path is not None and workdir is not None:
            path = os.path.join(workdir, path)  # an absolute path stays as it is
        config = _base_config(path, opts.get("subscribe"), "kafka.bootstrap.servers" in opts)
        update, starting = _overrides(opts, config)
        ending = None
        if "endingoffsets" in opts:
            end, ending = _offsets(opts, "endingOffsets", config.topic, (LATEST,))
            if end is not None and end.kind is not PositionKind.LATEST:
                raise ConfigError(WHERE, "endingOffsets", "must be latest or JSON")
        if "includeheaders" in opts and not _boolean(opts, "includeHeaders"):
            raise ConfigError(
                WHERE, "includeHeaders", "the rows always have headers: .drop('headers') instead"
            )
        most = _maybe_integer(opts, "maxOffsetsPerTrigger")
        least = _maybe_integer(opts, "minOffsetsPerTrigger")
        if most is not None and least is not None and least > most:
            raise ConfigError(
                WHERE, "minOffsetsPerTrigger", f"must be <= maxOffsetsPerTrigger ({most})"
            )
        if "maxtriggerdelay" in opts and least is None:
            raise ConfigError(WHERE, "maxTriggerDelay", "applies with minOffsetsPerTrigger only")
        return cls(
            config=config.model_copy(update=update),
            config_path=path,
            starting=starting,
            ending=ending,
            max_offsets=most,
            min_offsets=least,
            max_trigger_delay=_duration(opts.get("maxtriggerdelay"), DEFAULT_TRIGGER_DELAY),
            given=frozenset(_KNOWN.get(name, name) for name in opts),
        )

    def for_stream(self) -> SourceSettings:
        """These settings, for `spark.readStream`: refuses what only a batch read takes."""
        if "endingOffsets" in self.given:
            raise ConfigError(
                WHERE,
                "endingOffsets",
                "spark.read only: a stream reads on; end it with trigger(availableNow=True) "
                "or query.stop()",
            )
        return self

    def for_batch(self) -> SourceSettings:
        """These settings, for `spark.read`: refuses what only a stream takes."""
        for name in STREAM_ONLY:
            if name in self.given:
                raise ConfigError(
                    WHERE, name, "streams only: spark.read reads startingOffsets to endingOffsets"
                )
        latest = self.config.start.kind is PositionKind.LATEST or LATEST in self.starting.values()
        if latest and "startingOffsets" in self.given:
            raise ConfigError(
                WHERE,
                "startingOffsets",
                "latest reads nothing in spark.read: give earliest or offsets (JSON)",
            )
        return self


def _check_known(name: str) -> None:
    """Refuse an option kspout does not take, saying what to use instead."""
    if name in _KNOWN or (name.startswith("kafka.") and name not in _REFUSED):
        return
    if name in _REFUSED:
        spelt = _REFUSED[name]
        raise ConfigError(WHERE, spelt, REFUSED[spelt])
    close = difflib.get_close_matches(name, list(_KNOWN), n=1)
    hint = f"did you mean {_KNOWN[close[0]]}? " if close else ""
    raise ConfigError(WHERE, name, f"unknown option; {hint}kspout's options: {', '.join(OPTIONS)}")


def _base_config(path: str | None, topic: str | None, brokers_given: bool) -> TopicConfig:
    """The topic file's settings, or kspout's defaults for `subscribe`'s topic."""
    if topic is not None and (not topic.strip() or "," in topic):
        raise ConfigError(
            WHERE,
            "subscribe",
            f"one topic (got {topic!r}): kspout reads one topic per source; start one query "
            "per topic",
        )
    if path is not None:
        config = load_config(path)
        if topic is not None and topic.strip() != config.topic:
            raise ConfigError(
                WHERE,
                "subscribe",
                f"{path} is topic {config.topic!r}, not {topic.strip()!r}: drop subscribe, or "
                "give the other topic's file",
            )
        return config
    if topic is None:
        raise ConfigError(
            WHERE,
            "subscribe",
            "required: .option('subscribe', '<topic>') with kafka.bootstrap.servers, or "
            ".option('config', '<topic file>')",
        )
    if not brokers_given and not os.environ.get("KSPOUT_BROKERS"):
        raise ConfigError(
            WHERE,
            "kafka.bootstrap.servers",
            "required without a topic file: .option('kafka.bootstrap.servers', 'host:port,...') "
            "(or set KSPOUT_BROKERS)",
        )
    # The spout id only names the fetchers' client (no group is joined, nothing is stored).
    return parse_config({"topic": topic.strip(), "spout_id": f"spark-{topic.strip()}"}, WHERE)


def _overrides(opts: Mapping[str, str], config: TopicConfig) -> tuple[dict[str, Any], Offsets]:
    """The topic config's keys the options set, and `startingOffsets`' JSON offsets."""
    update: dict[str, Any] = {}
    if "kafka.bootstrap.servers" in opts:
        update["brokers"] = _text(opts, "kafka.bootstrap.servers")
    kafka = {k.removeprefix("kafka."): v for k, v in opts.items() if k.startswith("kafka.")}
    kafka.pop("bootstrap.servers", None)
    if kafka:
        update["kafka"] = {**config.kafka, **kafka}
    starting: Offsets = {}
    if "startingoffsets" in opts and "startingtimestamp" in opts:
        raise ConfigError(WHERE, "startingTimestamp", "give startingOffsets or it, not both")
    if "startingoffsets" in opts:
        start, starting = _offsets(opts, "startingOffsets", config.topic, (EARLIEST, LATEST))
        if start is not None:
            update["start"] = start
    if "startingtimestamp" in opts:
        ms = _integer(opts, "startingTimestamp", minimum=0)
        update["start"] = Position(PositionKind.TIMESTAMP, ms)
    if "failondataloss" in opts:
        fail = _boolean(opts, "failOnDataLoss")
        update["out_of_range"] = Position(PositionKind.FAIL if fail else PositionKind.EARLIEST)
    if "kafkaconsumer.polltimeoutms" in opts:
        update["fetch_timeout"] = _integer(opts, "kafkaConsumer.pollTimeoutMs", 1) / 1000
    return update, starting


def _text(opts: Mapping[str, str], name: str) -> str:
    value = opts[name.lower()].strip()
    if not value:
        raise ConfigError(WHERE, name, "must not be empty")
    return value


def _boolean(opts: Mapping[str, str], name: str) -> bool:
    value = opts[name.lower()].strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(WHERE, name, f"must be true or false (got {opts[name.lower()]!r})")
    return value == "true"


def _integer(opts: Mapping[str, str], name: str, minimum: int) -> int:
    raw = opts[name.lower()].strip()
    if not re.fullmatch(r"\d+", raw) or int(raw) < minimum:
        raise ConfigError(WHERE, name, f"must be an integer >= {minimum} (got {raw!r})")
    return int(raw)


def _maybe_integer(opts: Mapping[str, str], name: str) -> int | None:
    return _integer(opts, name, 1) if name.lower() in opts else None


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(raw: str | None, default: float) -> float:
    """Seconds in Spark's time format: a number and a unit (us, ms, s, m, min, h, d); a bare
    number is milliseconds."""
    if raw is None:
        return default
    found = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if found is None or found.group(2) not in {*_UNITS, ""}:
        raise ConfigError(WHERE, "maxTriggerDelay", f"must be like 30s, 5m or 1h (got {raw!r})")
    return int(found.group(1)) * _UNITS[found.group(2) or "ms"]


def _offsets(
    opts: Mapping[str, str], name: str, topic: str, allow: tuple[int, ...]
) -> tuple[Position | None, Offsets]:
    """`earliest`/`latest` as a Position, or Spark's JSON `{"<topic>": {"<p>": offset}}` as
    offsets by partition (offsets >= 0, or the special ones in `allow`)."""
    raw = opts[name.lower()].strip()
    if raw.lower() in ("earliest", "latest"):
        return Position(PositionKind(raw.lower())), {}
    specials = " or ".join(str(s) for s in (LATEST, EARLIEST) if s in allow)
    usage = f'earliest, latest or JSON {{"{topic}": {{"0": <offset or {specials}>}}}}'
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(WHERE, name, f"must be {usage} (got {raw!r})") from None
    if not isinstance(data, dict) or set(data) != {topic} or not isinstance(data[topic], dict):
        raise ConfigError(WHERE, name, f"must be {usage}: this source reads {topic!r} only")
    offsets: Offsets = {}
    for p, offset in data[topic].items():
        fine = isinstance(offset, int) and (offset >= 0 or offset in allow)
        if not (p.isdigit() and fine):
            raise ConfigError(WHERE, name, f"must be {usage} (got {p!r}: {offset!r})")
        offsets[int(p)] = offset
    return None, offsets

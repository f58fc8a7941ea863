"""kspout: a Kafka consumer framework for PySpark jobs with Storm's guaranteed processing."""

from kspout.bolts import (
    BasicBolt,
    BasicCollector,
    Bolt,
    Collector,
    Fields,
    Global,
    Shuffle,
    TaskContext,
    Tuple,
)
from kspout.config import TopicConfig, load_config
from kspout.errors import KspoutError
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager, Plan, Stats
from kspout.policy import Backoff, BehindPolicy, ExhaustedPolicy, PartitionPolicy, Position
from kspout.spout import KafkaSpout

__all__ = [
    "Backoff",
    "BasicBolt",
    "BasicCollector",
    "BehindPolicy",
    "Bolt",
    "Collector",
    "ExhaustedPolicy",
    "FailReason",
    "Fields",
    "Global",
    "KafkaSpout",
    "KspoutError",
    "Outcome",
    "OutcomeKind",
    "PartitionManager",
    "PartitionPolicy",
    "Plan",
    "Position",
    "Shuffle",
    "Stats",
    "TaskContext",
    "TopicConfig",
    "Tuple",
    "load_config",
]

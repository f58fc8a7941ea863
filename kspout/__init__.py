"""kspout: a Kafka consumer framework for PySpark jobs with Storm's guaranteed processing."""

from kspout.bolts import (
    BasicBolt,
    BasicCollector,
    Bolt,
    Collector,
    TaskContext,
    Tuple,
)
from kspout.columnar import ColumnarBolt, ColumnarOutput
from kspout.config import TopicConfig, load_config
from kspout.errors import KspoutError, OutputFailed
from kspout.groupings import Fields, Global, Shuffle
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.output import KafkaOutput, Publish, output_id
from kspout.partition_manager import PartitionManager, Plan, Stats
from kspout.policy import Backoff, BehindPolicy, ExhaustedPolicy, PartitionPolicy, Position
from kspout.spout import KafkaSpout
from kspout.streaming import register

__all__ = [
    "Backoff",
    "BasicBolt",
    "BasicCollector",
    "BehindPolicy",
    "Bolt",
    "Collector",
    "ColumnarBolt",
    "ColumnarOutput",
    "ExhaustedPolicy",
    "FailReason",
    "Fields",
    "Global",
    "KafkaOutput",
    "KafkaSpout",
    "KspoutError",
    "Outcome",
    "OutcomeKind",
    "OutputFailed",
    "PartitionManager",
    "PartitionPolicy",
    "Plan",
    "Position",
    "Publish",
    "Shuffle",
    "Stats",
    "TaskContext",
    "TopicConfig",
    "Tuple",
    "load_config",
    "output_id",
    "register",
]

"""kspout: a Kafka consumer framework for PySpark jobs with Storm's guaranteed processing."""

from kspout.config import TopicConfig, load_config
from kspout.errors import KspoutError
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager, Plan, Stats
from kspout.policy import Backoff, BehindPolicy, ExhaustedPolicy, PartitionPolicy, Position

__all__ = [
    "Backoff",
    "BehindPolicy",
    "ExhaustedPolicy",
    "FailReason",
    "KspoutError",
    "Outcome",
    "OutcomeKind",
    "PartitionManager",
    "PartitionPolicy",
    "Plan",
    "Position",
    "Stats",
    "TopicConfig",
    "load_config",
]

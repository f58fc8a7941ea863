"""kspout: a Kafka consumer framework for PySpark jobs with Storm's guaranteed processing."""

from kspout.config import TopicConfig, load_config
from kspout.errors import KspoutError
from kspout.policy import Backoff, BehindPolicy, ExhaustedPolicy, PartitionPolicy, Position

__all__ = [
    "Backoff",
    "BehindPolicy",
    "ExhaustedPolicy",
    "KspoutError",
    "PartitionPolicy",
    "Position",
    "TopicConfig",
    "load_config",
]

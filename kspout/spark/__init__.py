"""The Spark backend: micro-batches as Spark jobs, bolt chains in executors' Python workers."""

from kspout.spark.executor import SparkExecutor
from kspout.spark.frames import FrameExecutor
from kspout.spark.session import spark_session

__all__ = ["FrameExecutor", "SparkExecutor", "spark_session"]

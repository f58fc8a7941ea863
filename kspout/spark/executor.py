"""`SparkExecutor`: each micro-batch is one Spark job over the batch's partition tasks.

The driver loop submits batches; each runs in its own thread (Spark accepts concurrent jobs
from several threads), so up to `max_batches_in_flight` jobs run at once. A task carries only
its plan (offset spans); executors fetch the payloads from Kafka themselves. What comes back
to the driver is one `TaskResult` per Kafka partition: counted acks, failures, GONE ranges.

A chain without groupings runs in one Spark stage. Each grouping adds a shuffle that routes
tuples to the next stage's tasks; the ack ledgers travel the same shuffles and a last one
brings each Kafka partition's ledgers together to be settled.
"""

from __future__ import annotations

from functools import partial

from pyspark import RDD
from pyspark.sql import SparkSession

from kspout.config import TopicConfig
from kspout.contract import ChannelAddress, PartitionTask, TaskResult
from kspout.executor.slices import join_slices, split_by_key
from kspout.executor.topology import Topology
from kspout.spark.jobs import SparkJobs
from kspout.spark.worker import (
    BatchSpec,
    Item,
    combine,
    first_stage,
    handler_tasks,
    later_stage,
    single_stage_tasks,
)


def _identity(target: int) -> int:
    return target


class SparkExecutor(SparkJobs):
    """Runs micro-batches of a bolt chain as Spark jobs."""

    def __init__(self, spark: SparkSession, config: TopicConfig, topology: Topology) -> None:
        super().__init__(spark, config)
        self._topology = topology
        self._channel: ChannelAddress | None = None

    def _start(self) -> None:
        self._topology.start()

    def channel_host(self) -> str | None:
        """Executors report to the driver's host (loopback for a local master)."""
        conf = self._spark.sparkContext.getConf()
        if (conf.get("spark.master") or "local").startswith("local"):
            return "127.0.0.1"
        return conf.get("spark.driver.host") or "127.0.0.1"

    def attach(self, address: ChannelAddress) -> None:
        self._channel = address

    def _run(self, tasks: list[PartitionTask], batch: int) -> list[TaskResult]:
        sc = self._spark.sparkContext
        partitions = tuple(t.partition for t in tasks)
        spec = BatchSpec(self._config, self._topology, batch, partitions, self._channel)
        planned: RDD[PartitionTask] = sc.parallelize(tasks, len(tasks))
        stages = self._topology.stages
        if self._topology.handler is not None:
            sliced = split_by_key(tasks, self._config.max_tasks_per_partition)
            handled = sc.parallelize(sliced, len(sliced)).mapPartitionsWithIndex(
                partial(handler_tasks, spec)
            )
            return join_slices(tasks, handled.collect())
        if len(stages) == 1:
            return planned.mapPartitionsWithIndex(partial(single_stage_tasks, spec)).collect()
        width = len(tasks)
        items: RDD[Item] = planned.mapPartitionsWithIndex(partial(first_stage, spec))
        for stage in range(1, len(stages)):
            routed = items.partitionBy(width, _identity)
            items = routed.mapPartitionsWithIndex(partial(later_stage, spec, stage))
        merged = items.partitionBy(width, _identity)
        return merged.mapPartitionsWithIndex(partial(combine, spec, tasks)).collect()

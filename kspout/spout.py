"""`KafkaSpout`: the drop-in entry point for Spark jobs.

    spout = kspout.KafkaSpout.from_config("orders.toml")
    spout.run(handle)                          # a function per record
    spout.run([Split(), Fields("word"), Count()])   # a bolt chain with a grouping
    spout.foreach_batch(lambda df, batch_id: df.write.parquet(...))

Each call runs the driver loop (planning, retries, dead letters, ZooKeeper commits) with
micro-batches executed on Spark, until stopped, after `max_batches`, or once caught up. Called
from the main thread, a first SIGTERM or Ctrl-C stops it after the batches in flight, with a
commit; a second one stops it at once (see `kspout.stopping`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kspout.config import TopicConfig, load_config
from kspout.contract import Executor
from kspout.driver import Driver, Progress
from kspout.executor.topology import ChainItem, Topology
from kspout.ordering import check_runs_in_order
from kspout.stopping import stop_on_signals

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kspout.spark.frames import BatchFunction


class KafkaSpout:
    """One topic consumed on Spark with Storm's guarantees.

    `replay_past_window=True` lets a run start although its restart would replay messages
    finished longer ago than the chain's replay window (the dedup bolt's `[dedup] ttl`), whose
    effects would then apply again; by default such a start is refused.
    """

    def __init__(
        self,
        config: TopicConfig,
        spark: SparkSession | None = None,
        *,
        replay_past_window: bool = False,
    ) -> None:
        self.config = config
        self._spark = spark
        self.replay_past_window = replay_past_window

    @classmethod
    def from_config(
        cls,
        path: str | Path,
        spark: SparkSession | None = None,
        *,
        replay_past_window: bool = False,
    ) -> KafkaSpout:
        """Load a topic's TOML file; use `spark`, or the active session, or a new one."""
        return cls(load_config(path), spark, replay_past_window=replay_past_window)

    @property
    def spark(self) -> SparkSession:
        """The SparkSession batches run on (created on first use when none was given)."""
        if self._spark is None:
            from kspout.spark import spark_session

            self._spark = spark_session()
        return self._spark

    def run(
        self,
        chain: ChainItem | Sequence[ChainItem] | Topology,
        *,
        max_batches: int | None = None,
        until_caught_up: bool = False,
        stop: threading.Event | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        max_failures: int | None = None,
    ) -> Progress:
        """Run a handler `f(record)`, a bolt, or a chain of bolts and groupings.

        Returns the final `Progress`: counts per partition, and `failures`, what user code
        raised by exception, message and place (`failed_records` in all). With
        `max_failures`, the run stops once more than that many records failed so.
        """
        from kspout.spark import SparkExecutor

        topology = chain if isinstance(chain, Topology) else Topology.of(chain)
        check_runs_in_order(self.config.ordering, per_record=topology.handler is not None)
        executor = SparkExecutor(self.spark, self.config, topology)
        return self._drive(
            self.config,
            executor,
            max_batches,
            until_caught_up,
            stop,
            on_progress,
            topology.replay_window(),
            max_failures,
        )

    def foreach_batch(
        self,
        function: BatchFunction,
        *,
        max_batches: int | None = None,
        until_caught_up: bool = False,
        stop: threading.Event | None = None,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> Progress:
        """Call `function(df, batch_id)` per micro-batch; returning acks it, raising fails it.

        Calls never overlap, so one batch is planned at a time: a batch waiting behind a slow
        call would only see its `message_timeout` run out.
        """
        from kspout.spark import FrameExecutor

        check_runs_in_order(self.config.ordering, per_record=False)
        config = self.config.model_copy(update={"max_batches_in_flight": 1})
        executor = FrameExecutor(self.spark, config, function)
        return self._drive(config, executor, max_batches, until_caught_up, stop, on_progress)

    def _drive(
        self,
        config: TopicConfig,
        executor: Executor,
        max_batches: int | None,
        until_caught_up: bool,
        stop: threading.Event | None,
        on_progress: Callable[[Progress], None] | None,
        window: float | None = None,
        max_failures: int | None = None,
    ) -> Progress:
        """Run the driver loop; SIGTERM (YARN, Kubernetes) or Ctrl-C stops it cleanly."""
        with (
            stop_on_signals(stop) as stop,
            Driver(
                config,
                executor,
                on_progress=on_progress,
                replay_window=window,
                replay_past_window=self.replay_past_window,
            ) as driver,
        ):
            return driver.run(
                max_batches=max_batches,
                until_caught_up=until_caught_up,
                stop=stop,
                max_failures=max_failures,
            )

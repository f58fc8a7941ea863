"""The driver's Prometheus endpoint (`[metrics]` in the topic file).

What it serves, labelled `topic`, `spout_id` and, per partition, `partition`:

* storm-kafka's `kafkaOffset` figures per partition, under Prometheus names (the storm-kafka
  name is in each help text): `kspout_spout_lag`, `kspout_earliest_time_offset`,
  `kspout_latest_time_offset`, `kspout_latest_emitted_offset`,
  `kspout_latest_completed_offset`; plus the offset ZooKeeper holds, the commit age, and the
  offsets in flight, waiting for a retry or for the dead-letter writer; and since when an
  open transaction holds the partition at its last stable offset;
* the outcome counts per partition as counters (`kspout_messages_acked_total`,
  `kspout_messages_failed_total{reason}`, ...), the driver's batch and commit counts, and
  `kspout_batch_duration_seconds`, a histogram; `kspout_zookeeper_away_seconds` while
  ZooKeeper does not answer;
* `kspout_instance_info` (instance id, host, pid) and the client library's standard
  `process_*` and `python_*` series.

There is no all-partitions series: storm-kafka's `totalSpoutLag` is `sum by (topic)
(kspout_spout_lag)`. Prometheus practice is to aggregate in PromQL: a total beside its own
breakdown makes every `sum()` count twice, `_total` is the suffix of counters, and a sum over
every instance's endpoint also covers the partitions the other instances own, which no single
driver could report.

Figures are rendered at scrape time from the latest `Progress` the driver loop handed over
(`publish`), never from the PartitionManagers: the loop is single-threaded and scrapes arrive
on the HTTP server's threads. A `Progress` is built fresh (new `Stats`, new views) and never
touched again by the loop, so handing it over is one reference swap, every figure of a scrape
comes from the same moment, and a record costs nothing. A partition's series come and go with
the snapshots that hold it (it moved to another instance); its counters start again from 0
where it lands, which `rate()` reads as a counter reset.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from kspout.config import TopicConfig
from kspout.driver.breaker import BreakerState
from kspout.driver.progress import PartitionView, Progress
from kspout.errors import ConfigError
from kspout.lifecycle import Lifecycle
from kspout.outcomes import FailReason

log = logging.getLogger(__name__)

# Seconds between two snapshots the driver takes for the endpoint: each is a pass over every
# partition's spans (~15 ms for 1,000 partitions), and Prometheus scrapes every 15-60 s.
REFRESH = 1.0
# Batch durations, from an in-process batch of a few records to a Spark job of minutes.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Seconds `close()` waits for the server thread once the server was told to stop.
STOP_WAIT = 5.0

PARTITION_LABELS = ("topic", "partition", "spout_id")
DRIVER_LABELS = ("topic", "spout_id")

# Per-partition gauges: name, help, value.
GAUGES: tuple[tuple[str, str, Callable[[PartitionView], float]], ...] = (
    (
        "kspout_spout_lag",
        "Offsets Kafka holds that are not finished yet: latest_time_offset minus "
        "latest_completed_offset (storm-kafka: spoutLag)",
        lambda v: v.lag,
    ),
    (
        "kspout_earliest_time_offset",
        "The first offset Kafka still holds, its low watermark (storm-kafka: earliestTimeOffset)",
        lambda v: v.low,
    ),
    (
        "kspout_latest_time_offset",
        "The offset after the last one in Kafka, its high watermark as the driver last read "
        "it (storm-kafka: latestTimeOffset)",
        lambda v: v.high,
    ),
    (
        "kspout_latest_emitted_offset",
        "Every offset below it was handed out at least once (storm-kafka: latestEmittedOffset)",
        lambda v: v.stats.emitted_to,
    ),
    (
        "kspout_latest_completed_offset",
        "The commit point: every offset below it is finished (storm-kafka: latestCompletedOffset)",
        lambda v: v.stats.commit_point,
    ),
    (
        "kspout_messages_in_flight",
        "Offsets handed out and not settled yet",
        lambda v: v.stats.in_flight,
    ),
    (
        "kspout_messages_waiting_retry",
        "Failed or deferred offsets waiting for their next attempt",
        lambda v: v.stats.waiting,
    ),
    (
        "kspout_dead_letters_pending",
        "Offsets given up and not yet written to the dead-letter topic",
        lambda v: v.stats.dead_letter_pending,
    ),
    (
        "kspout_commit_stuck_seconds",
        "Seconds the commit point has stood still with unfinished offsets above it (0: not stuck)",
        lambda v: v.stuck_for or 0.0,
    ),
    (
        "kspout_open_transaction_since_timestamp_seconds",
        "Unix time since which the partition, caught up to its last stable offset, waits on an "
        "open transaction (the timestamp of its first record there); 0: not waiting",
        lambda v: 0.0 if v.open_transaction is None else v.open_transaction.since_ms / 1000,
    ),
)

# Per-partition counters: name (the client library adds `_total`), help, `Stats` field.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("kspout_messages_acked", "Messages fully processed", "acked"),
    (
        "kspout_messages_duplicate",
        "Replays the dedup bolt found already done (acked without running user code)",
        "duplicates",
    ),
    ("kspout_messages_retried", "Offsets handed out again after a failure", "retried"),
    (
        "kspout_messages_deferred",
        "Replays deferred because the message was in flight elsewhere (no attempt spent)",
        "deferred",
    ),
    (
        "kspout_messages_released",
        "Offsets handed back after an infrastructure failure (no attempt spent)",
        "released",
    ),
    ("kspout_messages_skipped", "Offsets given up and skipped by policy", "skipped"),
    (
        "kspout_messages_lost",
        "Unfinished offsets Kafka deleted before they were processed (out of range)",
        "lost",
    ),
    (
        "kspout_messages_replaced",
        "Offsets handed out, then replaced by an unclean leader election (processed again)",
        "replaced",
    ),
    (
        "kspout_messages_dead_lettered",
        "Messages written to the dead-letter topic",
        "dead_lettered",
    ),
)

# `kspout_messages_failed_total{reason}`: the reasons the PartitionManager counts, by `Stats`
# field (it keeps no count of EXCEPTION failures; `retried` and the dead letters show them).
FAILED: tuple[tuple[FailReason, str], ...] = (
    (FailReason.EXCEPTION, "exceptions"),
    (FailReason.TIMEOUT, "timed_out"),
    (FailReason.CRASH, "crashed"),
    (FailReason.INVALID, "invalid"),
)

# `PartitionView.status` values, one 0/1 series each.
STATUSES = (
    "running",
    "paused",
    "releasing",
    "stopped",
    BreakerState.OPEN.value,
    BreakerState.HALF_OPEN.value,
)

# Driver-wide counters: name, help, `Progress` field.
DRIVER_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("kspout_batches_submitted", "Micro-batches submitted", "batches"),
    (
        "kspout_batches_failed",
        "Jobs that failed outside any message (a worker died, Spark could not run them)",
        "batch_errors",
    ),
    (
        "kspout_batches_cancelled",
        "Batches cancelled because every task left in them was stuck",
        "cancelled",
    ),
    (
        "kspout_commits_refused",
        "Commits refused because another instance or an operator owned the partition",
        "commits_refused",
    ),
    (
        "kspout_partitions_dropped",
        "Partitions dropped after this instance lost them",
        "partitions_dropped",
    ),
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A `Progress` the driver loop no longer touches, and the clock when it was taken."""

    progress: Progress
    taken_at: float


class ProgressCollector:
    """Renders the latest snapshot at scrape time (a `prometheus_client` custom collector).

    `publish` runs on the driver loop's thread, `collect` on a scrape's: the only state they
    share is `_snapshot`, replaced whole and read once per scrape. `clock` is the driver's.
    """

    def __init__(
        self,
        spout_id: str,
        clock: Callable[[], float],
        *,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        self._spout_id = spout_id
        self._clock = clock
        self._host = socket.gethostname() if host is None else host
        self._pid = os.getpid() if pid is None else pid
        self._snapshot: Snapshot | None = None

    def publish(self, progress: Progress) -> None:
        """Make `progress` what scrapes show (the caller must not change it afterwards)."""
        self._snapshot = Snapshot(progress, self._clock())

    def collect(self) -> Iterable[Metric]:
        """Every family of the latest snapshot; nothing before the first one."""
        snapshot = self._snapshot
        if snapshot is None:
            return []
        now = self._clock()
        progress = snapshot.progress
        return [
            *self._partition_families(progress, now),
            *self._driver_families(progress, now - snapshot.taken_at),
        ]

    def _partition_families(self, progress: Progress, now: float) -> list[Metric]:
        views = [
            (v, [progress.topic, str(v.partition), self._spout_id]) for v in progress.partitions
        ]
        out: list[Metric] = []
        for name, text, value in GAUGES:
            gauge = GaugeMetricFamily(name, text, labels=PARTITION_LABELS)
            for view, labels in views:
                gauge.add_metric(labels, value(view))
            out.append(gauge)
        committed = GaugeMetricFamily(
            "kspout_committed_offset",
            "The commit point as last written to ZooKeeper (and mirrored to `consumer_group`)",
            labels=PARTITION_LABELS,
        )
        age = GaugeMetricFamily(
            "kspout_commit_age_seconds",
            "Seconds since the partition's offset record was last written to ZooKeeper (it is "
            "written only when something finished: an idle partition's age grows)",
            labels=PARTITION_LABELS,
        )
        status = GaugeMetricFamily(
            "kspout_partition_status",
            "1 for the partition's current status, 0 for the others",
            labels=(*PARTITION_LABELS, "status"),
        )
        for view, labels in views:
            if view.committed is not None:
                committed.add_metric(labels, view.committed)
            if view.committed_at is not None:
                age.add_metric(labels, max(0.0, now - view.committed_at))
            for state in STATUSES:
                status.add_metric([*labels, state], float(view.status == state))
        out += [committed, age, status]
        for name, text, field in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=PARTITION_LABELS)
            for view, labels in views:
                counter.add_metric(labels, getattr(view.stats, field))
            out.append(counter)
        failed = CounterMetricFamily(
            "kspout_messages_failed",
            "Failed attempts, by reason (each is retried within the budget or given up)",
            labels=(*PARTITION_LABELS, "reason"),
        )
        for view, labels in views:
            for reason, field in FAILED:
                failed.add_metric([*labels, reason.value], getattr(view.stats, field))
        out.append(failed)
        return out

    def _driver_families(self, progress: Progress, snapshot_age: float) -> list[Metric]:
        labels = [progress.topic, self._spout_id]
        out: list[Metric] = []
        for name, text, field in DRIVER_COUNTERS:
            counter = CounterMetricFamily(name, text, labels=DRIVER_LABELS)
            counter.add_metric(labels, getattr(progress, field))
            out.append(counter)
        owned = GaugeMetricFamily(
            "kspout_partitions_owned", "Partitions this instance runs", labels=DRIVER_LABELS
        )
        owned.add_metric(labels, len(progress.partitions))
        age = GaugeMetricFamily(
            "kspout_snapshot_age_seconds",
            "Seconds since the driver loop last handed these figures over (grows while the "
            "loop is blocked)",
            labels=DRIVER_LABELS,
        )
        age.add_metric(labels, snapshot_age)
        zookeeper_away = GaugeMetricFamily(
            "kspout_zookeeper_away_seconds",
            "Seconds ZooKeeper has been away (0 while it answers): commits and ownership wait "
            "meanwhile, the run goes on",
            labels=DRIVER_LABELS,
        )
        zookeeper_away.add_metric(labels, progress.zookeeper_away or 0.0)
        info = InfoMetricFamily(
            "kspout_instance",
            "This driver: its instance id (its node under `instances/`), host and pid",
            labels=(*DRIVER_LABELS, "instance_id", "host", "pid"),
        )
        info.add_metric([*labels, progress.instance, self._host, str(self._pid)], {})
        return [*out, owned, age, zookeeper_away, info]


class MetricsExporter(Lifecycle):
    """The driver's Prometheus endpoint; serves nothing when the topic has no `[metrics]`.

    `start()` serves `registry` over HTTP on `[metrics] host` and `port` (0: any free port;
    `port` and `url` say which one), `close()` stops it. The driver hands over snapshots
    (`publish`: when `due`, and the one each commit takes anyway) and batch durations
    (`batch_ended`). `clock` is the driver's; `interval` is the seconds between snapshots.
    """

    def __init__(
        self,
        config: TopicConfig,
        clock: Callable[[], float] = time.monotonic,
        interval: float = REFRESH,
    ) -> None:
        self._settings = config.metrics
        self._topic = config.topic
        self._clock = clock
        self._interval = interval
        self._published_at = float("-inf")
        self.registry = CollectorRegistry()
        self._collector = ProgressCollector(config.spout_id, clock)
        self.registry.register(self._collector)
        self._durations = Histogram(
            "kspout_batch_duration_seconds",
            "Seconds from a batch's submission to the end of its job",
            DRIVER_LABELS,
            registry=self.registry,
            buckets=DURATION_BUCKETS,
        ).labels(config.topic, config.spout_id)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None  # the bound port, once started
        self.url: str | None = None  # where to scrape, once started

    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Serve the registry on `[metrics] host:port` (a no-op without `[metrics]`).

        Raises `ConfigError` when the address cannot be bound (port taken, unknown host).
        """
        settings = self._settings
        if settings is None or self._server is not None:
            return
        try:
            self._server, self._thread = start_http_server(
                settings.port, settings.host, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"topic {self._topic}",
                "metrics",
                f"cannot serve on {settings.host}:{settings.port} ({exc.strerror or exc}); "
                "choose a free port (0: any) and an address of this host",
            ) from exc
        for standard in (ProcessCollector, PlatformCollector, GCCollector):
            standard(registry=self.registry)  # what the client's default registry holds
        self.port = int(self._server.server_port)
        host = settings.host
        if host in ("", "0.0.0.0", "::"):
            host = socket.gethostname()
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"
        log.info("Prometheus metrics of %s at %s", self._topic, self.url)

    def due(self, now: float) -> bool:
        """True when serving and the last snapshot is `interval` seconds old."""
        return self._server is not None and now - self._published_at >= self._interval

    def publish(self, progress: Progress) -> None:
        """Hand a snapshot over to the scrapes (the caller must not change it afterwards)."""
        self._published_at = self._clock()
        self._collector.publish(progress)

    def batch_ended(self, seconds: float) -> None:
        """Record one batch's duration, submission to the end of its job."""
        self._durations.observe(seconds)

    def close(self) -> None:
        """Stop serving and free the port."""
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(STOP_WAIT)

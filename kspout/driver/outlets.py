"""Where a driver's progress goes: the caller's callback, the Prometheus endpoint, this
instance's node in ZooKeeper and the Kafka consumer-group mirror, each at its own pace."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kspout.config import TopicConfig
from kspout.driver.metrics import MetricsExporter
from kspout.driver.progress import InstanceReporter, Progress
from kspout.kafka.group_mirror import GroupMirror
from kspout.lifecycle import Lifecycle
from kspout.zk.registry import InstanceRegistry


class ProgressOutlets(Lifecycle):
    """The caller's `on_progress` gets a snapshot every `interval` seconds, the Prometheus
    endpoint one every `metrics_interval` seconds and one per commit (`metrics.py`); at each
    commit the instance node gets the report when it changed, or as a heartbeat
    (`InstanceReporter`), and the consumer group (`consumer_group`) the committed points."""

    def __init__(
        self,
        config: TopicConfig,
        registry: InstanceRegistry,
        clock: Callable[[], float],
        on_progress: Callable[[Progress], None] | None,
        interval: float,
        metrics_interval: float,
    ) -> None:
        self.metrics = MetricsExporter(config, clock, metrics_interval)
        self._mirror = GroupMirror(config)
        self._registry = registry
        self._reporter = InstanceReporter(registry, clock, config.commit_interval)
        self._clock = clock
        self._on_progress = on_progress
        self._interval = interval
        self._last = float("-inf")

    def start(self) -> None:
        self.metrics.start()  # first: a port taken is a config error, found before any claim
        self._mirror.start()

    def announce(self) -> None:
        """Write the metrics URL into this instance's node, for `kspout status`."""
        if self.metrics.url is not None:
            self._registry.report({"metrics": self.metrics.url})

    def step(self, snapshot: Progress | None, take: Callable[[], Progress]) -> None:
        """Hand a snapshot to whoever is due one: `snapshot` when the step took one already,
        else one `take()` made (at most once)."""
        now = self._clock()
        if self._on_progress is not None and now - self._last >= self._interval:
            self._last = now
            snapshot = take() if snapshot is None else snapshot
            self._on_progress(snapshot)
        if self.metrics.due(now):
            self.metrics.publish(take() if snapshot is None else snapshot)

    def committed(
        self,
        progress: Progress,
        points: Mapping[int, int | None],
        guard: Callable[[str, Callable[[], object]], object],
    ) -> None:
        """A commit round ended: report it (through `guard`, which holds ZooKeeper work off
        during an outage), publish it, mirror the committed `points` to the consumer group."""
        guard("reporting", lambda: self._reporter.report(progress))  # if it changed
        self.metrics.publish(progress)
        self._mirror.mirror(points)

    def close(self) -> None:
        self._mirror.close()
        self.metrics.close()

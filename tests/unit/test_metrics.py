"""The metrics collector renders a `Progress` snapshot: every figure from the right field, ages
at scrape time, series that leave with their partition. Pure logic: a registry rendered to
the exposition text and parsed back, no server."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kspout.config import parse_config
from kspout.driver import PartitionView, Progress
from kspout.driver.breaker import BreakerState, BreakerView
from kspout.driver.metrics import MetricsExporter, ProgressCollector
from kspout.partition_manager import Stats

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kspout.json"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def stats(base: int) -> Stats:
    """Every field a distinct number (so a figure read from the wrong field shows), with the
    commit point below `emitted_to`."""
    names = [f.name for f in dataclasses.fields(Stats)]
    values = {name: base + i for i, name in enumerate(names)}
    return Stats(**values | {"commit_point": base + 1000, "emitted_to": base + 1500})


def scrape(collector: ProgressCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    return scrape_registry(registry)


def scrape_registry(registry: CollectorRegistry) -> Samples:
    text = generate_latest(registry).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def at(partition: int, **extra: str) -> frozenset[tuple[str, str]]:
    return frozenset({"topic": "t", "partition": str(partition), "spout_id": "sp", **extra}.items())


DRIVER = frozenset({"topic": "t", "spout_id": "sp"}.items())


def progress(*views: PartitionView) -> Progress:
    return Progress(
        "t",
        batches=7,
        elapsed=3.0,
        partitions=list(views),
        batch_errors=2,
        cancelled=1,
        isolation_runs=4,
        instance="run-1",
        commits_refused=5,
        partitions_dropped=6,
    )


def test_every_figure_comes_from_its_field() -> None:
    clock = Clock()
    collector = ProgressCollector("sp", clock, host="h1", pid=42)
    s0, s1 = stats(10), stats(50)
    open_ = BreakerView(BreakerState.OPEN, 1, 1, 2.0, "down")
    views = (
        PartitionView(0, s0, 900, 3000, 1005, stuck_for=12.5, committed_at=90.0),
        PartitionView(1, s1, 0, 1000, None, breaker=open_),
    )
    collector.publish(progress(*views))
    clock.now = 104.0
    got = scrape(collector)

    for p, (view, st) in enumerate(zip(views, (s0, s1), strict=True)):
        assert got[("kspout_spout_lag", at(p))] == max(0, view.high - st.commit_point)
        assert got[("kspout_earliest_time_offset", at(p))] == view.low
        assert got[("kspout_latest_time_offset", at(p))] == view.high
        assert got[("kspout_latest_emitted_offset", at(p))] == st.emitted_to
        assert got[("kspout_latest_completed_offset", at(p))] == st.commit_point
        assert got[("kspout_messages_in_flight", at(p))] == st.in_flight
        assert got[("kspout_messages_waiting_retry", at(p))] == st.waiting
        assert got[("kspout_dead_letters_pending", at(p))] == st.dead_letter_pending
        for name, field in [
            ("acked", "acked"),
            ("duplicate", "duplicates"),
            ("retried", "retried"),
            ("deferred", "deferred"),
            ("released", "released"),
            ("skipped", "skipped"),
            ("lost", "lost"),
            ("dead_lettered", "dead_lettered"),
        ]:
            assert got[(f"kspout_messages_{name}_total", at(p))] == getattr(st, field), name
        for reason, field in [
            ("timeout", "timed_out"),
            ("crash", "crashed"),
            ("invalid", "invalid"),
        ]:
            assert got[("kspout_messages_failed_total", at(p, reason=reason))] == getattr(st, field)

    assert got[("kspout_spout_lag", at(1))] == 0  # Kafka's high is below the commit point
    assert got[("kspout_committed_offset", at(0))] == 1005
    assert ("kspout_committed_offset", at(1)) not in got  # no record written yet
    assert got[("kspout_commit_age_seconds", at(0))] == 14.0  # at scrape time, not publish time
    assert got[("kspout_commit_stuck_seconds", at(0))] == 12.5
    assert got[("kspout_commit_stuck_seconds", at(1))] == 0
    assert got[("kspout_partition_status", at(0, status="running"))] == 1
    assert got[("kspout_partition_status", at(0, status="open"))] == 0
    assert got[("kspout_partition_status", at(1, status="open"))] == 1
    assert got[("kspout_partition_status", at(1, status="running"))] == 0

    assert got[("kspout_batches_submitted_total", DRIVER)] == 7
    assert got[("kspout_batches_failed_total", DRIVER)] == 2
    assert got[("kspout_batches_cancelled_total", DRIVER)] == 1
    assert got[("kspout_commits_refused_total", DRIVER)] == 5
    assert got[("kspout_partitions_dropped_total", DRIVER)] == 6
    assert got[("kspout_partitions_owned", DRIVER)] == 2
    assert got[("kspout_snapshot_age_seconds", DRIVER)] == 4.0
    assert got[("kspout_zookeeper_away_seconds", DRIVER)] == 0  # it answers
    info = DRIVER | {("instance_id", "run-1"), ("host", "h1"), ("pid", "42")}
    assert got[("kspout_instance_info", info)] == 1


def test_how_long_zookeeper_has_been_away() -> None:
    collector = ProgressCollector("sp", Clock())
    away = progress(PartitionView(0, stats(1), 0, 9, 0))
    away.zookeeper_away = 31.5
    collector.publish(away)
    assert scrape(collector)[("kspout_zookeeper_away_seconds", DRIVER)] == 31.5


def test_nothing_before_the_first_snapshot_and_a_partition_that_left_has_no_series() -> None:
    clock = Clock()
    collector = ProgressCollector("sp", clock)
    assert scrape(collector) == {}

    collector.publish(
        progress(PartitionView(0, stats(1), 0, 9, 0), PartitionView(3, stats(2), 0, 9, 0))
    )
    assert {labels for name, labels in scrape(collector) if name == "kspout_spout_lag"} == {
        at(0),
        at(3),
    }

    collector.publish(progress(PartitionView(0, stats(1), 0, 9, 0)))
    left = [key for key in scrape(collector) if ("partition", "3") in key[1]]
    assert left == []


def test_the_dashboard_uses_only_metrics_the_driver_serves() -> None:
    config = parse_config(
        {"topic": "t", "spout_id": "sp", "brokers": "b:9092", "zookeeper": "z:2181"}
        | {"metrics": {"port": 0}}
    )
    exporter = MetricsExporter(config)  # never started: its registry renders all the same
    exporter.publish(progress(PartitionView(0, stats(1), 0, 9, 0, committed_at=1.0)))
    served = {name for name, _ in scrape_registry(exporter.registry)}
    exprs = [
        target["expr"]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel.get("targets", [])
    ]
    used = {name for expr in exprs for name in re.findall(r"\bkspout_\w+", expr)}
    assert used, "no kspout metric found in the dashboard"
    assert used <= served, used - served

"""Gaps are not losses: offsets Kafka never had for this consumer are counted apart from `lost`.

A GONE outcome (the fetcher found no record at an offset inside Kafka's `[low, high)`: a
transaction marker, an aborted or compacted record) finishes the offset as a gap. `lost` is
only for data that existed and was not processed (an out-of-range reset past unfinished
offsets), so an alert on it has no false alarms.
"""

from __future__ import annotations

import json
import logging

import pytest
from rich.console import Console

from kspout.cli.report import COUNTERS, OCCASIONAL, progress_json, progress_table
from kspout.contract import PartitionTask
from kspout.driver import PartitionView, Progress
from kspout.executor.task import settle
from kspout.kafka import FetchResult, Record
from kspout.outcomes import Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager
from kspout.policy import PartitionPolicy, Position, PositionKind
from tests.unit import pm_helpers

GONE, ACK = OutcomeKind.GONE, OutcomeKind.ACK


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def manager(start: int = 0, **policy: object) -> PartitionManager:
    return PartitionManager(
        PartitionPolicy(**policy),  # type: ignore[arg-type]
        start,
        clock=FakeClock(),
        topic="orders",
        partition=3,
    )


def test_gone_outcomes_count_as_gaps_not_lost(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kspout.partition_manager")
    pm = manager()
    pm.plan(10, 10)
    pm_helpers.gone(pm, 2)
    pm.apply([Outcome(5, GONE, 1, count=2)], generation=pm.generation)
    pm_helpers.ack_many(pm, [0, 1, 3, 4, 7, 8, 9])
    s = pm.stats()
    assert (s.gaps, s.lost, s.acked) == (3, 0, 7)
    assert (s.commit_point, s.in_flight, s.waiting, s.spans) == (10, 0, 0, 0)
    logged = [r.getMessage() for r in caplog.records if "counted as gaps" in r.getMessage()]
    assert len(logged) == 2 and "[2, 3)" in logged[0] and "[5, 7)" in logged[1]
    assert pm.plan(10, 10).ranges() == [], "a gap is finished: never retried"


def test_a_gap_already_settled_is_not_counted_again() -> None:
    pm = manager()
    pm.plan(4, 4)
    pm_helpers.ack(pm, 1)
    pm.apply([Outcome(0, GONE, 1, count=4)], generation=pm.generation)
    pm_helpers.gone(pm, 3)
    s = pm.stats()
    assert (s.gaps, s.acked, s.lost, s.commit_point) == (3, 1, 0, 4)


def test_an_out_of_range_reset_counts_lost_not_gaps() -> None:
    """Retention deleted offsets the partition had not finished: data not processed."""
    pm = manager(out_of_range=Position(PositionKind.EARLIEST))
    pm.plan(100, 100)
    pm_helpers.ack_range(pm, 0, 20)
    pm.apply([Outcome(20, GONE, 1, count=5)], generation=pm.generation)  # markers at [20, 25)
    reset = pm.on_out_of_range(50, 200)
    assert reset is not None and reset.lost == ((25, 50),)
    s = pm.stats()
    assert (s.lost, s.gaps) == (25, 5)


def test_gone_from_a_stale_epoch_counts_nothing() -> None:
    pm = manager(out_of_range=Position(PositionKind.EARLIEST))
    pm.plan(100, 100)
    old = pm.generation
    pm.on_out_of_range(150, 300)
    assert pm.generation != old
    pm.plan(160, 10)  # [150, 160) in flight at the new generation
    pm.apply([Outcome(150, GONE, 1, count=10)], generation=old)
    s = pm.stats()
    assert (s.gaps, s.in_flight, s.stale) == (0, 10, 10)


def test_a_task_over_transaction_markers_settles_them_as_gaps() -> None:
    """The fetcher's `missing` ranges become GONE outcomes, which the manager counts as gaps."""
    pm = manager()
    plan = pm.plan(6, 6)
    records = [Record("orders", 3, o, None, b"v", -1, ()) for o in (0, 1, 3, 4)]
    fetched = FetchResult(records, [(2, 3), (5, 6)])  # a commit marker after each transaction
    result = settle(PartitionTask("orders", 3, plan), fetched, lambda record: None)
    assert [(o.offset, o.kind, o.count) for o in result.outcomes if o.kind is GONE] == [
        (2, GONE, 1),
        (5, GONE, 1),
    ]
    pm.apply(result.outcomes, generation=result.generation)
    s = pm.stats()
    assert (s.acked, s.gaps, s.lost, s.commit_point) == (4, 2, 0, 6)


# -- the progress table and JSON ------------------------------------------------------------------


def _view(partition: int, gaps: int) -> PartitionView:
    pm = manager()
    pm.plan(10, 10)
    pm.apply([Outcome(0, GONE, 1, count=gaps)] if gaps else [], generation=pm.generation)
    pm_helpers.ack_range(pm, gaps, 10)
    return PartitionView(partition, pm.stats(), 0, 10, 10)


def _render(progress: Progress) -> str:
    console = Console(width=250, record=True)
    console.print(progress_table(progress))
    return console.export_text()


def test_gaps_is_a_counter_of_the_report() -> None:
    assert "gaps" in COUNTERS and "lost" in COUNTERS and "gaps" in OCCASIONAL


def test_the_json_carries_gaps_apart_from_lost() -> None:
    progress = Progress("t", 1, 1.0, [_view(0, 3), _view(1, 0)])
    data = json.loads(json.dumps(progress_json(progress)))
    assert (data["totals"]["gaps"], data["totals"]["lost"]) == (3, 0)
    assert [(p["gaps"], p["lost"]) for p in data["partitions"]] == [(3, 0), (0, 0)]


def test_the_table_shows_gaps_only_when_there_are_some() -> None:
    header = _render(Progress("t", 1, 1.0, [_view(0, 3)])).splitlines()
    assert any("gaps" in line and "lost" in line for line in header)
    quiet = _render(Progress("t", 1, 1.0, [_view(0, 0)]))
    assert "gaps" not in quiet and "lost" in quiet

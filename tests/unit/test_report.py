"""The progress table and JSON show stopped partitions and open breakers."""

from __future__ import annotations

import json

from rich.console import Console

from kspout.cli.report import progress_json, progress_table
from kspout.driver import PartitionView, Progress
from kspout.driver.breaker import BreakerState, BreakerView
from kspout.partition_manager import PartitionManager
from kspout.policy import PartitionPolicy


def view(partition: int, **extra: object) -> PartitionView:
    stats = PartitionManager(PartitionPolicy(), 10).stats()
    return PartitionView(partition, stats, 0, 20, 10, **extra)  # type: ignore[arg-type]


def render(progress: Progress) -> str:
    console = Console(width=200, record=True)
    console.print(progress_table(progress))
    return console.export_text()


OPEN = BreakerView(BreakerState.OPEN, 3, 5, 4.2, "ConnectionError: Redis is down")
STOP = "offset 10 is out of range; Kafka holds [15, 20)"


def test_the_table_shows_each_partition_status_and_the_stop_reason() -> None:
    progress = Progress("t", 3, 1.0, [view(0), view(1, breaker=OPEN), view(2, stopped=STOP)])
    text = render(progress)
    assert "status" in text
    rows = {
        cells[0]: line
        for line in text.splitlines()
        if (cells := line.replace("│", " ").split()) and cells[0].isdigit()
    }
    assert "running" in rows["0"]
    assert "open 4s" in rows["1"]
    assert "stopped" in rows["2"]
    assert STOP in " ".join(text.split())


def test_a_table_of_running_partitions_has_no_status_column() -> None:
    assert "status" not in render(Progress("t", 1, 1.0, [view(0), view(1)]))


def test_json_carries_status_breaker_and_stop() -> None:
    progress = Progress("t", 3, 1.0, [view(0), view(1, breaker=OPEN), view(2, stopped=STOP)])
    data = json.loads(json.dumps(progress_json(progress)))
    parts = data["partitions"]
    assert [p["status"] for p in parts] == ["running", "open", "stopped"]
    assert parts[1]["breaker"] == {
        "state": "open",
        "failures": 3,
        "retry_in_s": 4.2,
        "last_error": "ConnectionError: Redis is down",
    }
    assert parts[2]["stopped"] == STOP and parts[0]["breaker"] is None
    assert {"released", "crashed"} <= data["totals"].keys()


def test_a_narrow_terminal_gets_fewer_columns_never_cut_numbers() -> None:
    views = [view(p, breaker=OPEN if p == 1 else None) for p in range(4)]
    progress = Progress("orders", 12345, 678.9, views)
    for width in (60, 80, 120):
        console = Console(width=width, record=True)
        console.print(progress_table(progress, width=width))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width
        assert "…" not in text, text
        header = next(line for line in text.splitlines() if "partition" in line)
        assert "lag" in header and "acked" in header  # what always stays
    assert "hidden to fit the terminal" not in render(progress)  # 200 columns: all shown

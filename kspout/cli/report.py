"""Render a driver `Progress` for people (a rich table) and for scripts (JSON)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kspout.driver import PartitionView, Progress
from kspout.driver.failure_log import FailureSummary

COUNTERS = (
    "acked",
    "duplicates",
    "retried",
    "deferred",
    "timed_out",
    "exceptions",  # the handler raised (each retried, or dead-lettered once spent)
    "crashed",
    "released",
    "skipped",
    "invalid",
    "dead_lettered",
    "lost",
    "gaps",  # offsets Kafka never had for this consumer (markers, compaction): not lost
    "restored",  # finished before a restart (recorded in ZooKeeper): not replayed
)
# Shown in the table only when some partition has a count (JSON always has every counter).
OCCASIONAL = {
    "duplicates",
    "deferred",
    "crashed",
    "released",
    "skipped",
    "invalid",
    "gaps",
    "restored",
}
HEADERS = {
    "duplicates": "dup",
    "timed_out": "timeout",
    "exceptions": "raised",
    "dead_lettered": "dlq",
    "in flight": "inflight",
}


# Columns a narrow terminal hides, first the first: the rare counts, then the details that
# `kspout status` and `--json` also give. Partition, lag and acked always stay.
HIDE_FIRST = (
    "restored",
    "gaps",
    "duplicates",
    "deferred",
    "released",
    "crashed",
    "skipped",
    "invalid",
    "stalls",
    "lost",
    "timed_out",
    "exceptions",
    "retried",
    "high",
    "committed",
    "in flight",
    "dead_lettered",
    "status",
    "failed",
)


def progress_table(progress: Progress, title: str | None = None, width: int | None = None) -> Table:
    """Per-partition table: commit point, high watermark, lag, counts; a totals row last.

    Given a `width` (the terminal's), columns are hidden in `HIDE_FIRST` order until the table
    fits it whole, and the caption names them: numbers are never cut to an ellipsis.
    """
    columns = _columns(progress)
    hidden: list[str] = []
    table = _table(progress, title, columns, hidden)
    for name in HIDE_FIRST:
        if width is None or _fits(table, width):
            break
        if name in columns:
            del columns[name]
            hidden.append(name)
            table = _table(progress, title, columns, hidden)
    return table


MEASURE_WIDTH = 10_000  # wider than any table: what a table would take, uncut
Column = tuple[list[str], str]  # each partition's cell, and the totals row's


def _columns(progress: Progress) -> dict[str, Column]:
    """Every column the progress calls for, in order: name -> cells."""
    views = progress.partitions
    out: dict[str, Column] = {"partition": ([str(v.partition) for v in views], "all")}
    if any(view.status != "running" for view in views):
        out["status"] = ([_status(v) for v in views], "")
    out["committed"] = (["-" if v.committed is None else str(v.committed) for v in views], "")
    out["high"] = ([str(v.high) for v in views], "")
    out["lag"] = ([str(v.lag) for v in views], str(progress.lag))
    out["in flight"] = ([str(v.stats.in_flight) for v in views], str(progress.total("in_flight")))
    failed = [str(v.stats.waiting + v.stats.dead_letter_pending) for v in views]
    out["failed"] = (failed, str(progress.total("waiting") + progress.total("dead_letter_pending")))
    for name in COUNTERS:
        if name not in OCCASIONAL or progress.total(name):
            cells = [str(getattr(v.stats, name)) for v in views]
            out[name] = (cells, str(progress.total(name)))
    if any(view.stalls for view in views):
        out["stalls"] = ([_stalls(v) for v in views], str(sum(v.stalls for v in views)))
    return out


def _table(
    progress: Progress, title: str | None, columns: dict[str, Column], hidden: list[str]
) -> Table:
    table = Table(
        title=title or f"{progress.topic}: batch {progress.batches}, {progress.elapsed:.1f}s",
        title_justify="left",
    )
    for name in columns:
        table.add_column(HEADERS.get(name, name), justify="right", no_wrap=True)
    for i in range(len(progress.partitions)):
        table.add_row(*(cells[i] for cells, _ in columns.values()))
    table.add_section()
    table.add_row(*(total for _, total in columns.values()), style="bold")
    caption = [f"{view.partition}: {view.stopped}" for view in progress.partitions if view.stopped]
    notes = []
    if progress.zookeeper_away is not None:
        notes.append(
            f"ZooKeeper away for {progress.zookeeper_away:.0f}s: commits wait for it, "
            "no new batch starts"
        )
    if caption:
        notes.append("stopped (resume with `kspout offsets set`): " + "; ".join(caption))
    if hidden:
        shown = ", ".join(HEADERS.get(name, name) for name in hidden)
        notes.append(f"hidden to fit the terminal: {shown} (widen it, or see --json)")
    if notes:
        table.caption = "\n".join(notes)
    return table


def _fits(table: Table, width: int) -> bool:
    """The table's widest rendering fits `width` columns."""
    unbounded = Console(width=MEASURE_WIDTH)  # a measurement is capped at the console's width
    return unbounded.measure(table).maximum <= width


def _stalls(view: PartitionView) -> str:
    """Stall episodes (commit point stuck for half the replay window), and the current one."""
    if view.stuck_for is None or not view.stalls:
        return str(view.stalls)
    return f"{view.stalls} (stuck {view.stuck_for:.0f}s)"


def _status(view: PartitionView) -> str:
    """`running`, `stopped`, or an open breaker with its wait and last error."""
    breaker = view.breaker
    if view.stopped is not None or breaker is None:
        return view.status
    wait = f" {breaker.retry_in:.0f}s" if breaker.retry_in else ""
    return f"{breaker.state.value}{wait}"


def progress_json(progress: Progress) -> dict[str, Any]:
    """The same facts as `progress_table`, as a JSON-ready dict."""
    return {
        "topic": progress.topic,
        "instance": progress.instance,
        "commits_refused": progress.commits_refused,
        "partitions_dropped": progress.partitions_dropped,
        "zookeeper_away_s": None
        if progress.zookeeper_away is None
        else round(progress.zookeeper_away, 3),
        "batches": progress.batches,
        "batch_errors": progress.batch_errors,
        "cancelled_batches": progress.cancelled,
        "isolation_runs": progress.isolation_runs,
        "elapsed_s": round(progress.elapsed, 3),
        "lag": progress.lag,
        "totals": {
            **{name: progress.total(name) for name in COUNTERS},
            "stalls": sum(v.stalls for v in progress.partitions),
        },
        "partitions": [
            {
                "partition": v.partition,
                "committed": v.committed,
                "low": v.low,
                "high": v.high,
                "lag": v.lag,
                "in_flight": v.stats.in_flight,
                "failed": v.stats.waiting,
                "dead_letter_pending": v.stats.dead_letter_pending,
                "status": v.status,
                "stopped": v.stopped,
                "stalls": v.stalls,
                "stuck_s": None if v.stuck_for is None else round(v.stuck_for, 3),
                "breaker": None
                if v.breaker is None
                else {
                    "state": v.breaker.state.value,
                    "failures": v.breaker.failures,
                    "retry_in_s": round(v.breaker.retry_in, 3),
                    "last_error": v.breaker.last_error,
                },
                **{name: getattr(v.stats, name) for name in COUNTERS},
            }
            for v in progress.partitions
        ],
        "failed_records": progress.failed_records,
        "failures": [failure_json(f) for f in progress.failures],
        "out_of_range_resets": [
            {
                "partition": p,
                "low": r.low,
                "high": r.high,
                "from": r.old_commit,
                "to": r.new_start,
                "lost": [list(x) for x in r.lost],
            }
            for p, r in progress.resets
        ],
    }


def failures_table(progress: Progress) -> Table:
    """What user code raised, by exception, message and place: the end of a run's report."""
    table = Table(
        title=f"{progress.failed_records} records failed, by exception and place",
        title_justify="left",
    )
    for name in ("exception", "place", "failures", "records", "dead-lettered", "partitions"):
        table.add_column(name, justify="left" if name in ("exception", "place") else "right")
    for f in progress.failures:
        table.add_row(
            f"{f.failure.kind}: {f.failure.message}" if f.failure.kind else f.failure.message,
            f.failure.place or "-",
            str(f.failures),
            str(f.records),
            str(f.dead_lettered),
            ", ".join(map(str, f.partitions)),
        )
    return table


def failure_json(summary: FailureSummary) -> dict[str, Any]:
    """One kind of failure for scripts, with its first traceback."""
    failure = summary.failure
    return {
        "exception": failure.kind or None,
        "message": failure.message,
        "place": failure.place or None,
        "failures": summary.failures,
        "records": summary.records,
        "dead_lettered": summary.dead_lettered,
        "partitions": list(summary.partitions),
        "traceback": failure.traceback or None,
    }

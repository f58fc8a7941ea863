"""Render a driver `Progress` for people (a rich table) and for scripts (JSON)."""

from __future__ import annotations

from typing import Any

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


def progress_table(progress: Progress, title: str | None = None) -> Table:
    """Per-partition table: commit point, high watermark, lag, counts; a totals row last."""
    table = Table(
        title=title or f"{progress.topic}: batch {progress.batches}, {progress.elapsed:.1f}s",
        title_justify="left",
    )
    counters = [c for c in COUNTERS if c not in OCCASIONAL or progress.total(c)]
    status = any(view.status != "running" for view in progress.partitions)
    stalls = any(view.stalls for view in progress.partitions)
    names = ("partition", *(("status",) if status else ()), "committed", "high", "lag")
    for name in (*names, "in flight", "failed", *counters, *(("stalls",) if stalls else ())):
        table.add_column(HEADERS.get(name, name), justify="right")
    for view in progress.partitions:
        s = view.stats
        table.add_row(
            str(view.partition),
            *((_status(view),) if status else ()),
            "-" if view.committed is None else str(view.committed),
            str(view.high),
            str(view.lag),
            str(s.in_flight),
            str(s.failed + s.dead_letter_pending),
            *(str(getattr(s, name)) for name in counters),
            *((_stalls(view),) if stalls else ()),
        )
    table.add_section()
    table.add_row(
        "all",
        *(("",) if status else ()),
        "",
        "",
        str(progress.lag),
        str(progress.total("in_flight")),
        str(progress.total("failed") + progress.total("dead_letter_pending")),
        *(str(progress.total(name)) for name in counters),
        *((str(sum(view.stalls for view in progress.partitions)),) if stalls else ()),
        style="bold",
    )
    caption = [f"{view.partition}: {view.stopped}" for view in progress.partitions if view.stopped]
    if caption:
        table.caption = "stopped (resume with `kspout offsets set`): " + "; ".join(caption)
    return table


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
                "failed": v.stats.failed,
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

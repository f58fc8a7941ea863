"""`kspout status` and `kspout lag`: who runs a spout, and how far behind it is.

`status` reads everything a spout keeps in ZooKeeper (the live instances' nodes, each with the
report its driver writes at a commit when it changed, and at least every 2 commit intervals;
the claims, pauses and assignment; every partition's record) beside Kafka's watermarks. A
partition's counts (in flight, waiting, dead-lettered, lost) come from its live owner's report,
so they are as old as that report: one older than `STALE_AFTER` commit intervals is marked stale
(the owner is stuck, or its clock is off).

`lag` reads only the records and Kafka's watermarks, for scripts and cron alerts. Lag is
`high - commit point`; a partition without a record counts from where `start` would begin.

Both exit 3 when they cannot tell (ZooKeeper or Kafka did not answer, the topic is missing,
the topic file is invalid), with a message that says what to check.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from kspout.cli.answers import echo_json, stdout_console
from kspout.cli.group import main
from kspout.cli.options import config_option, dev_option, json_option
from kspout.cli.views import PartitionPositions, age, iso, read_positions
from kspout.config import TopicConfig, load_config
from kspout.errors import KspoutError, resume_command
from kspout.kafka import KafkaMetadata
from kspout.kafka.transactions import OpenTransaction, TransactionProbe
from kspout.ownership.tree import Ownership, Pause, read_ownership
from kspout.ranges import runs
from kspout.wording import count
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import now_ms
from kspout.zk.session import ZkSession

WAITING = "waiting: open transaction"  # the status of a partition an open transaction holds
STALE_AFTER = 3  # commit intervals: a live driver reports at least every 2 (REPORT_EVERY)
COULD_NOT_TELL = 3  # exit code (1 is `lag`'s "above the threshold", 2 click's usage error)


class CouldNotTell(click.ClickException):
    """ZooKeeper or Kafka did not answer, or the topic or its file is wrong: exit code 3."""

    exit_code = COULD_NOT_TELL


@contextmanager
def could_not_tell() -> Iterator[None]:
    """kspout errors become one line on stderr, `could not tell: ...`, and exit code 3."""
    try:
        yield
    except KspoutError as exc:
        raise CouldNotTell(f"could not tell: {exc}") from None


def _start(config: TopicConfig, m: PartitionPositions) -> dict[str, Any] | None:
    """Where `start` begins (JSON), for a partition in Kafka without a record."""
    if m.start_offset is None:
        return None
    return {"position": str(config.start), "offset": m.start_offset}


# -- status: what it shows -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One live instance, as its node says (also its JSON shape)."""

    id: str
    host: str | None
    pid: int | None
    topology: str | None
    started_at: int | None  # wall ms
    since: str | None  # started_at, ISO 8601
    age_s: float | None
    leader: bool  # the live instance whose id sorts first balances the assignment
    partitions: list[int]  # claimed
    assigned: list[int]  # what the assignment gives it (differs while partitions move)
    report_at: int | None  # wall ms of its last report (None before its first commit)
    report_age_s: float | None
    stale: bool  # no report for STALE_AFTER commit intervals
    commits_refused: int | None
    partitions_dropped: int | None
    metrics: str | None  # its Prometheus endpoint, when it serves one


@dataclass(frozen=True, slots=True)
class PauseView:
    """An operator's pause of a partition."""

    by: str
    at: int  # wall ms
    reason: str
    acked_by: str | None
    acked_offset: int | None
    acked: bool  # nothing runs there: its owner acked it, or nobody owns it


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One partition (also its JSON shape). The counts are None when no live owner reports it."""

    partition: int
    owner: str | None  # the live instance holding its claim
    last_writer: str | None  # the instance (or operator) that last wrote its record
    assigned: str | None  # the instance the assignment gives it to (perhaps a stopped one)
    moving_to: str | None  # `assigned`, when another live instance is taking it over
    committed: int | None  # the record's offset
    start: dict[str, Any] | None  # where `start` begins, when there is no record
    low: int | None  # None: the partition is not in Kafka's metadata
    high: int | None
    lag: int | None  # high - committed (or - the start offset)
    out_of_range: bool  # the record's offset is outside Kafka's [low, high]
    in_flight: int | None
    waiting: int | None  # failed: waiting for a retry, or for their dead letter to be written
    dead_letter_pending: int | None  # those of `waiting` whose dead letter is not written yet
    dead_lettered: int | None
    lost: int | None
    report_stale: bool | None  # the owner's report is stale; None: no owner
    # running, paused, stopped, releasing, breaker open|half-open; None: no live owner reports it
    status: str | None
    stopped: str | None  # why `out_of_range = "fail"` stopped it
    pause: PauseView | None
    committed_at: int | None  # wall ms of the record's write
    commit_age_s: float | None
    # Caught up to its last stable offset, held there by an open transaction since `since_ms`
    open_transaction: OpenTransaction | None


COUNTS = ("in_flight", "waiting", "dead_letter_pending", "dead_lettered", "lost")
# The counts the table shows, with their headers (dead_letter_pending is part of waiting).
SHOWN = {"in_flight": "inflight", "waiting": "waiting", "dead_lettered": "dlq", "lost": "lost"}


@dataclass(frozen=True, slots=True)
class Status:
    """Everything `kspout status` shows (`asdict` is its JSON)."""

    topic: str
    spout: str
    instances: list[InstanceView]
    partitions: list[PartitionStatus]
    totals: dict[str, int]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _seconds(now: int, at: int | None) -> float | None:
    return None if at is None else round((now - at) / 1000, 3)


def _instance(
    name: str, node: Mapping[str, Any], own: Ownership, leader: bool, stale_ms: int, now: int
) -> InstanceView:
    report = _dict(node.get("report"))
    started_at, report_at = _int(node.get("started_at")), _int(report.get("at"))
    heard = report_at if report_at is not None else started_at
    return InstanceView(
        id=name,
        host=_str(node.get("host")),
        pid=_int(node.get("pid")),
        topology=_str(node.get("topology")),
        started_at=started_at,
        since=None if started_at is None else iso(started_at),
        age_s=_seconds(now, started_at),
        leader=leader,
        partitions=sorted(p for p, owner in own.claims.items() if owner == name),
        assigned=sorted(own.assignment.of(name)),
        report_at=report_at,
        report_age_s=_seconds(now, report_at),
        stale=heard is not None and now - heard > stale_ms,
        commits_refused=_int(report.get("refused")),
        partitions_dropped=_int(report.get("dropped")),
        metrics=_str(node.get("metrics")),
    )


def _pause(pause: Pause | None, owner: str | None) -> PauseView | None:
    if pause is None:
        return None
    acked = owner is None or pause.acked_by == owner
    return PauseView(pause.by, pause.at_ms, pause.reason, pause.acked_by, pause.acked_offset, acked)


def _state(
    stopped: str | None, paused: bool, reported: Mapping[str, Any], held: bool
) -> str | None:
    """The record's stop and the pause node first (they are current); else an open
    transaction that holds it (`held`), else the owner's word."""
    if stopped is not None:
        return "stopped"
    if paused:
        return "paused"
    if held:
        return WAITING
    state = _str(reported.get("status"))
    if state in ("open", "half-open"):
        return f"breaker {state}"
    if state == "paused":
        return "running"  # resumed since the report: the owner plans it at its next poll
    return state


def _partition(
    config: TopicConfig,
    m: PartitionPositions,
    own: Ownership,
    instances: Mapping[str, InstanceView],
    now: int,
    opened: OpenTransaction | None,
) -> PartitionStatus:
    owner = own.claims.get(m.partition)
    assigned = own.assignment.owners.get(m.partition)
    live = instances.get(owner) if owner is not None else None
    # The assignment node outlives the instances it names: a stopped one is nobody's target.
    moving_to = assigned if assigned in instances and assigned != owner else None
    reported: dict[str, Any] = {}
    if live is not None:
        report = _dict(own.instances[live.id].get("report"))
        reported = _dict(_dict(report.get("partitions")).get(str(m.partition)))
    failed, pending = _int(reported.get("waiting")), _int(reported.get("dead_letter_pending"))
    record = m.record
    stopped = record.stopped if record is not None else None
    pause = own.paused.get(m.partition)
    committed_at = record.committed_at if record is not None else None
    return PartitionStatus(
        partition=m.partition,
        owner=owner,
        last_writer=None if record is None else record.writer_id,
        assigned=assigned,
        moving_to=moving_to,
        committed=record.offset if record is not None else None,
        start=_start(config, m),
        low=None if m.watermarks is None else m.watermarks[0],
        high=None if m.watermarks is None else m.watermarks[1],
        lag=m.lag,
        out_of_range=m.out_of_range,
        in_flight=_int(reported.get("in_flight")),
        waiting=None if failed is None else failed + (pending or 0),
        dead_letter_pending=pending,
        dead_lettered=_int(reported.get("dead_lettered")),
        lost=_int(reported.get("lost")),
        report_stale=None if live is None else live.stale,
        status=_state(stopped, pause is not None, reported, opened is not None),
        stopped=stopped,
        pause=_pause(pause, owner),
        committed_at=committed_at,
        commit_age_s=_seconds(now, committed_at),
        open_transaction=opened,
    )


def _totals(rows: list[PartitionStatus]) -> dict[str, int]:
    return {
        "partitions": len(rows),
        "owned": sum(r.owner is not None for r in rows),
        "lag": sum(r.lag or 0 for r in rows),
        **{name: sum(getattr(r, name) or 0 for r in rows) for name in COUNTS},
        "paused": sum(r.status == "paused" for r in rows),
        "stopped": sum(r.status == "stopped" for r in rows),
    }


def _caught_up(positions: list[PartitionPositions]) -> dict[int, int]:
    """Partition -> its high (the last stable offset), for those committed up to it."""
    return {
        m.partition: m.watermarks[1]
        for m in positions
        if m.record is not None and m.watermarks is not None and m.record.offset >= m.watermarks[1]
    }


def collect_status(config: TopicConfig, *, now: int | None = None) -> Status:
    """Read the spout's nodes, its records and Kafka's watermarks; `now` in wall ms. The
    partitions committed up to their high are asked whether an open transaction holds them
    (`kspout.kafka.transactions`)."""
    with ZkSession(config) as session, KafkaMetadata(config) as kafka:
        own = read_ownership(session)
        positions = read_positions(config, ZkOffsetStore(session), kafka)
    caught_up = _caught_up(positions)
    opened = {}
    if caught_up:
        with TransactionProbe(config) as probe:
            opened = probe.open_above(caught_up)
    now = now_ms() if now is None else now
    stale_ms = int(STALE_AFTER * config.commit_interval * 1000)
    names = sorted(own.instances)
    instances = {
        name: _instance(name, own.instances[name], own, name == names[0], stale_ms, now)
        for name in names
    }
    rows = [_partition(config, m, own, instances, now, opened.get(m.partition)) for m in positions]
    return Status(config.topic, config.zk_spout_path, list(instances.values()), rows, _totals(rows))


# -- status: the tables ----------------------------------------------------------------------


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else f"{age(seconds)} ago"


def _ranges(partitions: list[int]) -> str:
    """`0-3, 7, 9-10`."""
    spans = runs(partitions)
    return ", ".join(str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}" for lo, hi in spans) or "-"


def _instances_table(status: Status) -> Table:
    metrics = any(i.metrics for i in status.instances)
    table = Table(
        title=f"{status.topic}: spout {status.spout}, "
        f"{count(len(status.instances), 'live instance')}",
        title_justify="left",
    )
    names = ("instance", "host", "pid", "since", "owns", "report", "refused")
    for name in (*names, *(("metrics",) if metrics else ())):
        table.add_column(name, justify="right" if name in ("pid", "refused") else "left")
    for i in status.instances:
        owns = _ranges(i.partitions)
        if i.assigned != i.partitions:
            owns += f" (assigned {_ranges(i.assigned)})"
        report = "none yet" if i.report_at is None else _ago(i.report_age_s)
        report_text = Text(f"{report} (stale)", style="bold red") if i.stale else Text(report)
        table.add_row(
            Text(i.id + (" (leader)" if i.leader else "")),
            Text(_dash(i.host)),
            _dash(i.pid),
            "-" if i.since is None else f"{i.since} ({_ago(i.age_s)})",
            owns,
            report_text,
            _dash(i.commits_refused),
            *((Text(_dash(i.metrics)),) if metrics else ()),
        )
    return table


def _owner_text(row: PartitionStatus, live: set[str]) -> Text:
    """The owner; `unowned` while instances run but none holds it, `none` when none runs,
    with the last writer of its record when that one is gone."""
    if row.owner is None:
        text = Text("unowned", style="yellow") if live else Text("none")
        if row.last_writer is not None and row.last_writer not in live:
            text.append(f" (last: {row.last_writer}, not running)")
    else:
        text = Text(row.owner + (" (stale)" if row.report_stale else ""))
    if row.moving_to is not None:
        text.append(f" -> {row.moving_to}")
    return text


def _committed_text(committed: int | None, start: dict[str, Any] | None) -> str:
    if start is not None:
        return f"- (start {start['position']}: {_dash(start['offset'])})"
    return _dash(committed)


def _lag_text(row: PartitionStatus) -> str:
    if row.low is None:
        return "- (not in Kafka)"
    return f"{row.lag} (out of range)" if row.out_of_range else _dash(row.lag)


def _status_text(row: PartitionStatus) -> Text:
    if row.status == "paused" and row.pause is not None:
        return Text("paused" + (", acked" if row.pause.acked else ", not acked"), style="yellow")
    if row.status in ("stopped", "breaker open"):
        return Text(row.status, style="bold red")
    return Text(_dash(row.status))


def _partitions_table(status: Status) -> Table:
    table = Table(title=f"{status.topic}: partitions", title_justify="left")
    names = ("partition", "owner", "committed", "low", "high", "lag")
    for name in (*names, *SHOWN.values(), "status", "commit age"):
        table.add_column(name, justify="left" if name in ("owner", "status") else "right")
    for row in status.partitions:
        table.add_row(
            str(row.partition),
            _owner_text(row, {i.id for i in status.instances}),
            _committed_text(row.committed, row.start),
            _dash(row.low),
            _dash(row.high),
            _lag_text(row),
            *(_dash(getattr(row, name)) for name in SHOWN),
            _status_text(row),
            _ago(row.commit_age_s),
        )
    t = status.totals
    states = ", ".join(f"{t[s]} {s}" for s in ("paused", "stopped") if t[s])
    table.add_section()
    table.add_row(
        "all",
        f"{t['owned']}/{t['partitions']} owned",
        "",
        "",
        "",
        str(t["lag"]),
        *(str(t[name]) for name in SHOWN),
        states,
        "",
        style="bold",
    )
    return table


def _waiting_note(partition: int, held: OpenTransaction, now: int) -> str:
    since = f"{iso(held.since_ms)} ({_ago((now - held.since_ms) / 1000)})"
    return (
        f"partition {partition} waiting on an open transaction since {since}: offsets "
        f"{held.stable}-{held.written - 1} are written but not committed; nothing past "
        f"{held.stable} is read until its producer commits or aborts it (or the broker aborts it "
        "after the producer's transaction.timeout.ms)"
    )


def _notes(status: Status, config_path: str, now: int) -> list[str]:
    """What the tables abbreviate: who paused what, why a partition stopped, what resumes it."""
    out = []
    quoted = shlex.quote(config_path)
    for row in status.partitions:
        p, pause = row.partition, row.pause
        if pause is not None:
            if row.owner is None:
                ack = "nobody owns it"
            elif pause.acked:
                ack = f"acked by {pause.acked_by} at offset {_dash(pause.acked_offset)}"
            else:
                ack = f"not acked yet: {row.owner} still finishes what runs there"
            out.append(
                f"partition {p} paused by {pause.by} {_ago((now - pause.at) / 1000)} "
                f"({pause.reason}); {ack}; `kspout resume --config {quoted} --partition {p}` "
                "resumes it"
            )
        if row.open_transaction is not None:
            out.append(_waiting_note(p, row.open_transaction, now))
        if row.stopped is not None:
            out.append(f"partition {p} stopped: {row.stopped}")
            out.append(f"  resume it from Kafka's earliest: {resume_command(config_path, p)}")
    return out


@main.command()
@config_option
@dev_option(could_not_tell)
@json_option
def status(config_path: str, as_json: bool) -> None:
    """Live instances, and each partition's owner, commit point, lag, counts and state.

    Prints a table of the instances and one of the partitions with a totals row (--json:
    {"topic", "spout", "instances", "partitions", "totals"}). Counts (in flight, waiting,
    dead-lettered, lost) come from the owner's last report.

    \b
    Exit codes:
      0  shown
      2  usage error
      3  could not tell: ZooKeeper or Kafka did not answer, the topic is missing or the
         topic file is invalid (the message says what to check)
    """
    with could_not_tell():
        config = load_config(config_path)
        now = now_ms()
        found = collect_status(config, now=now)
    if as_json:
        echo_json(asdict(found))
        return
    console = stdout_console()
    if found.instances:
        console.print(_instances_table(found))
    else:
        click.echo(
            f"no live instance of spout {found.spout}: nothing consumes {found.topic}; start one "
            "with `kspout run`"
        )
    console.print(_partitions_table(found))
    for note in _notes(found, config_path, now):
        click.echo(note)


# -- lag -------------------------------------------------------------------------------------


@main.command(name="lag")
@config_option
@dev_option(could_not_tell)
@click.option(
    "--threshold",
    type=click.IntRange(min=0),
    metavar="N",
    help="Exit 1 when the total lag is above N.",
)
@json_option
@click.pass_context
def lag_command(ctx: click.Context, config_path: str, threshold: int | None, as_json: bool) -> None:
    """Each partition's lag and the total, from the records and Kafka's high watermarks only.

    Lag is Kafka's high watermark minus the stored commit point; a partition without a record
    counts from where the topic file's `start` begins. Prints a table with a totals row (--json:
    {"topic", "spout", "lag", "threshold", "above", "behind", "partitions"}).

    \b
    Exit codes, for cron alerts:
      0  total lag <= N (or no --threshold)
      1  total lag above N (the partitions behind are printed)
      2  usage error
      3  could not tell: ZooKeeper or Kafka did not answer, the topic is missing or the
         topic file is invalid (the message says what to check)
    """
    with could_not_tell():
        config = load_config(config_path)
        with ZkSession(config) as session, KafkaMetadata(config) as kafka:
            positions = read_positions(config, ZkOffsetStore(session), kafka)
    rows = [
        {
            "partition": m.partition,
            "committed": None if m.record is None else m.record.offset,
            "start": _start(config, m),
            "high": None if m.watermarks is None else m.watermarks[1],
            "lag": m.lag,
        }
        for m in positions
    ]
    lags = {m.partition: m.lag for m in positions if m.lag is not None}
    total = sum(lags.values())
    above = threshold is not None and total > threshold
    behind = sorted((p for p, n in lags.items() if n), key=lambda p: (-lags[p], p))
    if as_json:
        report = {"topic": config.topic, "spout": config.zk_spout_path, "lag": total}
        report |= {"threshold": threshold, "above": above, "behind": behind, "partitions": rows}
        echo_json(report)
    else:
        stdout_console().print(_lag_table(config, rows, total))
        if above:
            shown = ", ".join(f"{p} ({lags[p]})" for p in behind)
            click.echo(f"total lag {total} is above {threshold}; partitions behind: {shown}")
    if above:
        ctx.exit(1)


def _lag_table(config: TopicConfig, rows: list[dict[str, Any]], total: int) -> Table:
    table = Table(
        title=f"{config.topic}: lag of spout {config.zk_spout_path}", title_justify="left"
    )
    for name in ("partition", "committed", "high", "lag"):
        table.add_column(name, justify="right")
    for row in rows:
        table.add_row(
            str(row["partition"]),
            _committed_text(row["committed"], row["start"]),
            _dash(row["high"]),
            "- (not in Kafka)" if row["high"] is None else _dash(row["lag"]),
        )
    table.add_section()
    table.add_row("all", "", "", str(total), style="bold")
    return table

"""`kspout offsets show|set|reset`: inspect and move a spout's offsets stored in ZooKeeper.

`show` puts each partition's stored commit point next to Kafka's watermarks, with the lag and
the last writer, and marks the partitions `out_of_range = "fail"` stopped, with the `set` command
that resumes each. `set` is the operator's move (after such a stop, or to replay or skip data);
`reset` moves to the topic file's `start` position. Both refuse a partition that a live
instance owns and runs, because the owner would lose its next commit there, unless it is
stopped (nobody commits it; the owner resumes it from the new offset) or paused with the
owner's ack; `--force` pauses such partitions, waits for their owners to finish what runs
there, moves them and resumes them. They also refuse a move back past messages that may have
been finished longer ago than the replay window the record keeps (the dedup bolt's `[dedup]
ttl`): their DONE records may be gone, so their effects would apply again. `--force` overrides
that too, and the command then says what will apply again.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from kspout.cli.answers import change, echo_json, stdout_console
from kspout.cli.group import main
from kspout.cli.options import (
    chosen_partitions,
    config_option,
    dev_option,
    json_option,
    kspout_errors,
    partition_options,
)
from kspout.cli.pausing import paused_while
from kspout.cli.views import read_positions
from kspout.config import TopicConfig, load_config
from kspout.errors import (
    OffsetOutOfRange,
    OffsetRecordInvalid,
    ReplayPastWindow,
    SpoutRunning,
    resume_command,
)
from kspout.kafka import KafkaMetadata
from kspout.ownership.tree import read_ownership
from kspout.policy import Position
from kspout.wording import count
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset, describe_replay, now_ms
from kspout.zk.registry import live_instances
from kspout.zk.session import ZkSession


@main.group()
def offsets() -> None:
    """Inspect and move the offsets a spout stored in ZooKeeper."""


# -- show ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition as `show` reports it (also its JSON shape)."""

    partition: int
    stored_offset: int | None
    low: int | None  # None: the partition is not in Kafka's metadata (a leftover record)
    high: int | None
    lag: int | None  # high - stored_offset
    out_of_range: bool  # the stored offset is outside Kafka's [low, high]
    stopped: str | None  # why `out_of_range = "fail"` stopped it; None when it is not stopped
    start: dict[str, Any] | None  # where `start` would begin, when nothing is stored
    writer_name: str | None
    writer_id: str | None
    writer_live: bool  # the last writer is a registered (running) instance


def _view(
    partition: int,
    stored: StoredOffset | None,
    watermarks: tuple[int, int] | None,
    start: Position,
    start_offset: int | None,
    live: set[str],
) -> PartitionView:
    low, high = watermarks if watermarks is not None else (None, None)
    offset = stored.offset if stored is not None else None
    lag = high - offset if high is not None and offset is not None else None
    writer_id = stored.writer_id if stored is not None else None
    return PartitionView(
        partition=partition,
        stored_offset=offset,
        low=low,
        high=high,
        lag=lag,
        out_of_range=(
            offset is not None
            and low is not None
            and high is not None
            and not low <= offset <= high
        ),
        stopped=stored.stopped if stored is not None else None,
        start=None if stored is not None else {"position": str(start), "offset": start_offset},
        writer_name=stored.writer_name if stored is not None else None,
        writer_id=writer_id,
        writer_live=writer_id in live,
    )


def _collect(config: TopicConfig) -> tuple[list[PartitionView], list[str]]:
    """Every partition Kafka knows, plus any stored record for a partition it does not."""
    with ZkSession(config) as session, KafkaMetadata(config) as kafka:
        positions = read_positions(config, ZkOffsetStore(session), kafka)
        live = live_instances(session)
    views = [
        _view(m.partition, m.record, m.watermarks, config.start, m.start_offset, set(live))
        for m in positions
    ]
    return views, live


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _lag_text(view: PartitionView) -> str:
    if view.start is not None:
        return f"- (start {view.start['position']}: {_dash(view.start['offset'])})"
    if view.low is None:
        return "- (not in Kafka)"
    return f"{view.lag} (out of range)" if view.out_of_range else str(view.lag)


def _status(view: PartitionView) -> Text:
    if view.stopped is None:
        return Text("-")
    return Text(f"STOPPED: {view.stopped}", style="bold red")


def _print_table(
    config: TopicConfig, config_path: str, views: list[PartitionView], live: list[str]
) -> None:
    table = Table(title=f"{config.topic}: spout {config.zk_spout_path}")
    for name in ("partition", "stored", "low", "high"):
        table.add_column(name, justify="right")
    table.add_column("lag")
    table.add_column("status", overflow="fold")
    table.add_column("last writer", overflow="fold")
    table.add_column("live")
    for view in views:
        writer = "-" if view.writer_id is None else f"{view.writer_name}/{view.writer_id}"
        table.add_row(
            str(view.partition),
            _dash(view.stored_offset),
            _dash(view.low),
            _dash(view.high),
            _lag_text(view),
            _status(view),
            Text(writer),
            "yes" if view.writer_live else ("-" if view.writer_id is None else "no"),
        )
    table.caption = f"live instances: {', '.join(live)}" if live else "no live instance registered"
    stdout_console().print(table)
    stopped = [view for view in views if view.stopped is not None]
    if stopped:
        # Plain echo, not rich: a command must not be wrapped or read as markup.
        click.echo(
            f'{count(len(stopped), "partition")} stopped by out_of_range = "fail"; moving the '
            "offset resumes one (--to latest, an offset or timestamp:<ms> work too):"
        )
        for view in stopped:
            click.echo(f"  {resume_command(config_path, view.partition)}")


@offsets.command()
@config_option
@dev_option()
@json_option
def show(config_path: str, as_json: bool) -> None:
    """Stored offset, watermarks, lag, stop and last writer of every partition of the topic.

    Prints a table, and the command that resumes each stopped partition (--json:
    {"topic", "spout", "live_instances", "partitions"}).
    """
    with kspout_errors():
        config = load_config(config_path)
        views, live = _collect(config)
    if as_json:
        echo_json(
            {
                "topic": config.topic,
                "spout": config.zk_spout_path,
                "live_instances": live,
                "partitions": [asdict(view) for view in views],
            }
        )
    else:
        _print_table(config, config_path, views, live)


# -- set -------------------------------------------------------------------------------------


def _parse_target(ctx: click.Context, param: click.Parameter, value: str) -> int | Position:
    """`--to`: an offset, or `earliest`, `latest`, `timestamp:<ms>`."""
    if value.strip().isdigit():
        return int(value)
    try:
        return Position.parse(value, allow_fail=False)
    except ValueError as exc:
        raise click.BadParameter(f"an offset or {exc}", ctx, param) from None


def _targets(
    config: TopicConfig, kafka: KafkaMetadata, partitions: list[int], target: int | Position
) -> dict[int, int]:
    """The offset to move each partition to, all checked before anything is written."""
    chosen = {}
    for partition in partitions:
        if isinstance(target, Position):
            chosen[partition] = kafka.resolve(target, config.topic, partition)
            continue
        low, high = kafka.watermarks(config.topic, partition)
        if not low <= target <= high:
            raise OffsetOutOfRange(
                config.topic,
                partition,
                target,
                low,
                high,
                hint=f"choose an offset from {low} to {high} (inclusive), or earliest, latest "
                "or timestamp:<ms>",
            )
        chosen[partition] = target
    return chosen


def _blocked(store: ZkOffsetStore, partitions: list[int]) -> dict[int, str]:
    """The partitions a live instance owns and still runs: partition -> owner. A partition
    stopped by `out_of_range = "fail"`, or paused with the owner's ack, runs nothing."""
    own = read_ownership(store.session)
    out = {}
    for p in partitions:
        owner = own.claims.get(p)
        pause = own.paused.get(p)
        if owner is None or (pause is not None and pause.acked_by == owner):
            continue
        try:
            record = store.read(p)
        except OffsetRecordInvalid:
            record = None  # `--force` repairs it
        if record is None or record.stopped is None:
            out[p] = owner
    return out


def _past_window(store: ZkOffsetStore, moves: dict[int, int]) -> dict[int, tuple[float, str]]:
    """Partitions whose move replays offsets that may have been finished longer ago than the
    window their record keeps: partition -> (window, what will apply again, for people)."""
    now = now_ms()
    out: dict[int, tuple[float, str]] = {}
    for partition, offset in moves.items():
        try:
            record = store.read(partition)
        except OffsetRecordInvalid:
            continue  # it says nothing about when its offsets finished (the move repairs it)
        if record is None or record.window is None:
            continue
        ranges = record.replay_past_window(offset, record.window, now, keep_done=False)
        if ranges:
            out[partition] = (record.window, describe_replay(record, ranges, now))
    return out


@offsets.command(name="set")
@config_option
@dev_option()
@partition_options
@click.option(
    "--to",
    "target",
    required=True,
    callback=_parse_target,
    help="An offset, earliest, latest or timestamp:<ms>.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Pause partitions live instances run, move them, resume them; move back past the "
    "dedup window too (messages finished longer ago than [dedup] ttl then apply again).",
)
@json_option
def set_offsets(
    config_path: str,
    chosen: tuple[int, ...],
    every: bool,
    target: int | Position,
    force: bool,
    as_json: bool,
) -> None:
    """Move the stored offset (the next offset to process) of some or all partitions.

    Prints `topic[partition]: from -> to` per partition (--json: {"topic", "spout", "action",
    "dry_run", "partitions"}, each with "changed", "from", "to", "applies_again").
    """
    _move(config_path, chosen, every, target, force, as_json, "set")


@offsets.command(name="reset")
@config_option
@dev_option()
@partition_options
@click.option("--force", is_flag=True, help="As for `set`.")
@json_option
def reset_offsets(
    config_path: str,
    chosen: tuple[int, ...],
    every: bool,
    force: bool,
    as_json: bool,
) -> None:
    """Move the stored offset of some or all partitions to the topic file's `start`.

    Prints and answers --json as `offsets set` does.
    """
    with kspout_errors():
        start = load_config(config_path).start
    _move(config_path, chosen, every, start, force, as_json, "reset")


def _move(
    config_path: str,
    chosen: tuple[int, ...],
    every: bool,
    target: int | Position,
    force: bool,
    as_json: bool,
    action: str,
) -> None:
    """`set` and `reset` (the `action`): check, then move each chosen partition (see the
    module docstring)."""
    with kspout_errors():
        config = load_config(config_path)
        with ZkSession(config) as session, KafkaMetadata(config) as kafka:
            store = ZkOffsetStore(session, instance_id=f"operator@{socket.gethostname()}")
            partitions = chosen_partitions(
                config.topic, kafka.require_topic(config.topic), chosen, every
            )
            moves = _targets(config, kafka, partitions, target)
            again = _past_window(store, moves)
            if again and not force:
                raise ReplayPastWindow(
                    config.topic,
                    min(window for window, _ in again.values()),
                    [text for _, text in again.values()],
                    "pass --force: those effects then apply again",
                )
            running = _blocked(store, partitions)
            if running and not force:
                raise SpoutRunning(store.path, sorted(set(running.values())), sorted(running))
            with paused_while(session, config, sorted(running)):
                done = [(p, store.move(p, offset)) for p, offset in moves.items()]
    report = [
        {
            "partition": p,
            "changed": moved.data["kspout"]["moved_from"] != moved.offset,
            "from": moved.data["kspout"]["moved_from"],
            "to": moved.offset,
            "applies_again": again[p][1] if p in again else None,
        }
        for p, moved in done
    ]
    if as_json:
        echo_json(change(config.topic, config.zk_spout_path, action, report, dry_run=False))
        return
    for row in report:
        click.echo(f"{config.topic}[{row['partition']}]: {_dash(row['from'])} -> {row['to']}")
        if row["applies_again"]:
            click.echo(f"  applies again, past the dedup window: {row['applies_again']}")

"""`kspout dlq show|replay`: list a topic's dead letters, and produce chosen ones back.

Both read the dead-letter topic (`dead_letter_topic`, default `<topic>.dlq`) from low to high
and choose letters by source partition, reason, time, or exact `DLQ_PARTITION:OFFSET` (as
`show` lists them). `replay` writes each chosen letter back to its source topic (or
`--to-topic`) with its key, value and original headers, plus a `kspout.replayed_from` mark: the
message id the dedup bolt reads is unchanged, so under the bolt a letter applies at most once
however often it is replayed. An operator must choose: `replay` refuses to run without a
filter or `--offset` unless `--all` is given.

Exit codes: 0 done, or nothing matched (said on stderr with `--json`); 1 an error, with what
to do next (a replay Kafka did not acknowledge lists what to replay again); 2 a usage error.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from kspout.cli.answers import echo_json, stdout_console
from kspout.cli.group import main
from kspout.cli.options import config_option, dev_option, json_option, kspout_errors
from kspout.config import TopicConfig, load_config
from kspout.kafka.dead_letter_log import (
    DeadLetterLog,
    LetterFilter,
    LetterReplayer,
    LetterScan,
    Replay,
    ReplayFailed,
    StoredLetter,
    replay_target,
)
from kspout.wording import count

F = TypeVar("F", bound=Callable[..., Any])

# Table cells are clipped to these widths; `--json` has the whole text.
ERROR_WIDTH = 48
KEY_WIDTH = 24


@main.group()
def dlq() -> None:
    """List and replay the dead letters of a topic."""


# -- options ---------------------------------------------------------------------------------


def _parse_time(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """`--since`/`--until`: ms since the epoch, or ISO 8601 (UTC unless it names a zone)."""
    if value is None:
        return None
    if value.strip().isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            "expected ms since the epoch or an ISO 8601 time such as 2024-05-01T12:00:00Z "
            f"(UTC unless it names a zone), got {value!r}",
            ctx,
            param,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _parse_offsets(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> frozenset[tuple[int, int]]:
    """`--offset P:O` (repeatable): exact letters, as `dlq show` lists them."""
    chosen = set()
    for value in values:
        partition, _, offset = value.partition(":")
        if not (partition.strip().isdigit() and offset.strip().isdigit()):
            raise click.BadParameter(
                f"expected DLQ_PARTITION:OFFSET as `kspout dlq show` lists it, got {value!r}",
                ctx,
                param,
            )
        chosen.add((int(partition), int(offset)))
    return frozenset(chosen)


def _filter_options(command: F) -> F:
    """The options that choose letters, shared by `show` and `replay`."""
    options = [
        click.option(
            "--partition",
            "partitions",
            type=click.IntRange(min=0),
            multiple=True,
            help="Letters from this source partition (repeatable).",
        ),
        click.option(
            "--reason",
            metavar="TEXT",
            help="Letters whose reason contains TEXT, any case: exception, timeout, crash, "
            "invalid, behind, ...",
        ),
        click.option(
            "--since",
            "since_ms",
            callback=_parse_time,
            help="Dead-lettered at or after: ms since the epoch or ISO 8601 (UTC by default).",
        ),
        click.option(
            "--until",
            "until_ms",
            callback=_parse_time,
            help="Dead-lettered before: ms since the epoch or ISO 8601 (UTC by default).",
        ),
        click.option(
            "--limit", type=click.IntRange(min=1), help="At most N letters, the oldest first."
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


# -- reading ---------------------------------------------------------------------------------


@contextmanager
def _progress_bar(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress callback drawing on stderr when it is a terminal; None otherwise."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def _find(config: TopicConfig, chosen: LetterFilter, limit: int | None) -> LetterScan:
    with DeadLetterLog(config) as log, _progress_bar(f"reading {config.dlq_topic}") as progress:
        return log.find(chosen, limit=limit, on_progress=progress)


def _nothing(config: TopicConfig, scan: LetterScan, chosen: LetterFilter) -> str:
    """Why no letter was found, for people."""
    if not scan.exists:
        return f"no dead letters: {scan.dlq_topic} does not exist (nothing was dead-lettered)"
    if chosen.narrows:
        return f"no dead letter of {config.topic} on {scan.dlq_topic} matches the filters"
    return f"no dead letters of {config.topic} on {scan.dlq_topic}"


# -- rendering -------------------------------------------------------------------------------


def printable(raw: bytes | None) -> str | None:
    """Bytes as text a terminal shows safely: UTF-8, other bytes and controls escaped."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "backslashreplace")
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def _clip(text: str | None, width: int) -> str:
    if text is None:
        return "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _time(ms: int) -> str:
    if ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def letter_json(letter: StoredLetter) -> dict[str, Any]:
    """One letter for scripts: the whole error, the key as printable text."""
    return {
        "dlq_partition": letter.dlq_partition,
        "dlq_offset": letter.dlq_offset,
        "timestamp": letter.timestamp,
        "source_topic": letter.source_topic,
        "source_partition": letter.source_partition,
        "source_offset": letter.source_offset,
        "attempts": letter.attempts,
        "reason": letter.reason,
        "error": letter.error,
        "traceback": letter.traceback or None,
        "key": printable(letter.key),
    }


def replay_json(result: Replay) -> dict[str, Any]:
    """One replay for scripts: the letter, where it went (or would go), and why it did not."""
    return letter_json(result.letter) | {
        "to_topic": result.topic,
        "to_partition": result.partition,
        "to_offset": result.offset,
        "replayed": result.error is None and result.offset is not None,
        "replay_error": result.error,
    }


def letters_answer(config: TopicConfig, scan: LetterScan) -> dict[str, Any]:
    """`dlq show --json`: the letters found, and how many offsets were read for them."""
    return {
        "topic": config.topic,
        "dlq_topic": scan.dlq_topic,
        "read": scan.read,
        "foreign": scan.foreign,
        "letters": [letter_json(letter) for letter in scan.letters],
    }


def replays_answer(config: TopicConfig, results: list[Replay], dry_run: bool) -> dict[str, Any]:
    """`dlq replay --json`: each chosen letter and where it went (or would go)."""
    return {
        "topic": config.topic,
        "dlq_topic": config.dlq_topic,
        "action": "replay",
        "dry_run": dry_run,
        "letters": [replay_json(result) for result in results],
    }


def _letters_table(config: TopicConfig, scan: LetterScan) -> Table:
    table = Table(title=f"{scan.dlq_topic}: dead letters of {config.topic}", title_justify="left")
    for name in ("dlq p:o", "dead-lettered", "partition", "offset", "attempts"):
        table.add_column(name, justify="right")
    for name in ("reason", "error", "key"):
        table.add_column(name)
    for letter in scan.letters:
        table.add_row(
            f"{letter.dlq_partition}:{letter.dlq_offset}",
            _time(letter.timestamp),
            str(letter.source_partition),
            str(letter.source_offset),
            str(letter.attempts),
            Text(letter.reason),
            Text(_clip(letter.error or None, ERROR_WIDTH)),
            Text(_clip(printable(letter.key), KEY_WIDTH)),
        )
    foreign = f" ({count(scan.foreign, 'other record')} skipped)" if scan.foreign else ""
    table.caption = (
        f"{count(len(scan.letters), 'letter')}, {count(scan.read, 'offset')} read{foreign}"
    )
    return table


def _destination(result: Replay, dry_run: bool) -> Text:
    if result.error is not None:
        return Text(f"NOT replayed: {result.error}", style="bold red")
    partition = "?" if result.partition is None else str(result.partition)
    offset = "" if result.offset is None else f"@{result.offset}"
    return Text(f"{'would go to ' if dry_run else ''}{result.topic}[{partition}]{offset}")


def _replays_table(results: list[Replay], dry_run: bool) -> Table:
    done = sum(result.error is None for result in results)
    letters = count(done, "letter")
    title = f"dry run: would replay {letters}" if dry_run else f"replayed {letters}"
    table = Table(title=title, title_justify="left")
    for name in ("dlq p:o", "partition", "offset"):
        table.add_column(name, justify="right")
    for name in ("reason", "key", "to"):
        table.add_column(name)
    for result in results:
        letter = result.letter
        table.add_row(
            f"{letter.dlq_partition}:{letter.dlq_offset}",
            str(letter.source_partition),
            str(letter.source_offset),
            Text(letter.reason),
            Text(_clip(printable(letter.key), KEY_WIDTH)),
            _destination(result, dry_run),
        )
    return table


def _print_replays(
    config: TopicConfig, results: list[Replay], dry_run: bool, as_json: bool
) -> None:
    if as_json:
        echo_json(replays_answer(config, results, dry_run))
    else:
        stdout_console().print(_replays_table(results, dry_run))


# -- commands --------------------------------------------------------------------------------


@dlq.command()
@config_option
@dev_option()
@_filter_options
@json_option
def show(
    config_path: str,
    partitions: tuple[int, ...],
    reason: str | None,
    since_ms: int | None,
    until_ms: int | None,
    limit: int | None,
    as_json: bool,
) -> None:
    """List the topic's dead letters: where each lies, where it came from, why it failed.

    Prints a table, one letter a row (--json: {"topic", "dlq_topic", "read", "foreign",
    "letters"}, each letter with its whole error).
    """
    chosen = LetterFilter(frozenset(partitions), reason, since_ms, until_ms)
    with kspout_errors():
        config = load_config(config_path)
        scan = _find(config, chosen, limit)
    if as_json:
        echo_json(letters_answer(config, scan))
        if not scan.letters:
            click.echo(_nothing(config, scan, chosen), err=True)
    elif scan.letters:
        stdout_console().print(_letters_table(config, scan))
        # Plain echo, not rich: a command must not be wrapped or read as markup.
        click.echo(
            f"replay one with: kspout dlq replay --config {shlex.quote(config_path)} "
            "--offset <dlq p:o>"
        )
    else:
        click.echo(_nothing(config, scan, chosen))


@dlq.command()
@config_option
@dev_option()
@_filter_options
@click.option(
    "--offset",
    "offsets",
    multiple=True,
    callback=_parse_offsets,
    metavar="DLQ_PARTITION:OFFSET",
    help="An exact letter, as `dlq show` lists it (repeatable).",
)
@click.option("--to-topic", help="Write to this topic instead of each letter's source topic.")
@click.option(
    "--all",
    "all_letters",
    is_flag=True,
    help="Replay every dead letter of the topic (needed when no filter or --offset is given).",
)
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; write nothing.")
@json_option
def replay(
    config_path: str,
    partitions: tuple[int, ...],
    reason: str | None,
    since_ms: int | None,
    until_ms: int | None,
    limit: int | None,
    offsets: frozenset[tuple[int, int]],
    to_topic: str | None,
    all_letters: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Produce chosen dead letters again: same key, value and headers, plus a replay mark.

    The producer is idempotent (acks=all) and every delivery is checked; under the dedup bolt
    a replayed letter applies at most once, however often it is replayed. Prints a table of the
    letters and where each went (--json: {"topic", "dlq_topic", "action", "dry_run",
    "letters"}).
    """
    chosen = LetterFilter(frozenset(partitions), reason, since_ms, until_ms, offsets)
    if not chosen.narrows and not all_letters:
        raise click.UsageError(
            "choose the letters to replay with --partition, --reason, --since, --until or "
            "--offset (see `kspout dlq show`), or pass --all to replay every dead letter"
        )
    if chosen.narrows and all_letters:
        raise click.UsageError("--all replays every dead letter: drop it, or drop the filters")
    with kspout_errors():
        config = load_config(config_path)
        scan = _find(config, chosen, limit)
        if not scan.letters:
            if as_json:
                echo_json(replays_answer(config, [], dry_run))
            click.echo(_nothing(config, scan, chosen), err=as_json)
            return
        if dry_run:
            results = [
                Replay(letter, *replay_target(letter, to_topic), None) for letter in scan.letters
            ]
        else:
            results = _replay(config, scan.letters, to_topic, as_json)
    _print_replays(config, results, dry_run, as_json)


def _replay(
    config: TopicConfig, letters: list[StoredLetter], to_topic: str | None, as_json: bool
) -> list[Replay]:
    """Replay the letters; on a failure, print every outcome before the error."""
    try:
        with LetterReplayer(config) as replayer:
            return replayer.replay(letters, to_topic)
    except ReplayFailed as exc:
        _print_replays(config, exc.results, False, as_json)
        raise

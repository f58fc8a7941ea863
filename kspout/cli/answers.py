"""How the commands answer: one JSON shape per kind of answer, and tables that fit.

Every `--json` answer is one JSON object, never a bare list, so that a script can read any
command's answer the same way and a field can be added without breaking it:

* about a topic's partitions (`status`, `lag`, `offsets show`, `run`):
  `{"topic", "spout", ..., "partitions": [{"partition", ...}, ...]}`
* a change to partitions (`pause`, `resume`, `rebalance`, `offsets set|reset`):
  `{"topic", "spout", "action", "dry_run", "partitions": [{"partition", "changed", ...}, ...]}`
* about dead letters (`dlq show`) and a change to them (`dlq replay`):
  `{"topic", "dlq_topic", ..., "letters": [{"dlq_partition", "dlq_offset", ...}, ...]}`
* the dev stack (`dev up|status|down`): `{"dir", "up", ...}`

Tables go to a terminal at its width (rich's), and to a pipe or file at `$COLUMNS` or
`PIPE_WIDTH`, wide enough that numbers are never cut to an ellipsis in logs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kspout.wording import yes_no

PIPE_WIDTH = 140  # columns for tables written to a pipe or file (rich's default there is 80)


def echo_json(answer: Mapping[str, Any]) -> None:
    """Print one answer as indented JSON on stdout."""
    click.echo(json.dumps(answer, indent=2))


def change(
    topic: str, spout: str, action: str, rows: Sequence[Mapping[str, Any]], *, dry_run: bool
) -> dict[str, Any]:
    """The answer of a command that changes partitions: each row names its `partition` and
    says whether it `changed`."""
    return {
        "topic": topic,
        "spout": spout,
        "action": action,
        "dry_run": dry_run,
        "partitions": [dict(row) for row in rows],
    }


def cell(value: object) -> str:
    """A value as a table cell: `-` for nothing, yes/no for a flag, else its text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return yes_no(value)
    return str(value)


def stdout_console() -> Console:
    """The console tables go to: the terminal's width, or `PIPE_WIDTH` in a pipe (unless
    `$COLUMNS` says otherwise)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def rows_table(title: str, rows: Sequence[Mapping[str, Any]], headers: Mapping[str, str]) -> Table:
    """A table of `rows`, one column per key of `headers` (key -> column header)."""
    table = Table(title=title, title_justify="left")
    for header in headers.values():
        table.add_column(header)
    for row in rows:
        table.add_row(*(cell(row.get(key)) for key in headers))
    return table

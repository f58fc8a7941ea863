"""`kspout dev up|status|down`: run the embedded dev stack in the background of a shell session.

`up` prints a table on stderr and `export KSPOUT_...=...` on stdout, so `eval "$(kspout dev up)"`
points kspout's config at the stack. The servers outlive the command; `<dir>/stack.json` tells
`status`, `down` and every command's `--dev` where they are. Without `--dir`, each looks for
`.kspout-dev` in the working directory and then its parents, so a stack started in a project's
folder serves its subfolders too, and `up` there reports it instead of starting a second one.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kspout.cli.answers import echo_json
from kspout.cli.group import main
from kspout.cli.options import json_option
from kspout.devstack.processes import GRACE, pid_alive, stop_pid
from kspout.devstack.stack import DevStack
from kspout.devstack.state import (
    ENV_DEV_DIR,
    StackState,
    clear,
    default_dir,
    find_dir,
    not_found,
    read_state,
    search_dirs,
    write_state,
)
from kspout.devstack.tools import KAFKA_VERSION
from kspout.errors import StackError

_dir_option = click.option(
    "--dir",
    "workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"State, data and logs of the stack [default: ${ENV_DEV_DIR}, else the nearest "
    ".kspout-dev in this folder or a parent, else ./.kspout-dev].",
)


@main.group()
def dev() -> None:
    """Run Kafka (Apache Kafka's broker, KRaft), ZooKeeper and Redis locally for development."""


@dev.command()
@_dir_option
@json_option
def up(workdir: Path | None, as_json: bool) -> None:
    """Start the dev stack in the background (or report the one already running).

    Prints a table of the servers on stderr and `export KSPOUT_...` lines on stdout: use
    `eval "$(kspout dev up)"` to export its addresses into the shell (--json: {"dir", "up",
    "components", "env"}). Other commands reach it with `--dev` from this folder or any below it.
    """
    workdir = _where(workdir)
    state = read_state(workdir)
    if state is not None and all(_health(state).values()):
        _report(workdir, state, as_json, note="already up")
        return
    if state is not None:
        _stop(state, GRACE)  # a partly dead stack: clear it and start afresh
        clear(workdir)
    stack = DevStack(workdir)
    try:
        stack.start()
    except StackError as err:
        raise click.ClickException(str(err)) from err
    state = stack.state()
    write_state(workdir, state)
    _report(workdir, state, as_json, note="started")


@dev.command()
@_dir_option
@json_option
def status(workdir: Path | None, as_json: bool) -> None:
    """Show each server of the dev stack, up or down; exit code 1 unless all are up.

    Prints what `dev up` prints (--json: the same object).
    """
    workdir = _where(workdir)
    state = read_state(workdir)
    if state is None:
        if as_json:
            echo_json({"dir": str(workdir), "up": False, "components": {}})
        else:
            click.echo(_absent(workdir), err=True)
        raise SystemExit(1)
    if not _report(workdir, state, as_json, note="status"):
        raise SystemExit(1)


@dev.command()
@_dir_option
@click.option(
    "--grace", type=float, default=GRACE, show_default=True, help="Seconds before SIGKILL."
)
@click.option("--keep-data", is_flag=True, help="Keep the servers' data and logs.")
@json_option
def down(workdir: Path | None, grace: float, keep_data: bool, as_json: bool) -> None:
    """Stop the dev stack (SIGTERM, then SIGKILL after --grace seconds) and remove its state.

    Prints on stderr what it stopped; with --json, `{"dir", "up": false, "stopped", "kept_data"}`
    on stdout (`stopped` is false when there was no stack to stop).
    """
    workdir = _where(workdir)
    state = read_state(workdir)
    if state is None:
        click.echo(f"nothing to stop: {_absent(workdir)}", err=True)
    else:
        _stop(state, grace)
        clear(workdir, keep_data=keep_data)
        click.echo(f"dev stack in {workdir} stopped", err=True)
    if as_json:
        echo_json(
            {"dir": str(workdir), "up": False, "stopped": state is not None, "kept_data": keep_data}
        )


_LABELS = {"kafka": f"kafka {KAFKA_VERSION}"}  # Apache Kafka, KRaft


def _where(workdir: Path | None) -> Path:
    """`--dir`, else the nearest stack's folder (`find_dir`), else `default_dir()`."""
    return (workdir or find_dir() or default_dir()).absolute()


def _absent(workdir: Path) -> str:
    """No stack in `workdir`: where was looked, and what to do."""
    looked_in = search_dirs()
    if workdir != looked_in[0]:  # --dir named it
        return f"no dev stack in {workdir}; start one with `kspout dev up --dir {workdir}`"
    return not_found(looked_in)


def _health(state: StackState) -> dict[str, bool]:
    return {name: c.up() for name, c in state.components.items()}


def _stop(state: StackState, grace: float) -> None:
    """Stop the servers still running, last started first; a reused pid is left alone."""
    for component in reversed(state.components.values()):
        if pid_alive(component.pid, component.started):
            stop_pid(component.pid, grace)


def _report(workdir: Path, state: StackState, as_json: bool, note: str) -> bool:
    """Print the stack (JSON or a table plus `export` lines); True if every server is up."""
    health = _health(state)
    all_up = all(health.values())
    env = state.info.env()
    if as_json:
        out: dict[str, Any] = state.to_json()
        for name, fields in out["components"].items():
            fields["up"] = health[name]
        out.update(dir=str(workdir), up=all_up, env=env)
        echo_json(out)
        return all_up
    table = Table(
        title=f"kspout dev stack ({note}): {workdir}",
        caption=f"logs: {workdir}/<component>/<component>.log",
    )
    for column in ("component", "address", "pid", "state", "started in"):
        table.add_column(column)
    for name, component in state.components.items():
        shown = state.info.redis_url if name == "redis" else component.address
        mark = "[green]up[/]" if health[name] else "[red]down[/]"
        took = "" if component.start_seconds is None else f"{component.start_seconds:.1f} s"
        table.add_row(_LABELS.get(name, name), shown, str(component.pid), mark, took)
    Console(stderr=True).print(table)
    if all_up:
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        click.echo(f"export {exports}")
    return all_up

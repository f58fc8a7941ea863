"""`kspout run`: consume a topic with a plain Python function per record, in-process.

The same driver loop the Spark backend uses, with the local executor. Ctrl-C stops after the
batch in flight and commits before exiting; a second Ctrl-C exits at once (nothing is lost:
uncommitted offsets are processed again on the next start).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
from types import FrameType

import click
from rich.console import Console
from rich.live import Live

from kspout.cli import main
from kspout.cli.options import config_option, json_option, kspout_errors
from kspout.cli.report import progress_json, progress_table
from kspout.config import load_config
from kspout.devstack import load_stack_info
from kspout.driver import Driver, Progress
from kspout.errors import StackError
from kspout.local_executor import LocalExecutor
from kspout.tasks import Handler


def load_handler(spec: str) -> Handler:
    """Import `module:function` (the current directory is importable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"expected module:function, got {spec!r}", param_hint="--handler")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: object = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint="--handler") from None
    if not callable(target):
        raise click.BadParameter(f"{spec!r} is not callable", param_hint="--handler")
    return target


def use_dev_stack() -> None:
    """Point the connection settings at the stack `kspout dev up` started."""
    info = load_stack_info()
    if info is None:
        raise StackError("no running dev stack here: start one with `kspout dev up`")
    os.environ.update(info.env())


def stop_on_interrupt(stop: threading.Event) -> None:
    """First Ctrl-C asks the loop to stop and commit; the second one exits at once."""

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        stop.set()
        click.echo("stopping after the batch in flight; Ctrl-C again to exit now", err=True)

    signal.signal(signal.SIGINT, handle)


@main.command()
@config_option
@click.option("--handler", required=True, help="module:function called once per record.")
@click.option("--max-batches", type=click.IntRange(min=1), help="Stop after this many batches.")
@click.option("--until-caught-up", is_flag=True, help="Stop once every offset is finished.")
@click.option("--dev", "dev_stack", is_flag=True, help="Use the running `kspout dev up` stack.")
@json_option
def run(
    config_path: str,
    handler: str,
    max_batches: int | None,
    until_caught_up: bool,
    dev_stack: bool,
    as_json: bool,
) -> None:
    """Consume a topic, calling HANDLER(record) per record; raising fails the record.

    Failed records are retried with backoff up to `max_retries`, then dead-lettered or skipped
    per the config; the commit point goes to ZooKeeper every `commit_interval` and on exit.
    """
    with kspout_errors():
        if dev_stack:
            use_dev_stack()
        config = load_config(config_path)
        function = load_handler(handler)
        stop = threading.Event()
        stop_on_interrupt(stop)
        console = Console(stderr=True)
        with Live(console=console, transient=True, auto_refresh=False) as live:

            def show(progress: Progress) -> None:
                live.update(progress_table(progress), refresh=True)

            driver = Driver(
                config,
                LocalExecutor(config, function),
                on_progress=show if console.is_terminal else None,
            )
            with driver:
                final = driver.run(
                    max_batches=max_batches, until_caught_up=until_caught_up, stop=stop
                )
        if as_json:
            click.echo(json.dumps(progress_json(final), indent=2))
        else:
            out = Console()
            if not out.is_terminal:
                out.width = 120  # whole numbers in logs and pipes, not ellipses
            out.print(progress_table(final, title=f"{config.topic}: final"))

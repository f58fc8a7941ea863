"""The `kspout` command group: its options and logging; the sub-commands register on it."""

from __future__ import annotations

import logging

import click
from rich.console import Console
from rich.logging import RichHandler

from kspout.cli.extensions import ExtensibleGroup

LOG_WIDTH = 250  # rich wraps at 80 columns where stderr is not a terminal


@click.group(cls=ExtensibleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kspout")
@click.option("-v", "--verbose", count=True, help="Log more (-v: info, -vv: debug).")
def main(verbose: int) -> None:
    """kspout: consume Kafka topics with Storm's guarantees, for Spark jobs.

    Every command prints a table for people, or one JSON object with --json for scripts.
    """
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    console = Console(stderr=True)
    if not console.is_terminal:
        console.width = LOG_WIDTH  # a log file or pipe keeps each traceback line whole
    handler = RichHandler(console=console, show_path=False, show_time=verbose > 0)
    logging.basicConfig(level=level, format="%(message)s", handlers=[handler], force=True)
    # kazoo warns at every dropped connection while it retries; kspout's own error says what
    # failed, so its chatter shows only with -v.
    logging.getLogger("kazoo").setLevel(level if verbose else logging.ERROR)
    # librdkafka logs every failed connection attempt (`kspout.kafka.LIBRDKAFKA_LOG`), dozens a
    # second while a broker is down; kspout's own error names the address: -vv shows them.
    logging.getLogger("librdkafka").setLevel(logging.DEBUG if verbose > 1 else logging.CRITICAL)

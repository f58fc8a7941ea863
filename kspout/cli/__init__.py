"""The `kspout` command: `run`, `produce`, `status`, `lag`, `rebalance`, `pause`, `resume`,
`offsets show|set|reset`, `dlq show|replay`, `dev up|down|status`; and `demo`, which
`kspout_demo` adds through the `kspout.commands` entry points (`kspout.cli.extensions`).

Each sub-command lives in its own module and registers itself on `main` here.
"""

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


from kspout.cli import dev as _dev  # noqa: E402,F401
from kspout.cli import dlq as _dlq  # noqa: E402,F401
from kspout.cli import offsets as _offsets  # noqa: E402,F401
from kspout.cli import ownership as _ownership  # noqa: E402,F401
from kspout.cli import produce as _produce  # noqa: E402,F401
from kspout.cli import run as _run  # noqa: E402,F401
from kspout.cli import status as _status  # noqa: E402,F401

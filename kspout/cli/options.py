"""Options and error handling shared by the `kspout` sub-commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

from kspout.errors import KspoutError

config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The topic's TOML file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead.")


@contextmanager
def kspout_errors() -> Iterator[None]:
    """kspout errors become one line on stderr and exit code 1, without a traceback."""
    try:
        yield
    except KspoutError as exc:
        raise click.ClickException(str(exc)) from None

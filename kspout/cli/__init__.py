"""The `kspout` command: `run`, `offsets show|set`, `dev up|down|status`.

Each sub-command lives in its own module and registers itself on `main` here.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kspout")
def main() -> None:
    """kspout: consume Kafka topics with Storm's guarantees, for Spark jobs."""


from kspout.cli import dev as _dev  # noqa: E402,F401
from kspout.cli import offsets as _offsets  # noqa: E402,F401
from kspout.cli import run as _run  # noqa: E402,F401

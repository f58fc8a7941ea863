"""`kspout demo`: the command's options and help, which `kspout` finds through the
`kspout.commands` entry points (pyproject) and loads to list it in `kspout --help`.

The work is in `kspout_demo.run`, imported when the demo runs: it loads Redis, the dedup bolt,
Kafka's clients and Spark, which listing the command must not.
"""

from __future__ import annotations

import click

from kspout.cli.options import json_option


@click.command()
@click.option(
    "--config",
    "config_path",
    default="deploy/topics/demo.toml",
    show_default=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The demo topic's TOML file.",
)
@click.option("--messages", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--spark", "master", default="local[2]", show_default=True, help="Spark master.")
@click.option(
    "--dev",
    "dev_stack",
    is_flag=True,
    help="Use the running `kspout dev up` stack (in ./.kspout-dev or the nearest parent "
    "folder's) instead of starting one.",
)
@json_option
def demo(config_path: str, messages: int, master: str, dev_stack: bool, as_json: bool) -> None:
    """Produce sentences with injected failures and count their words on Spark.

    Prints each job's figures and OK/FAIL checks, and exits 1 if a check failed (--json: the
    report goes to stderr, and {"ok", "messages", "seconds", "jobs"} to stdout, each job with
    "spout", "ok", "seconds" and its final "progress").
    """
    from kspout_demo.run import run_demo

    run_demo(config_path, messages, master, dev_stack, as_json)

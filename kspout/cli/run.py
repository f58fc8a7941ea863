"""`kspout run`: consume a topic through a handler or bolt chain, in-process or on Spark.

`--handler module:attr` names a function (called per record), a bolt, or a list of bolts and
groupings. Without `--spark` batches run in this process; with `--spark MASTER` each batch is
a Spark job. Ctrl-C or SIGTERM stops after the batches in flight (in-process, a plain handler
stops after the record in hand) and commits before exiting; a second one exits at once
(nothing is lost: uncommitted offsets are processed again on the next start).
"""

from __future__ import annotations

import importlib
import os
import sys

import click
from rich.console import Console
from rich.live import Live

from kspout.cli.answers import echo_json, stdout_console
from kspout.cli.group import main
from kspout.cli.imports import import_failure
from kspout.cli.options import config_option, dev_option, json_option, kspout_errors
from kspout.cli.report import failures_table, progress_json, progress_table
from kspout.config import TopicConfig, load_config
from kspout.contract import Executor
from kspout.driver import Driver, Progress
from kspout.errors import ChainError
from kspout.executor.local import LocalExecutor
from kspout.executor.topology import Topology
from kspout.stopping import stop_on_signals

TOO_MANY_FAILURES = 4  # exit code: --max-failures stopped the run (1: an error, 2: usage)


def load_chain(spec: str) -> Topology:
    """Import `module:attr`: a function, a bolt, or a list of bolts and groupings.

    The current directory is importable (and is made importable for Spark's workers too).
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter(f"expected module:function, got {spec!r}", param_hint="--handler")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
        paths = [os.getcwd(), os.environ.get("PYTHONPATH")]
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    try:
        target: object = importlib.import_module(module_name)
    except Exception as exc:  # the user's module failed to import, whatever the reason
        raise click.BadParameter(import_failure(module_name, exc), param_hint="--handler") from None
    try:
        for part in attr.split("."):
            target = getattr(target, part)
    except AttributeError as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint="--handler") from None
    try:
        return Topology.of(target)  # type: ignore[arg-type]
    except ChainError as exc:
        raise click.BadParameter(f"{spec!r}: {exc}", param_hint="--handler") from None


def make_executor(config: TopicConfig, chain: Topology, master: str | None) -> Executor:
    """The in-process executor, or Spark's when a master is given."""
    if master is None:
        return LocalExecutor(config, chain)
    from kspout.spark import SparkExecutor, spark_session

    spark = spark_session(master, app_name=f"kspout {config.topic}")
    spark.sparkContext.setLogLevel("ERROR")
    return SparkExecutor(spark, config, chain)


@main.command()
@config_option
@click.option(
    "--handler",
    required=True,
    help="module:attr: a function called per record, a bolt, or a list of bolts and groupings.",
)
@click.option(
    "--spark",
    "master",
    metavar="MASTER",
    help="Run batches on Spark (local[2], spark://host:port, ...); default: in-process.",
)
@click.option("--max-batches", type=click.IntRange(min=1), help="Stop after this many batches.")
@click.option("--until-caught-up", is_flag=True, help="Stop once every offset is finished.")
@dev_option()
@click.option(
    "--replay-past-window",
    is_flag=True,
    help="Start even if the restart would replay messages finished longer ago than the dedup "
    "window ([dedup] ttl): their effects would apply again.",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=0),
    metavar="N",
    help="Stop, with exit code 4, once more than N records have failed because the handler or "
    "a bolt raised (or failed them); infrastructure failures (Kafka, Redis unreachable) do not "
    "count. --max-failures 0 stops at the first; for CI jobs and first runs.",
)
@json_option
def run(
    config_path: str,
    handler: str,
    master: str | None,
    max_batches: int | None,
    until_caught_up: bool,
    replay_past_window: bool,
    max_failures: int | None,
    as_json: bool,
) -> None:
    """Consume a topic through a handler or bolt chain; an exception fails the record.

    Failed records are retried with backoff up to `max_retries`, then dead-lettered or skipped
    per the config; the commit point goes to ZooKeeper every `commit_interval` and on exit.

    Prints a live progress table on stderr in a terminal, the metrics URL with `[metrics]`, and
    the final table per partition on stdout (--json: the final progress as JSON). The first
    failure of each kind per partition is logged with its traceback, later ones are counted;
    the run ends with a summary of failures by exception and place.

    Without --spark, batches run in this process, one at a time, on one core; Ctrl-C stops a
    plain handler after the record in hand (the rest of the batch runs again on the next
    start), a bolt chain after its batch.
    """
    with kspout_errors():
        config = load_config(config_path)
        chain = load_chain(handler)
        executor = make_executor(config, chain, master)
        console = Console(stderr=True)
        with (
            stop_on_signals() as stop,
            Live(console=console, transient=True, auto_refresh=False) as live,
        ):

            def show(progress: Progress) -> None:
                live.update(progress_table(progress, width=console.width), refresh=True)

            driver = Driver(
                config,
                executor,
                on_progress=show if console.is_terminal else None,
                replay_window=chain.replay_window(),
                replay_past_window=replay_past_window,
            )
            with driver:
                if driver.metrics_url is not None:  # the bound port, also for `port = 0`
                    console.print(f"metrics at {driver.metrics_url}", markup=False)
                final = driver.run(
                    max_batches=max_batches,
                    until_caught_up=until_caught_up,
                    stop=stop,
                    max_failures=max_failures,
                )
        if as_json:
            echo_json(progress_json(final))
        else:
            out = stdout_console()
            out.print(progress_table(final, title=f"{config.topic}: final", width=out.width))
            if final.failures:
                out.print(failures_table(final))
        if max_failures is not None and final.failed_records > max_failures:
            click.echo(
                f"stopped: {final.failed_records} records failed, more than --max-failures "
                f"{max_failures}; the most frequent: {final.failures[0].failure}",
                err=True,
            )
            sys.exit(TOO_MANY_FAILURES)

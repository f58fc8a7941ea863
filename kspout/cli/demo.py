"""`kspout demo`: the main job on the embedded stack, end to end, with a verdict.

Starts Kafka (mock cluster), ZooKeeper and Redis (or uses `kspout dev up`'s with `--dev`),
produces a stream with injected failures, consumes it with the driver and the in-process
executor while showing progress, then prints what was acked, retried and dead-lettered and the
commit points ZooKeeper holds, and checks them against what was produced.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

import click
from rich.console import Console
from rich.live import Live

from kspout.cli import main
from kspout.cli.options import kspout_errors
from kspout.cli.report import progress_table
from kspout.cli.run import use_dev_stack
from kspout.config import load_config
from kspout.demo import count_dead_letters, flaky_handler, produce_demo_stream, stored_offsets
from kspout.devstack import DevStack
from kspout.driver import Driver, Progress
from kspout.local_executor import LocalExecutor


@main.command()
@click.option(
    "--config",
    "config_path",
    default="deploy/topics/demo.toml",
    show_default=True,
    type=click.Path(dir_okay=False, exists=True),
    help="The demo topic's TOML file.",
)
@click.option("--messages", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--dev", "dev_stack", is_flag=True, help="Use the running `kspout dev up` stack.")
def demo(config_path: str, messages: int, dev_stack: bool) -> None:
    """Produce a stream with injected failures and consume it with Storm's guarantees."""
    console = Console(stderr=True)
    out = Console()
    if not out.is_terminal:
        out.width = 120
    with kspout_errors(), ExitStack() as stack:
        if dev_stack:
            use_dev_stack()
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kspout-")))
            with console.status("starting Kafka (mock cluster), ZooKeeper and Redis..."):
                dev = stack.enter_context(DevStack(workdir))
            os.environ.update(dev.info.env())
            console.print(f"stack up: Kafka {dev.info.brokers}, ZooKeeper {dev.info.zookeeper}")
        config = load_config(config_path)
        with console.status(f"producing {messages} messages to {config.topic}..."):
            stream = produce_demo_stream(config, messages)
        console.print(
            f"produced {stream.messages} messages: {stream.flaky} fail 1-2 times then succeed, "
            f"{stream.poison} always fail (poison)"
        )
        handler, effects = flaky_handler()
        with Live(console=console, transient=True, auto_refresh=False) as live:

            def show(progress: Progress) -> None:
                live.update(progress_table(progress), refresh=True)

            with Driver(config, LocalExecutor(config, handler), on_progress=show) as d:
                final = d.run(until_caught_up=True)
        out.print(progress_table(final, title=f"{config.topic}: final"))
        stored = stored_offsets(config)
        dead = count_dead_letters(config)
        highs = {v.partition: v.high for v in final.partitions}
        checks = {
            "every message's effect applied once (poison excepted)": (
                len(effects) == stream.messages - stream.poison
                and all(n == 1 for n in effects.values())
            ),
            f"dead-letter topic {config.dlq_topic} holds the {stream.poison} poison messages": (
                dead == stream.poison == final.total("dead_lettered")
            ),
            "ZooKeeper commit points equal the high watermarks": stored == highs,
        }
        out.print(
            f"acked {final.total('acked')}, retried {final.total('retried')}, "
            f"dead-lettered {final.total('dead_lettered')}, lost {final.total('lost')}, "
            f"in {final.elapsed:.1f}s over {final.batches} batches"
        )
        out.print("committed offsets: " + ", ".join(f"p{p}={o}" for p, o in sorted(stored.items())))
        for name, ok in checks.items():
            out.print(f"[{'green' if ok else 'red'}]{'OK  ' if ok else 'FAIL'}[/] {name}")
        if not all(checks.values()):
            raise SystemExit(1)

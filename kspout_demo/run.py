"""`kspout demo` at work: the main job on the embedded stack, end to end, with a verdict.

Starts Kafka (Apache Kafka's broker), ZooKeeper and Redis (or uses `kspout dev up`'s with `--dev`),
produces a sentence stream with injected failures, and runs a Storm-style word count on Spark
`local[2]` (split bolt, fields grouping by word, count bolt), with row bolts and again with
columnar bolts, while showing progress. It then
prints the counts beside the true ones, what was acked, retried, timed out and dead-lettered,
and the commit points ZooKeeper holds, and checks them against what was produced; last, how
long each job took (wall time and messages/s) and the demo as a whole.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kspout.cli.answers import echo_json, stdout_console
from kspout.cli.options import kspout_errors, use_dev_stack
from kspout.cli.report import progress_json, progress_table
from kspout.config import TopicConfig, load_config
from kspout.devstack import DevStack
from kspout.driver import Progress
from kspout.executor.topology import ChainItem
from kspout.spout import KafkaSpout
from kspout.wording import count
from kspout_demo.jobs import (
    DemoStream,
    columnar_word_count_chain,
    count_dead_letters,
    exactly_once_chain,
    produce_sentences,
    read_counts,
    read_effects,
    stored_offsets,
    word_count_chain,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_demo(config_path: str, messages: int, master: str, dev_stack: bool, as_json: bool) -> None:
    """`kspout demo`'s work (`kspout_demo.command` says what each argument means)."""
    console = Console(stderr=True)
    out = Console(stderr=True) if as_json else stdout_console()
    started = time.perf_counter()
    with kspout_errors(), ExitStack() as stack:
        if dev_stack:
            use_dev_stack()
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kspout-")))
            with console.status("starting Kafka, ZooKeeper and Redis..."):
                dev = stack.enter_context(DevStack(workdir))
            os.environ.update(dev.info.env())
            console.print(f"stack up: Kafka {dev.info.brokers}, ZooKeeper {dev.info.zookeeper}")
        config = load_config(config_path)
        # A long-lived `kspout dev up` stack keeps earlier runs' messages, offsets and dedup
        # records: give this run its own topic and job names there.
        run = f"-{uuid.uuid4().hex[:8]}" if dev_stack else ""
        config = config.model_copy(update={"topic": config.topic + run})
        with console.status(f"producing {messages} sentences to {config.topic}..."):
            stream = produce_sentences(config, messages)
        injected = ", ".join(f"{n} {kind}" for kind, n in sorted(stream.injected.items()))
        console.print(f"produced {stream.messages} sentences: {injected}")
        with console.status(f"starting Spark {master}..."):
            from kspout.spark import spark_session

            spark = spark_session(master, app_name="kspout demo")
            spark.sparkContext.setLogLevel("ERROR")
        stack.callback(spark.stop)

        slow = config.message_timeout + 4  # replays find the original still running
        timings: list[tuple[str, float]] = []
        jobs: list[dict[str, object]] = []
        ok = True
        word_counts = [
            ("demo-storm", "split -> fields(word) -> count, at least once", word_count_chain),
            (
                "demo-columnar",
                "the same word count with columnar bolts (Arrow batches)",
                columnar_word_count_chain,
            ),
        ]
        for name, what, chain_of in word_counts:
            job = name + run
            job_settings = job_config(config, job)
            console.print(f"running {job}: {what}")
            chain = chain_of(job_settings, job, slow)
            final, took = run_job(console, spark, job_settings, chain)
            counts = read_counts(job_settings, f"{job}:counts")
            passed = report_word_count(out, job_settings, stream, final, took, counts)
            timings.append((job, took))
            jobs.append(job_json(job, passed, took, final))
            ok = ok and passed

        job = "demo-exactly-once" + run
        once = job_config(config, job)
        bolt = exactly_once_chain(once, job, slow)
        console.print(f"running {job}: the dedup bolt around a counting handler")
        final, took = run_job(console, spark, once, bolt)
        passed = report_exactly_once(out, once, stream, final, took, bolt.warnings)
        timings.append((job, took))
        jobs.append(job_json(job, passed, took, final))
        ok = ok and passed
        total = time.perf_counter() - started
        print_timings(out, stream.messages, timings, total)
        if as_json:
            echo_json(
                {"ok": ok, "messages": stream.messages, "seconds": round(total, 3), "jobs": jobs}
            )
        if not ok:
            raise SystemExit(1)


def job_json(job: str, ok: bool, seconds: float, final: Progress) -> dict[str, object]:
    """One job of `demo --json`: its checks passed or not, its wall time, its final progress."""
    return {"spout": job, "ok": ok, "seconds": round(seconds, 3), "progress": progress_json(final)}


def job_config(config: TopicConfig, job: str) -> TopicConfig:
    """The demo topic's settings under the job's own spout id and dead-letter topic."""
    return config.model_copy(update={"spout_id": job, "dead_letter_topic": f"{job}.dlq"})


def run_job(
    console: Console, spark: SparkSession, config: TopicConfig, chain: ChainItem | list[ChainItem]
) -> tuple[Progress, float]:
    """Run a job until caught up, with a live progress table; returns its final progress and
    its wall time in seconds (`KafkaSpout.run`, start to finish)."""
    with Live(console=console, transient=True, auto_refresh=False) as live:

        def show(progress: Progress) -> None:
            table = progress_table(progress, title=config.spout_id, width=console.width)
            live.update(table, refresh=True)

        started = time.perf_counter()
        final = KafkaSpout(config, spark).run(chain, until_caught_up=True, on_progress=show)
        return final, time.perf_counter() - started


def rate(messages: int, seconds: float) -> str:
    """`seconds` and the messages per second they make for `messages`."""
    return f"{seconds:.1f}s, {messages / seconds:,.0f} messages/s" if seconds > 0 else "0s"


def print_timings(out: Console, messages: int, jobs: list[tuple[str, float]], total: float) -> None:
    """How long the demo took: each job's wall time and throughput over the stream, and the
    whole run (stack start-up, producing, Spark start-up and the checks included)."""
    for job, seconds in jobs:
        out.print(f"{job}: {messages} messages in {rate(messages, seconds)}")
    out.print(f"the demo took {total:.1f}s in all")


def print_checks(out: Console, checks: dict[str, bool]) -> bool:
    """One OK/FAIL line per check; True when all passed."""
    for name, ok in checks.items():
        out.print(f"[{'green' if ok else 'red'}]{'OK  ' if ok else 'FAIL'}[/] {name}")
    return all(checks.values())


def print_figures(
    out: Console, config: TopicConfig, stream: DemoStream, final: Progress, took: float
) -> dict[int, int]:
    """The final table, the totals, the job's wall time and the commit points; returns the
    commit points."""
    out.print(progress_table(final, title=f"{config.spout_id}: final", width=out.width))
    stored = stored_offsets(config)
    out.print(
        f"acked {final.total('acked')}, duplicates {final.total('duplicates')}, "
        f"failed and retried {final.total('retried')}, deferred {final.total('deferred')}, "
        f"timed out {final.total('timed_out')}, dead-lettered {final.total('dead_lettered')} "
        f"({final.total('invalid')} without an id), lost {final.total('lost')}, "
        f"over {final.batches} batches; wall time {rate(stream.messages, took)}"
    )
    out.print("committed offsets: " + ", ".join(f"p{p}={o}" for p, o in sorted(stored.items())))
    return stored


def timeout_check(config: TopicConfig, stream: DemoStream, final: Progress) -> dict[str, bool]:
    """The per-message timeout check: only the slow messages time out, not their batch."""
    slow = stream.injected["slow"]
    name = (
        f"timed out: {final.total('timed_out')} = the {count(slow, 'slow message')} past "
        f"message_timeout ({config.message_timeout:g}s), not the batch queued behind them"
    )
    return {name: final.total("timed_out") == slow}


def report_word_count(
    out: Console,
    config: TopicConfig,
    stream: DemoStream,
    final: Progress,
    took: float,
    counts: Counter[str],
) -> bool:
    """The at-least-once job's figures and checks; True when every check passed."""
    stored = print_figures(out, config, stream, final, took)
    table = Table(title="word counts (top 8)")
    for column in ("word", "counted", "true", "extra from replays"):
        table.add_column(column, justify="right" if column != "word" else "left")
    for word, true in stream.true_counts.most_common(8):
        table.add_row(word, str(counts[word]), str(true), str(counts[word] - true))
    out.print(table)
    extra = sum(counts.values()) - sum(stream.true_counts.values())
    out.print(
        f"replays counted {extra} extra words: at-least-once processing applies an effect "
        "again when a message is replayed after some or all of its words were counted"
    )
    poison = stream.injected["poison"]
    return print_checks(
        out,
        {
            "no word lost: every count is at least the true count": all(
                counts[w] >= n for w, n in stream.true_counts.items()
            ),
            f"{config.dlq_topic} holds the {poison} poison messages": (
                count_dead_letters(config) == poison == final.total("dead_lettered")
            ),
            "ZooKeeper commit points equal the high watermarks": stored == highs(final),
            **timeout_check(config, stream, final),
        },
    )


def report_exactly_once(
    out: Console,
    config: TopicConfig,
    stream: DemoStream,
    final: Progress,
    took: float,
    warnings: list[str],
) -> bool:
    """The exactly-once job's figures and checks; True when every check passed."""
    stored = print_figures(out, config, stream, final, took)
    for warning in warnings:
        out.print(f"[yellow]Redis durability warning:[/] {warning}")
    effects, ids = read_effects(config, config.spout_id)
    counts = read_counts(config, f"{config.spout_id}:counts")
    expected = stream.keyed_messages
    out.print(
        f"effects applied {effects}, distinct message ids applied {ids}, "
        f"messages with an id that should apply {expected}"
    )
    dead = stream.injected["poison"] + stream.injected["noid"]
    return print_checks(
        out,
        {
            "each message's effect applied exactly once: effects = distinct ids = expected": (
                effects == ids == expected
            ),
            "word counts equal the true counts exactly": counts == stream.keyed_counts,
            f"{config.dlq_topic} holds the {stream.injected['poison']} poison messages and the "
            f"{stream.injected['noid']} without an id": (
                count_dead_letters(config) == dead == final.total("dead_lettered")
                and final.total("invalid") == stream.injected["noid"]
            ),
            "ZooKeeper commit points equal the high watermarks": stored == highs(final),
            **timeout_check(config, stream, final),
        },
    )


def highs(final: Progress) -> dict[int, int]:
    """Each partition's high watermark as the run last saw it."""
    return {v.partition: v.high for v in final.partitions}

"""SIGTERM, as YARN and Kubernetes send it, stops a spout like the first Ctrl-C: the batches in
flight finish, their offsets are committed, and the process exits 0. Real processes: `kspout run`
and a script calling `KafkaSpout.run` on Spark `local[2]`, against the session's dev stack."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import (
    PARTITIONS,
    handled_lines,
    prepare_kspout_run,
    produce,
    spawned,
    stored,
    wait_until_handled,
)

SPOUT_SCRIPT = """
import sys

from kspout import KafkaSpout
from kspout.spark import spark_session
from slow_handler import handle

spark = spark_session("local[2]", conf={"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
progress = KafkaSpout.from_config(sys.argv[1], spark).run(handle)
print("acked", progress.total("acked"))
"""

# Bounds a hung process, not a speed: a drain is one batch of 25 records at 5 ms each.
DRAIN_LIMIT = 60.0


def terminate_and_check(proc: subprocess.Popen[bytes], log: Path, config: TopicConfig) -> str:
    """SIGTERM once some records were handled; the process exits 0 and has committed exactly
    what its handler finished. Returns its stderr."""
    wait_until_handled(proc, log, 0)  # started (Spark takes a while)
    wait_until_handled(proc, log, 150)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=DRAIN_LIMIT)
    assert proc.returncode == 0, f"exit {proc.returncode}: {err.decode()[-3000:]}"

    handled = handled_lines(log)
    assert len(handled) < 1000, "the run finished before SIGTERM: make the handler slower"
    committed = stored(config)
    for p in PARTITIONS:
        mine = sorted(o for q, o in handled if q == p)
        # Everything handled was committed on the way out, and nothing that was not: a restart
        # replays no finished record.
        assert mine == list(range(len(mine))), f"partition {p}: handled {mine}"
        assert committed.get(p, 0) == len(mine), f"partition {p}: {committed} for {len(mine)}"
    return err.decode() + out.decode()


def test_kspout_run_drains_and_commits_on_sigterm(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    """Before, SIGTERM killed `kspout run` at once (exit -15): the batch in flight was lost
    and only the last periodic commit was kept."""
    config = make_config()
    produce(producer, config.topic, {p: range(250) for p in PARTITIONS})
    argv, env, log = prepare_kspout_run(stack, config, tmp_path, pause=0.005)
    with spawned(argv, tmp_path, env) as proc:
        output = terminate_and_check(proc, log, config)
    assert "SIGTERM: stopping after the batches in flight" in output


def test_kafka_spout_on_spark_drains_and_commits_on_sigterm(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    """`KafkaSpout.run` in a Spark driver, as under spark-submit: before, it installed no
    handler, so SIGTERM killed the driver without a final commit."""
    config = make_config()
    produce(producer, config.topic, {p: range(250) for p in PARTITIONS})
    argv, env, log = prepare_kspout_run(stack, config, tmp_path, pause=0.005)
    (tmp_path / "spout_job.py").write_text(SPOUT_SCRIPT)
    env["PYTHONPATH"] = f"{tmp_path}:{env.get('PYTHONPATH', '')}"  # Spark's workers import it
    toml = argv[argv.index("--config") + 1]
    with spawned([sys.executable, "spout_job.py", toml], tmp_path, env) as proc:
        output = terminate_and_check(proc, log, config)
    assert "acked" in output


def test_a_second_sigterm_stops_kspout_run_without_draining(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    """The record in hand takes eight seconds; the first SIGTERM waits for it (an in-process
    plain handler stops after the record in hand). The second abandons it: the process exits at
    once (Aborted, exit 1), commits only what was applied, and leaves the batch unhandled."""
    config = make_config()
    produce(producer, config.topic, {p: range(25) for p in PARTITIONS})
    argv, env, log = prepare_kspout_run(stack, config, tmp_path, pause=8.0)
    with spawned(argv, tmp_path, env) as proc:
        wait_until_handled(proc, log, 0)  # the next record is in hand for eight seconds
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the first signal's handler runs (the loop is on the main thread) ...
        assert proc.poll() is None, "the first SIGTERM did not wait for the record in hand"
        proc.send_signal(signal.SIGTERM)  # ... and the second is not merged into it
        started = time.monotonic()
        _out, err = proc.communicate(timeout=DRAIN_LIMIT)
    assert time.monotonic() - started < 5.0, "the second SIGTERM waited for the record in hand"
    assert proc.returncode == 1, err.decode()[-3000:]
    assert "Aborted" in err.decode()
    handled = handled_lines(log)
    assert len(handled) < 25, "the batch in flight was drained, not abandoned"
    committed = stored(config)
    for p in PARTITIONS:  # nothing committed that was not handled
        assert set(range(committed.get(p, 0))) <= {o for q, o in handled if q == p}

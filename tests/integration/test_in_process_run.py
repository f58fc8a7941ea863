"""In-process `kspout run` stays visible and stoppable while one long batch runs.

One batch of 2,000 records with a 5 ms handler takes about 10 s. While it runs, `kspout
status` shows commits moving and the instance's report fresh, and the metrics endpoint serves
the lag; the first SIGINT ends the run within seconds (exit 0), and a restart handles the rest:
by the handler's own ledger, every record exactly once.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from confluent_kafka import Producer

from kspout.cli import main
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import (
    PARTITIONS,
    handled_lines,
    prepare_kspout_run,
    produce,
    run_until_caught_up,
    spawned,
    wait_until_handled,
)

PER_PARTITION = 500


def status(config_file: Path) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["status", "--config", str(config_file), "--json"])
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_a_long_in_process_batch_reports_progress_and_stops_on_sigint_within_seconds(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(PER_PARTITION) for p in PARTITIONS})
    total = PER_PARTITION * len(PARTITIONS)
    argv, env, log = prepare_kspout_run(
        stack, config, tmp_path, pause=0.005, extra="[metrics]\nport = 0\n", batch_size=10_000
    )
    toml = tmp_path / "topic.toml"

    with spawned(argv, tmp_path, env) as proc:
        wait_until_handled(proc, log, 300)
        # Mid-batch: commits move, the report is fresh, the metrics endpoint has the lag.
        deadline = time.monotonic() + 10
        while True:
            seen = status(toml)
            committed = sum(row["committed"] or 0 for row in seen["partitions"])
            if committed > 0:
                break
            assert time.monotonic() < deadline, f"nothing committed mid-batch: {seen}"
            time.sleep(0.2)
        [instance] = seen["instances"]
        assert instance["stale"] is False and instance["report_age_s"] < 2, instance
        with urllib.request.urlopen(instance["metrics"], timeout=5) as page:
            metrics = page.read().decode()
        assert "kspout_spout_lag" in metrics, metrics
        handled_mid = len(handled_lines(log))
        assert committed < total and handled_mid < total, "the batch ended before the checks"

        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        took = time.monotonic() - asked
    assert proc.returncode == 0, err.decode()
    assert took < 5, f"the first SIGINT took {took:.1f} s"
    first_run = handled_lines(log)
    assert len(first_run) < total, "the run finished before the interrupt: slow the handler"

    env["HANDLER_PAUSE"] = "0"
    report = run_until_caught_up(argv, tmp_path, env, timeout=60)
    assert report["lag"] == 0
    # The handler's ledger: every record handled, each exactly once over both runs.
    handled = handled_lines(log)
    assert sorted(handled) == sorted((p, o) for p in PARTITIONS for o in range(PER_PARTITION))

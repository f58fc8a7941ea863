"""A broken handler is visible: `kspout run` as a user runs it, with a handler that always raises.

The first failure of each kind per partition is logged with its traceback (file and line),
the rest counted; the run ends with a summary by exception and place, says loudly when every
record failed, and `--max-failures` stops it with exit code 4. Each dead letter carries the
traceback, and `kspout dlq show --json` shows it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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
    dead_letter_headers,
    kspout_command,
    produce,
    topic_file,
)

RAISER = """\
def handle(record):
    if record.value:
        raise RuntimeError("always broken")


from kspout.bolts import BasicBolt


class Parse(BasicBolt):
    def process(self, tuple_, collector):
        int(tuple_.record.value)


bolt = Parse()
"""
FAILURE = "RuntimeError('always broken') at raiser.py:3"
PER_PARTITION = 12
FAST_RETRIES = """
max_retries = 1

[retry_backoff]
initial = 0.01
multiplier = 1.0
max = 0.01
"""


def kspout_run(
    stack: DevStack,
    config: TopicConfig,
    tmp_path: Path,
    *args: str,
    handler: str = "raiser:handle",
) -> subprocess.CompletedProcess[str]:
    """`kspout run --handler HANDLER --until-caught-up ARGS` in `tmp_path`, to its end."""
    (tmp_path / "raiser.py").write_text(RAISER)
    toml = topic_file(tmp_path / "topic.toml", stack, config, FAST_RETRIES)
    argv = [str(kspout_command()), "run", "--config", str(toml), "--handler", handler]
    return subprocess.run(
        [*argv, "--until-caught-up", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
        | {"COLUMNS": "250"},  # log lines unwrapped
    )


def test_a_handler_that_always_raises_is_shown_with_its_traceback_and_summary(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(PER_PARTITION) for p in PARTITIONS})

    done = kspout_run(stack, config, tmp_path)

    assert done.returncode == 0, done.stderr  # without --max-failures a failing run completes
    err = done.stderr
    # The first failure per partition, with its traceback down to the user's line.
    assert err.count("Traceback (most recent call last)") == len(PARTITIONS), err
    assert err.count('raiser.py", line 3, in handle') == len(PARTITIONS), err
    for p in PARTITIONS:
        assert f"{config.topic}[{p}] offset 0 failed (attempt 1): {FAILURE}" in err, err
        # Then counts, not one line per record: 12 records, 2 attempts each, 1 shown above.
        again = re.findall(
            rf"{re.escape(FAILURE)} again (\d+) times? in the last \d+ s, partition {p}(?!\d)", err
        )
        assert again and sum(map(int, again)) == 2 * PER_PARTITION - 1, err
    assert "EVERY RECORD FAILED" in err and FAILURE in err.split("EVERY RECORD FAILED")[1]
    # The summary, after the final table.
    out = done.stdout
    total = PER_PARTITION * len(PARTITIONS)
    assert f"{total} records failed, by exception and place" in out, out
    row = next(line for line in out.splitlines() if "always broken" in line)
    assert "raiser.py:3" in row and str(2 * total) in row and str(total) in row, row

    # Each dead letter carries the traceback.
    letters = dead_letter_headers(config, stack.info.brokers)
    assert len(letters) == total
    for headers in letters:
        assert headers["kspout.error"] == "RuntimeError: always broken"
        trace = headers["kspout.traceback"]
        assert trace.startswith("Traceback") and 'raiser.py", line 3' in trace, trace
    shown = CliRunner().invoke(
        main, ["dlq", "show", "--config", str(tmp_path / "topic.toml"), "--json"]
    )
    assert shown.exit_code == 0, shown.output
    listed: Any = json.loads(shown.stdout)
    first = listed[0] if isinstance(listed, list) else listed["letters"][0]
    assert 'raiser.py", line 3' in first["traceback"]


def test_the_json_report_has_the_failures_by_kind(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(5), 1: range(3)})
    # A record without a value succeeds: not every record failed, so no loud warning.
    producer.produce(config.topic, value=b"", partition=2)
    producer.flush(10)

    done = kspout_run(stack, config, tmp_path, "--json")

    assert done.returncode == 0, done.stderr
    assert "EVERY RECORD FAILED" not in done.stderr
    report = json.loads(done.stdout)
    assert report["failed_records"] == 8
    [kind] = report["failures"]
    assert kind["exception"] == "RuntimeError" and kind["message"] == "always broken"
    assert kind["place"] == "raiser.py:3"
    assert (kind["failures"], kind["records"], kind["dead_lettered"]) == (16, 8, 8)
    assert kind["partitions"] == [0, 1]
    assert 'raiser.py", line 3, in handle' in kind["traceback"]


def test_max_failures_stops_the_run_with_exit_code_4(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(200) for p in PARTITIONS})

    done = kspout_run(stack, config, tmp_path, "--max-failures", "3")

    assert done.returncode == 4, done.stderr
    assert f"more than --max-failures 3; the most frequent: {FAILURE}" in done.stderr
    assert "more than max_failures=3 allows: stopping" in done.stderr
    assert "records failed" in done.stdout  # the summary is still printed
    # It stopped early: far from every record was tried.
    assert "800 records failed" not in done.stdout


def test_a_bolt_that_raises_is_shown_the_same_way(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(4)}, value=lambda p, o: b"%d" % o)
    producer.produce(config.topic, value=b"x", partition=0)  # offset 4: not a number
    producer.flush(10)

    done = kspout_run(stack, config, tmp_path, "--json", handler="raiser:bolt")

    assert done.returncode == 0, done.stderr
    failure = "ValueError(\"invalid literal for int() with base 10: b'x'\") at raiser.py:11"
    assert f"{config.topic}[0] offset 4 failed (attempt 1): {failure}" in done.stderr
    assert 'raiser.py", line 11, in process' in done.stderr
    [kind] = json.loads(done.stdout)["failures"]
    assert (kind["exception"], kind["place"], kind["records"]) == ("ValueError", "raiser.py:11", 1)

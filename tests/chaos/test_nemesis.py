"""The nemesis at CI size: `python -m bench.nemesis --json` (bench/nemesis), run for real.

Three `kspout run` instances of the demo's exactly-once job on a three-node Kafka cluster with
ZooKeeper and Redis of their own, while every kind of fault strikes once, in an order drawn
from the seed: an instance SIGKILLed, a hung handler, a broker and a partition's leader
SIGKILLed, ZooKeeper and Redis SIGKILLed and restarted, an instance SIGSTOPped past its
session. The command judges the run against its own ledger and what the sinks hold (see
bench/nemesis/verdict.py); this test reads what a user reads: the exit status, the table and
the checks, and the JSON report.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.nemesis.faults import KINDS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.timeout(420)
def test_every_fault_strikes_and_every_message_is_applied_once_or_dead_lettered() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.nemesis", "--messages", "5000", "--minutes", "1.5", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    print(done.stderr[-6000:])
    report = json.loads(done.stdout)
    faults = {row["fault"]: row for row in report["faults"]}
    assert set(KINDS) <= faults.keys(), faults.keys()
    assert all(row["struck"] == "yes" for row in report["faults"] if row["fault"] in KINDS)
    assert report["checks"] and all(report["checks"].values()), report["checks"]
    assert not report["crashes"], report["crashes"]
    assert report["figures"]["dead_letters"] >= report["figures"]["own_fault"] > 0
    # A zombie's refused commit is not asserted: one woken with nothing finished since its last
    # commit writes none. What holds either way is checked above (its partitions moved while
    # it was stopped) and in the checks (no commit point past what was applied).
    assert done.returncode == 0
    # What a user reads: the table's header, a row per fault, and every check OK.
    lines = done.stderr.splitlines()
    assert any(line.split()[:3] == ["fault", "at", "(s)"] for line in lines if line.strip())
    assert all(any(line.startswith(kind + " ") for line in lines) for kind in KINDS)
    assert "FAIL" not in done.stderr
    assert done.stderr.count("OK  ") == len(report["checks"])

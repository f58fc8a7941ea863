"""`python -m examples.chained`: both stages on the embedded stack and Spark `local[2]`.

Run it from the repository root in the set-up virtualenv. It produces trades with the demo's
faults, runs stage one (trades -> notifications, at least once) and then stage two (push to
users behind the dedup bolt), prints what each did and checks that every notification reached
its user exactly once although stage one published some of them more than once.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from examples.chained.stages import (
    inbox,
    produce_trades,
    published,
    pushed,
    stage_one,
    stage_two,
    struck,
)
from kspout.config import load_config
from kspout.devstack import DevStack
from kspout.spark import spark_session
from kspout.spout import KafkaSpout

HERE = Path(__file__).resolve().parent
TRADES = 2_000


def main() -> bool:
    """Run the example; True when every check passed."""
    repo = str(HERE.parent.parent)  # Spark's Python workers import the stages from here
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    with (
        tempfile.TemporaryDirectory(prefix="kspout-chained-") as workdir,
        DevStack(Path(workdir)) as stack,
    ):
        os.environ.update(stack.info.env())
        upstream = load_config(HERE / "trades.toml")
        downstream = load_config(HERE / "notifications.toml")
        stream = produce_trades(upstream, TRADES)
        spark = spark_session("local[2]", "kspout chained example", {"spark.ui.enabled": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        try:
            slow = upstream.message_timeout + 2
            one = KafkaSpout(upstream, spark).run(
                stage_one(upstream, downstream.topic, slow), until_caught_up=True
            )
            two = KafkaSpout(downstream, spark).run(stage_two(downstream), until_caught_up=True)
        finally:
            spark.stop()
        copies = published(downstream)
        ids = {id_ for id_, _ in copies}
        pushes, received = pushed(downstream), inbox(downstream)
        faults = {kind: n for kind, n in stream.injected.items() if kind != "none"}
        print(f"trades: {TRADES}, with faults {faults}")
        print(f"faults struck in stage one: {dict(struck(upstream))}")
        print(
            f"stage one: acked {one.total('acked')}, retried {one.total('retried')}, "
            f"timed out {one.total('timed_out')}, dead-lettered {one.total('dead_lettered')}"
        )
        print(
            f"{downstream.topic}: {copies.total()} records, {len(ids)} notification ids "
            f"({copies.total() - len(ids)} re-published by stage one's replays)"
        )
        print(f"stage two: pushed {two.total('acked')}, duplicates {two.total('duplicates')}")
        checks = {
            "stage one re-published notifications": copies.total() > len(ids),
            "a re-published notification kept its id": len(copies) == len(ids),
            "every notification was pushed exactly once": pushes == dict.fromkeys(ids, 1),
            "every user got each trade's notification once, poison trades none": (
                received == dict.fromkeys(stream.inbox, 1)
            ),
        }
        for name, ok in checks.items():
            print(f"{'OK  ' if ok else 'FAIL'} {name}")
        return all(checks.values())


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

"""A restart replays only what is unfinished: `kspout run` SIGKILLed mid-run, then started again.

Judged by the test's own ledger (tests/integration/ledger.py), never by kspout's records: the
values it produced, and those the handler finished (a line appended and fsynced after the work
succeeded; a message that raised is not in it). In the first run the last message of every 97
raises, holding each partition's commit point back while the offsets above it are acked, as a
poison message does under `behind_policy = "retry"`; the second run lets them through.

Verified: every produced message finished in one run or the other (those that failed in the
first run, in the second); the second run processed again only messages the first finished in
its last `RECENT` seconds (after its last commits), never the thousands it finished earlier, which
a restart from the commit points alone would repeat; and once the second run has stopped,
ZooKeeper's commit points are at the high watermarks.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import (
    PARTITIONS,
    ZK_ROOT,
    highs,
    kspout_command,
    produce,
    run_until_caught_up,
    spawned,
    stored,
    value_of,
)
from tests.integration.ledger import finished, produced, write_handler

PER_PARTITION = 3000
FAIL_EVERY = 97
COMMIT_INTERVAL = 0.2
# Seconds before the kill within which a finished message may be processed again: its ack may
# not have reached a commit yet (one commit interval, and commits run late on a loaded machine).
RECENT = 5.0


def running_for(ledger: Path, seconds: float) -> bool:
    """Has the ledger's first message finished `seconds` ago?"""
    done = finished(ledger)
    return bool(done) and time.monotonic() > min(done.values()) + seconds


def test_a_restart_after_sigkill_replays_only_what_was_unfinished(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    sent = {p: range(PER_PARTITION) for p in PARTITIONS}
    produce(producer, config.topic, sent)
    everything = produced(sent)
    failing = {
        value_of(p, o) for p in PARTITIONS for o in sent[p] if o % FAIL_EVERY == FAIL_EVERY - 1
    }
    toml = tmp_path / "topic.toml"
    toml.write_text(
        textwrap.dedent(
            f"""\
            topic = "{config.topic}"
            spout_id = "{config.spout_id}"
            zk_root = "{ZK_ROOT}"
            brokers = "{stack.info.brokers}"
            zookeeper = "{stack.info.zookeeper}"
            batch_size = 100
            commit_interval = {COMMIT_INTERVAL}
            max_retries = 100000
            retry_backoff = {{ initial = 0.05, multiplier = 1.0, max = 0.05 }}
            """
        )
    )
    argv = [str(kspout_command()), "run", "--config", str(toml), "--handler"]
    argv.append(write_handler(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    first_ledger, second_ledger = tmp_path / "first.ledger", tmp_path / "second.ledger"
    env |= {"LEDGER": str(first_ledger), "HANDLER_PAUSE": "0.004", "FAIL_EVERY": str(FAIL_EVERY)}

    with spawned(argv, tmp_path, env) as first:
        deadline = time.monotonic() + 120
        # Long enough that most of what it finished is far older than RECENT at the kill.
        while not running_for(first_ledger, 3 * RECENT):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run made no progress"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # mid-run: no drain, no final commit
        killed_at = time.monotonic()
        first.wait(timeout=10)
    assert first.returncode == -signal.SIGKILL
    run1 = finished(first_ledger)
    assert len(run1) < len(everything) - len(failing), "the first run finished before the kill"
    assert not run1.keys() & failing, "a message that raised is not in the ledger"
    old = {value for value, at in run1.items() if at < killed_at - RECENT}
    assert len(old) > len(run1) // 2, "most of the first run is older than RECENT"

    env |= {"LEDGER": str(second_ledger), "HANDLER_PAUSE": "0", "FAIL_EVERY": "0"}
    report = run_until_caught_up(argv, tmp_path, env, timeout=120)
    run2 = finished(second_ledger)
    again = run2.keys() & run1.keys()

    print(
        f"\nfinished by the killed run: {len(run1)} of {len(everything)} "
        f"({len(old)} of them more than {RECENT:g}s before the kill); by the restart: "
        f"{len(run2)}, of which {len(again)} again, all finished in the killed run's last "
        f"{killed_at - min((run1[v] for v in again), default=killed_at):.2f}s; the "
        f"{len(failing)} that failed in the killed run: finished by the restart"
    )
    assert everything == run1.keys() | run2.keys(), "nothing lost, nothing that was not produced"
    assert failing <= run2.keys(), "what failed before the kill finished after the restart"
    assert not again & old, "nothing finished long before the kill was processed again"
    assert report["lag"] == 0
    assert stored(config) == highs(config), "ZooKeeper, read after the restart stopped"

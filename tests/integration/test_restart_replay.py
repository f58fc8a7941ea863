"""A restart replays only what is unfinished: `kspout run` SIGKILLed mid-run, then started again.

The handler writes a line per record it is handed (before it works on it), so the test counts
exactly what each run processed. A failing message every 97 offsets holds each partition's
commit point back while the offsets above it are acked, as a poison message does under
`behind_policy = "retry"`.
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
from kspout.zk.record import StoredOffset
from tests.integration.helpers import (
    PARTITIONS,
    ZK_ROOT,
    kspout_command,
    open_store,
    produce,
    run_until_caught_up,
    spawned,
)

PER_PARTITION = 3000
HANDLER = """\
import os, time

LOG = os.open(os.environ["HANDLED_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
FAILING = os.environ.get("FAILING") == "1"

def handle(record):
    os.write(LOG, b"%d %d\\n" % (record.partition, record.offset))  # one syscall: never torn
    time.sleep(0.0005)
    if FAILING and record.offset % 97 == 13:
        raise RuntimeError("failing message")
"""

At = tuple[int, int]


def handled(log: Path) -> list[At]:
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return [(int(p), int(o)) for p, o in (line.split() for line in lines)]


def unfinished_at_last_commit(records: dict[int, StoredOffset], processed: set[At]) -> set[At]:
    """What the first run processed at or above each stored offset, outside the finished runs
    the record lists: what the restart has to process again."""
    out = set()
    for p, o in processed:
        record = records[p]
        listed = any(lo <= o < hi for lo, hi in record.done)
        if o >= record.offset and not listed:
            out.add((p, o))
    return out


def test_a_restart_after_sigkill_replays_only_what_was_unfinished(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(PER_PARTITION) for p in PARTITIONS})
    (tmp_path / "restart_handler.py").write_text(HANDLER)
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
            commit_interval = 0.2
            max_retries = 100000
            retry_backoff = {{ initial = 0.05, multiplier = 1.0, max = 0.05 }}
            """
        )
    )
    log = tmp_path / "handled.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    env |= {"HANDLED_LOG": str(log), "FAILING": "1"}
    argv = [
        str(kspout_command()),
        "run",
        "--config",
        str(toml),
        "--handler",
        "restart_handler:handle",
    ]

    with spawned(argv, tmp_path, env) as first:
        deadline = time.monotonic() + 60
        while len(handled(log)) < PER_PARTITION * len(PARTITIONS) // 2:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first run made no progress"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # mid-run: no drain, no final commit
        first.wait(timeout=10)
    assert first.returncode == -signal.SIGKILL
    run1 = set(handled(log))
    with open_store(config) as store:
        records = store.read_all()
    assert sorted(records) == list(PARTITIONS), "every partition committed while running"
    above = {(p, o) for p, o in run1 if o >= records[p].offset}
    unfinished = unfinished_at_last_commit(records, run1)

    log.unlink()
    env["FAILING"] = "0"
    report = run_until_caught_up(argv, tmp_path, env, timeout=120)
    run2 = handled(log)
    again = set(run2) & run1

    print(
        f"\nprocessed by the killed run: {len(run1)}; above the commit points: {len(above)} "
        f"(what a restart replayed before); unfinished at the last commit: {len(unfinished)}; "
        f"processed again after the restart: {len(again)}"
    )
    assert again == unfinished, "processed again == unfinished at the last commit, exactly"
    assert len(unfinished) * 10 < len(above), "far fewer than everything above the commit point"
    assert report["totals"]["restored"] == len(above) - len(unfinished)
    assert report["lag"] == 0
    # Nothing lost: every offset was processed by one run or the other.
    everything = {(p, o) for p in PARTITIONS for o in range(PER_PARTITION)}
    assert run1 | set(run2) == everything

"""`kspout run` processes sharing one spout id, killed and stopped for real: a SIGKILLed
instance's partitions move within the ZooKeeper session timeout and nothing is lost; a
SIGSTOPped instance woken after its session expired has its commits refused (counted and
logged) and drops the partitions it held.

Judged by the test's own ledger (tests/integration/ledger.py): the values it produced, and the
values each instance's handler finished (a line appended and fsynced after the work succeeded,
so what a SIGKILLed instance finished counts, and what it had in hand does not). Every produced
message must be in some ledger, and ZooKeeper, read again after every instance has stopped (the
zombie's final drain included), must hold commit points at the high watermarks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import Producer

from kspout.config import TopicConfig
from kspout.devstack import DevStack
from tests.integration.helpers import (
    PARTITIONS,
    highs,
    kspout_command,
    open_store,
    produce,
    stored,
    topic_file,
)
from tests.integration.ledger import entries, produced, write_handler
from tests.integration.test_ownership import claims, eventually

SESSION = 4.0  # zk_session_timeout: ZooKeeper's least with its default tickTime of 2 s
EXTRA = f"zk_session_timeout = {SESSION}\n"


@contextmanager
def instances(
    stack: DevStack, config: TopicConfig, tmp_path: Path, count: int, extra: str = EXTRA
) -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    """`count` `kspout run --json` processes, each with a ledger of its own (a handler that
    takes 10 ms a message), on the topic file's lines `extra` (a short session by default);
    stopped (SIGTERM, then SIGKILL) when the block ends."""
    toml = topic_file(tmp_path / "topic.toml", stack, config, extra)
    handler = write_handler(tmp_path)
    argv = [str(kspout_command()), "run", "--config", str(toml), "--handler", handler]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSPOUT_")}
    env["HANDLER_PAUSE"] = "0.01"
    runs = []
    for i in range(count):
        log = tmp_path / f"instance-{i}.ledger"
        env_i = {**env, "LEDGER": str(log)}
        proc = subprocess.Popen(
            [*argv, "--json"],
            cwd=tmp_path,
            env=env_i,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        runs.append((proc, log))
    try:
        yield runs
    finally:
        for proc, _ in runs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.terminate()
        for proc, _ in runs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def owner_of(config: TopicConfig, pid: int) -> Callable[[], str | None]:
    """The instance id `kspout run` process `pid` registered (its node holds its pid)."""
    from kspout.ownership.tree import read_ownership

    def find() -> str | None:
        with open_store(config) as store:
            nodes = read_ownership(store.session).instances
        return next((i for i, data in nodes.items() if data.get("pid") == pid), None)

    return find


def test_three_instances_divide_the_topic_and_a_killed_ones_partitions_move(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    sent = {p: range(600) for p in PARTITIONS}
    produce(producer, config.topic, sent)
    with instances(stack, config, tmp_path, 3) as runs:
        ids = [eventually(owner_of(config, proc.pid), what="registered") for proc, _ in runs]
        eventually(lambda: set(claims(config).values()) == set(ids), what="all three own some")
        victim = max(range(3), key=lambda i: list(claims(config).values()).count(ids[i]))
        held = sorted(p for p, owner in claims(config).items() if owner == ids[victim])
        # killed at work: once it has finished some (an instance slow to start may not have)
        eventually(lambda: entries(runs[victim][1]), timeout=60, what="the victim finished some")
        runs[victim][0].kill()  # SIGKILL: no final commit, no release
        runs[victim][0].wait()
        killed_at = time.monotonic()
        eventually(
            lambda: all(claims(config).get(p) not in (None, ids[victim]) for p in held),
            timeout=SESSION + 10,
            what=f"partitions {held} claimed by the survivors",
        )
        moved_after = time.monotonic() - killed_at
        eventually(lambda: stored(config) == highs(config), timeout=120, what="caught up")

    finished = Counter(value for _, ledger in runs for value, _ in entries(ledger))
    assert set(finished) == produced(sent)  # nothing lost, nothing that was not produced
    per_instance = [len(entries(ledger)) for _, ledger in runs]
    assert all(n > 0 for n in per_instance), per_instance  # each processed some
    twice = sum(n - 1 for n in finished.values())
    print(
        f"\nfinished per instance {per_instance}; finished twice {twice} of {len(finished)}; "
        f"the killed instance's partitions {held} moved {moved_after:.1f}s after SIGKILL"
    )
    assert twice < 0.1 * sum(finished.values()), twice  # few processed by two
    # ZooKeeper ends the session after SESSION (checked every tick, 2 s); then a poll and a claim.
    assert moved_after < 2 * SESSION, moved_after
    assert stored(config) == highs(config), "ZooKeeper, read after every instance stopped"


def test_a_stopped_instance_woken_after_its_session_expired_cannot_commit(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    sent = {p: range(1500) for p in PARTITIONS}
    produce(producer, config.topic, sent)
    with instances(stack, config, tmp_path, 2) as runs:
        (zombie, zombie_log), _survivor = runs
        ids = [eventually(owner_of(config, proc.pid), what="registered") for proc, _ in runs]
        eventually(lambda: set(claims(config).values()) == set(ids), what="both own some")
        held = sorted(p for p, owner in claims(config).items() if owner == ids[0])
        zombie.send_signal(signal.SIGSTOP)
        eventually(
            lambda: all(claims(config).get(p) == ids[1] for p in held),
            timeout=SESSION + 15,
            what="the survivor claims the stopped instance's partitions",
        )
        zombie.send_signal(signal.SIGCONT)
        eventually(lambda: stored(config) == highs(config), timeout=120, what="caught up")
        zombie.terminate()
        out, err = zombie.communicate(timeout=60)
    final = json.loads(out)
    assert final["commits_refused"] >= 1, err.decode()[-3000:]
    assert final["partitions_dropped"] >= len(held)
    logged = b"".join(err.split())  # rich wraps long log lines
    assert b"refused" in logged and b"dropping" in logged
    finished = {value for _, ledger in runs for value, _ in entries(ledger)}
    assert finished == produced(sent)  # nothing lost, nothing that was not produced
    assert entries(zombie_log)  # it did run before it was stopped
    # Every instance has stopped (the zombie after its final drain): no commit of the zombie's
    # moved a commit point back.
    assert stored(config) == highs(config)

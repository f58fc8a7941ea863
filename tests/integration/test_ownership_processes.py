"""`kspout run` processes sharing one spout id, killed and stopped for real: a SIGKILLed
instance's partitions move within the ZooKeeper session timeout and nothing is lost; a
SIGSTOPped instance woken after its session expired has its commits refused (counted and
logged) and drops the partitions it held.
"""

from __future__ import annotations

import json
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
    handled_lines,
    highs,
    open_store,
    prepare_kspout_run,
    produce,
    stored,
)
from tests.integration.test_ownership import claims, eventually

SESSION = 4.0  # zk_session_timeout: ZooKeeper's least with its default tickTime of 2 s
EXTRA = f"zk_session_timeout = {SESSION}\n"


@contextmanager
def instances(
    stack: DevStack, config: TopicConfig, tmp_path: Path, count: int
) -> Iterator[list[tuple[subprocess.Popen[bytes], Path]]]:
    """`count` `kspout run --json` processes, each logging what it handled to its own file;
    stopped (SIGTERM, then SIGKILL) when the block ends."""
    argv, env, _ = prepare_kspout_run(stack, config, tmp_path, pause=0.01, extra=EXTRA)
    runs = []
    for i in range(count):
        log = tmp_path / f"handled-{i}.log"
        env_i = {**env, "HANDLED_LOG": str(log)}
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
    produce(producer, config.topic, {p: range(600) for p in PARTITIONS})
    with instances(stack, config, tmp_path, 3) as runs:
        ids = [eventually(owner_of(config, proc.pid), what="registered") for proc, _ in runs]
        eventually(lambda: set(claims(config).values()) == set(ids), what="all three own some")
        victim = max(range(3), key=lambda i: list(claims(config).values()).count(ids[i]))
        held = sorted(p for p, owner in claims(config).items() if owner == ids[victim])
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

    handled = Counter(at for _, log in runs for at in handled_lines(log))
    assert set(handled) == {(p, o) for p in PARTITIONS for o in range(600)}  # nothing lost
    per_instance = [len(handled_lines(log)) for _, log in runs]
    assert all(n > 0 for n in per_instance), per_instance  # each processed some
    twice = sum(n - 1 for n in handled.values())
    print(
        f"\nper instance {per_instance}; processed twice {twice} of {len(handled)}; the killed "
        f"instance's partitions {held} moved {moved_after:.1f}s after SIGKILL"
    )
    assert twice < 0.1 * sum(handled.values()), twice  # few processed by two
    # ZooKeeper ends the session after SESSION (checked every tick, 2 s); then a poll and a claim.
    assert moved_after < 2 * SESSION, moved_after


def test_a_stopped_instance_woken_after_its_session_expired_cannot_commit(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(1500) for p in PARTITIONS})
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
    handled = Counter(at for _, log in runs for at in handled_lines(log))
    assert set(handled) == {(p, o) for p in PARTITIONS for o in range(1500)}  # nothing lost
    assert handled_lines(zombie_log)  # it did run before it was stopped

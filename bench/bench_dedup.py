"""dedup claim+settle throughput beside `redis-benchmark -t set -P 64` on one server, one run.

    python -m bench.bench_dedup            # 10**6 ids per case (~1 min)
    python -m bench.bench_dedup --quick    # 10**5 ids per case (seconds)

Starts its own `redis-server` on a free loopback port with the append-only file on and
`appendfsync everysec`, as in production, measures the server's pipelined SET rate with
`redis-benchmark` (the baseline), then times one client claiming and settling fresh ids in
batches, each batch one claim call and one settle call (two round trips). The epoch source is in
memory: it is consulted only when the epoch changes, never per batch. Rewrites of the
append-only file happen during a case, as in production, but each case starts with none running.

Target from design.md ("Performance targets"): >= 100,000 ids/s claim+settle per client, aiming
at 20% of the SET rate. This is a benchmark, not a test: it prints PASS/MISS and always exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from dedup import ClaimStatus, IdempotencyStore, Settlement
from dedup.store import Effect
from kspout.devstack import RedisServer

TARGET = 100_000  # ids/s claim+settle, one client (design.md)
AIM = 0.20  # of redis-benchmark's pipelined SET rate (design.md)
BATCH = 1000
LEASE_MS = 60_000
DONE_TTL_MS = 3_600_000


class MemoryEpoch:
    """An in-memory epoch source: enough for one process and one Redis that loses nothing."""

    def __init__(self) -> None:
        self.epoch = 0

    def current(self) -> int:
        return self.epoch

    def bump(self, seen: int) -> int:
        self.epoch = max(self.epoch, seen) + 1
        return self.epoch


def set_rate(port: int, n: int) -> float:
    """requests/s of `redis-benchmark -t set -P 64 -q -n n` against the server on `port`."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise SystemExit("redis-benchmark not found; install it with `apt-get install redis-tools`")
    argv = [binary, "-p", str(port), "-t", "set", "-P", "64", "-q", "-n", str(n)]
    output = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    found = re.findall(r"SET: ([\d.]+) requests per second", output)
    if not found:
        raise SystemExit(f"unexpected redis-benchmark output: {output!r}")
    return float(found[-1])


def wait_for_rewrite(client: redis.Redis) -> None:
    """Wait until no append-only file rewrite runs: its fork slows every write while it lasts,
    and a case should not pay for the previous case's writes."""
    while True:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.1)


Effects = Callable[[str], list[Effect]]


def claim_settle(store: IdempotencyStore, ids: list[str], effects: Effects | None) -> float:
    """Seconds to claim and settle DONE all `ids` in batches of BATCH."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        batch = ids[lo : lo + BATCH]
        claims = store.claim(batch, "bench")
        items = [
            Settlement(id, claim.token, True, None, effects(id) if effects else ())
            for id, claim in zip(batch, claims, strict=True)
            if claim.status is ClaimStatus.CLAIMED
        ]
        statuses = store.settle(items)
        assert len(items) == len(batch) == len(statuses)
    return time.perf_counter() - t0


def replay(store: IdempotencyStore, ids: list[str]) -> float:
    """Seconds to claim already-DONE `ids` again (all DUPLICATE), in batches of BATCH."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        claims = store.claim(ids[lo : lo + BATCH], "bench")
        assert claims[0].status is ClaimStatus.DUPLICATE
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10**5 ids per case")
    parser.add_argument("-n", type=int, default=None, help="ids per case (overrides)")
    args = parser.parse_args(argv)
    n = args.n or (10**5 if args.quick else 10**6)

    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as workdir:
        server = RedisServer(Path(workdir), appendonly=True, appendfsync="everysec")
        server.start()
        try:
            client = redis.Redis(host="127.0.0.1", port=server.port)
            baseline = set_rate(server.port, max(n, 10**6))
            client.flushall()
            store = IdempotencyStore(
                client,
                namespace="bench",
                lease_ms=LEASE_MS,
                done_ttl_ms=DONE_TTL_MS,
                epoch_source=MemoryEpoch(),
            )
            claim_settle(store, [f"warm-{i}" for i in range(BATCH * 5)], None)

            def hincrby(id: str) -> list[Effect]:
                return [("HINCRBY", "bench:counts", id[-2:], 1)]

            plain = [f"m-{i}" for i in range(n)]
            cases: list[tuple[str, Callable[[], float]]] = [
                ("claim+settle DONE", lambda: claim_settle(store, plain, None)),
                ("claim of DONE ids (DUPLICATE, no settle)", lambda: replay(store, plain)),
                (
                    "claim+settle DONE + 1 HINCRBY effect",
                    lambda: claim_settle(store, [f"e-{i}" for i in range(n)], hincrby),
                ),
            ]
            rows = []
            for name, run in cases:
                if name.endswith("effect"):
                    client.flushall()  # start from an empty server, as the first case did
                wait_for_rewrite(client)
                client.config_resetstat()
                seconds = run()
                server_us = client.info("commandstats")["cmdstat_evalsha"]["usec"]
                rows.append((name, seconds, server_us / n))
            client.close()
        finally:
            server.stop()

    print(
        f"dedup claim+settle, one client, batches of {BATCH}: {n:,} ids per case; "
        "redis-server with appendonly yes, appendfsync everysec"
    )
    print(
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(f"baseline: redis-benchmark -t set -P 64: {baseline:,.0f} SET/s")
    print()
    print("ids/s; ratio = ids/s / baseline SET/s; server = Redis CPU per id in the scripts")
    header = (
        f"{'case':<42} {'ids/s':>9} {'ratio':>6} {'server':>9}  "
        f"target {TARGET:,}  aim {AIM:.0%} of SET"
    )
    print(header)
    print("-" * len(header))
    for name, seconds, server_us in rows:
        rate = n / seconds
        ratio = rate / baseline
        print(
            f"{name:<42} {rate:>9,.0f} {ratio:>6.1%} {server_us:>6.2f} us  "
            f"{'PASS' if rate >= TARGET else 'MISS':<14} {'met' if ratio >= AIM else 'missed'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

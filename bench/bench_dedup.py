"""dedup lease+settle throughput: one client beside `redis-benchmark -t set -P 64` on one server,
and several clients on one server, a 1-master and a 3-master Redis Cluster, in one run.

    python -m bench.bench_dedup            # 10**6 ids per case (a few minutes)
    python -m bench.bench_dedup --quick    # 10**5 ids per case
    python -m bench.bench_dedup --clients 4 --partitions 12

Every server is its own `redis-server` on a free loopback port, append-only file on with
`appendfsync everysec`, as in production; the clusters are local `--cluster-enabled yes` masters
without replicas. Part one measures the server's pipelined SET rate with `redis-benchmark` (the
baseline), then times one client leasing and settling fresh ids in batches, each batch one
lease call and one settle call (two round trips), as a bolt's task does. Part two runs
`--clients` processes at once, each leasing and settling batches of one Kafka partition at a
time (its share of `--partitions`), against one server, then a 1-master and a 3-master cluster,
and prints the cluster's rate over the one server's. The fences are set to epoch 1 before a case
starts, so the epoch source is never consulted while one runs. Rewrites of the append-only file
happen during a case, as in production, but each single-client case starts with none running.

Targets from design.md ("Performance targets"): lease+settle >= 15% of the SET rate per client;
>= 2.5x on a 3-master cluster over one server. This is a benchmark, not a test: it prints
met/missed and always exits 0.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from threading import Barrier

import redis
from redis.cluster import RedisCluster

from bench.report import table
from dedup import IdempotencyStore, LeaseStatus, Settlement, SettleStatus
from dedup.records import Effect
from dedup.wire import Client
from kspout.devstack import RedisServer
from kspout.devstack.components import RedisClusterServers

AIM = 0.15  # of redis-benchmark's pipelined SET rate, one client (design.md)
SCALE_AIM = 2.5  # 3-master cluster over one server (design.md)
BATCH = 1000
LEASE_MS = 60_000
DONE_TTL_MS = 3_600_000
EPOCH = 1  # every fence's epoch during a case


class PresetEpoch:
    """The epoch source of the bench: the fences are set to `EPOCH` before a case, so a store
    asks only `current()`, once per shard."""

    def current(self) -> int:
        return EPOCH

    def bump(self, seen: int) -> int:
        raise RuntimeError("the bench sets every fence before a case: no epoch change expected")


def new_store(client: Client, namespace: str) -> IdempotencyStore:
    return IdempotencyStore(
        client,
        namespace=namespace,
        lease_ms=LEASE_MS,
        done_ttl_ms=DONE_TTL_MS,
        epoch_source=PresetEpoch(),
    )


def preset_fences(client: Client, store: IdempotencyStore, partitions: int) -> None:
    """Set the fence of every shard the partitions use to `EPOCH`, counter 0."""
    for tag in {store.tag(p) for p in range(partitions)}:
        client.hset(f"{{{tag}}}:fence", mapping={"epoch": EPOCH, "seq": 0})


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


def lease_settle(
    store: IdempotencyStore, ids: Sequence[str], effects: Effects | None, partition: int = 0
) -> float:
    """Seconds to lease and settle DONE all `ids` (of one partition) in batches of BATCH."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        batch = ids[lo : lo + BATCH]
        items = [
            Settlement(
                batch[run.start + k],
                run.token + k,
                True,
                None,
                effects(batch[run.start + k]) if effects else (),
                run.attempts,
            )
            for run in store.lease_runs(batch, "bench", partition)
            if run.status is LeaseStatus.LEASED
            for k in range(run.length)
        ]
        statuses = store.settle(items, partition)
        assert len(items) == len(batch) == len(statuses)
        assert all(r.status is SettleStatus.SETTLED for r in statuses), "a settle was refused"
    return time.perf_counter() - t0


def replay(store: IdempotencyStore, ids: list[str]) -> float:
    """Seconds to lease already-DONE `ids` again (all DUPLICATE), in batches of BATCH."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        [run] = store.lease_runs(ids[lo : lo + BATCH], "bench")
        assert run.status is LeaseStatus.DUPLICATE
    return time.perf_counter() - t0


# -- part one: one client, one server ------------------------------------------------------------


def one_client(workdir: Path, n: int) -> tuple[float, list[tuple[str, float, float]]]:
    """The SET baseline and (case, seconds, server us per id) of the one-client cases."""
    server = RedisServer(workdir / "one-client", appendonly=True, appendfsync="everysec")
    server.start()
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        baseline = set_rate(server.port, max(n, 10**6))
        client.flushall()
        store = new_store(client, "bench")
        preset_fences(client, store, 1)
        lease_settle(store, [f"warm-{i}" for i in range(BATCH * 5)], None)

        def hincrby(id: str) -> list[Effect]:
            return [("HINCRBY", "bench:counts", id[-2:], 1)]

        plain = [f"m-{i}" for i in range(n)]
        cases: list[tuple[str, Callable[[], float]]] = [
            ("lease+settle DONE", lambda: lease_settle(store, plain, None)),
            ("lease of DONE ids (DUPLICATE, no settle)", lambda: replay(store, plain)),
            (
                "lease+settle DONE + 1 HINCRBY effect",
                lambda: lease_settle(store, [f"e-{i}" for i in range(n)], hincrby),
            ),
        ]
        rows = []
        for name, run in cases:
            if name.endswith("effect"):
                client.flushall()  # start from an empty server, as the first case did
                preset_fences(client, store, 1)
            wait_for_rewrite(client)
            client.config_resetstat()
            seconds = run()
            server_us = client.info("commandstats")["cmdstat_evalsha"]["usec"]
            rows.append((name, seconds, server_us / n))
        client.close()
    finally:
        server.stop()
    return baseline, rows


# -- part two: several clients, one server vs a cluster -----------------------------------------


def worker(
    url: str, cluster: bool, namespace: str, mine: list[int], n: int, start: Barrier
) -> float:
    """One client process: lease and settle `n` fresh ids, a batch of one partition at a time,
    round robin over the partitions `mine`; the seconds it took after the common start."""
    client: Client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    store = new_store(client, namespace)
    ids = [f"{mine[0]}-{i}" for i in range(n)]
    start.wait()
    t0 = time.perf_counter()
    for number, lo in enumerate(range(0, n, BATCH)):
        lease_settle(store, ids[lo : lo + BATCH], None, mine[number % len(mine)])
    return time.perf_counter() - t0


def _run_worker(args: tuple[str, bool, str, list[int], int, Barrier]) -> float:
    return worker(*args)


def many_clients(
    url: str, cluster: bool, clients: int, partitions: int, n: int
) -> tuple[float, list[int]]:
    """ids/s of `clients` processes leasing and settling `n` ids in all, at once; and how many
    of the partitions' shards each server holds."""
    client: Client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    namespace = f"bench-{time.monotonic_ns()}"
    store = new_store(client, namespace)
    preset_fences(client, store, partitions)
    spread = shards_per_server(client, store, partitions)
    client.close()
    context = multiprocessing.get_context("fork")
    shares = [list(range(w, partitions, clients)) for w in range(clients)]
    with context.Manager() as manager, context.Pool(clients) as pool:
        start = manager.Barrier(clients)
        jobs = [(url, cluster, namespace, mine, n // clients, start) for mine in shares]
        seconds = max(pool.map(_run_worker, jobs))
    return (n // clients) * clients / seconds, spread


def shards_per_server(client: Client, store: IdempotencyStore, partitions: int) -> list[int]:
    """How many of the partitions' shards each server holds, most first."""
    if not isinstance(client, RedisCluster):
        return [len({store.tag(p) for p in range(partitions)})]
    nodes = [client.get_node_from_key(store.key("x", p)) for p in range(partitions)]  # type: ignore[no-untyped-call]
    ports = [node.port for node in nodes]
    return sorted((ports.count(port) for port in set(ports)), reverse=True)


Rates = dict[str, tuple[float, list[int]]]


def scaling(workdir: Path, clients: int, partitions: int, n: int) -> Rates:
    """(ids/s, shards per server) of the many-clients case on one server, a 1-master and a
    3-master cluster."""
    rates: Rates = {}
    server = RedisServer(workdir / "one-server", appendonly=True, appendfsync="everysec")
    server.start()
    try:
        rates["one server"] = many_clients(server.url, False, clients, partitions, n)
    finally:
        server.stop()
    for masters in (1, 3):
        servers = RedisClusterServers(workdir / f"cluster-{masters}", masters)
        servers.start()
        try:
            rates[f"{masters}-master cluster"] = many_clients(
                servers.url, True, clients, partitions, n
            )
        finally:
            servers.stop()
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10**5 ids per case")
    parser.add_argument("-n", type=int, default=None, help="ids per case (overrides)")
    parser.add_argument("--clients", type=int, default=3, help="client processes in part two")
    parser.add_argument("--partitions", type=int, default=12, help="Kafka partitions, part two")
    args = parser.parse_args(argv)
    n = args.n or (10**5 if args.quick else 10**6)

    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as workdir:
        baseline, rows = one_client(Path(workdir), n)
        rates = scaling(Path(workdir), args.clients, args.partitions, n)

    print(
        f"dedup lease+settle, batches of {BATCH}: {n:,} ids per case; redis-server with "
        "appendonly yes, appendfsync everysec"
    )
    print(
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    )
    print(f"baseline: redis-benchmark -t set -P 64: {baseline:,.0f} SET/s")
    print()
    print("One client; ratio = ids/s / baseline SET/s; server = Redis CPU per id in the scripts")
    print(
        table(
            ["case", "ids/s", "ratio", "server", f"aim {AIM:.0%}"],
            [
                [
                    name,
                    f"{n / seconds:,.0f}",
                    f"{n / seconds / baseline:.1%}",
                    f"{server_us:.2f} us",
                    "met" if n / seconds / baseline >= AIM else "missed",
                ]
                for name, seconds, server_us in rows
            ],
            "<>>><",
        )
    )
    print()
    one = rates["one server"][0]
    print(
        f"{args.clients} client processes at once, {args.partitions} partitions; ratio = ids/s "
        "/ one server's; shards = the partitions' shards per server"
    )
    print(
        table(
            ["servers", "ids/s", "ratio", "shards"],
            [
                [name, f"{rate:,.0f}", f"{rate / one:.2f}x", "/".join(map(str, shards))]
                for name, (rate, shards) in rates.items()
            ],
            "<>>>",
        )
    )
    three = rates["3-master cluster"][0] / one
    verdict = "met" if three >= SCALE_AIM else "missed"
    print(f"3-master cluster over one server: {three:.2f}x (aim {SCALE_AIM}x: {verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

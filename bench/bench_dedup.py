"""dedup lease+settle cost: Redis CPU per id, one client beside `redis-benchmark -t set -P 64`
on one server, and several clients on one server and on Redis Clusters, in one run.

    python -m bench.bench_dedup            # 10**6 ids per case (a few minutes)
    python -m bench.bench_dedup --quick    # 10**5 ids per case
    python -m bench.bench_dedup --clients 4 --partitions 12 --masters 1,3,6
    python -m bench.bench_dedup -n 600000 --clients 12 --partitions 48 --masters 3,6 --rounds 3

Every server is its own `redis-server` on a free loopback port, append-only file on with
`appendfsync everysec`, as in production; the clusters are local `--cluster-enabled yes` masters
without replicas. Part one measures the server's pipelined SET rate with `redis-benchmark` (the
baseline), then times one client leasing and settling fresh ids as the dedup bolt does: tasks of
10,000 ids, each in parts of 500, the next part's lease and the last part's settlement in Redis
while this part's settlements are built (`dedup.overlap`); beside it, for comparison, the same
ids one call at a time (1,000 a call, each waited for), and the two halves apart (fresh ids
leased 500 a call, then those settled, each call waited for); then with one effect per id:
an HINCRBY of 100 counters (each call increments each by a sum), an HINCRBY of a counter per id
(a field group: one HMGET and one HSET per call), a SET of a key per id (a merged write: one MSET
per call) and a SADD to one set (one SADD per call); beside each, the same effects sent alone as
plain commands, pipelined, without the store (what they cost a client that applies them
without dedup).
Redis CPU per id is the server process's `used_cpu_sys + used_cpu_user` (INFO cpu) over the case,
divided by its ids: parsing, scripts, the append-only file's buffer, everything but a rewrite's
child; the scripts' own share (INFO commandstats) is printed beside it. With `--rounds`, every
case runs once per round, in turn, the baseline too: a figure is the median of its rounds, and
what an effect adds the median of each round's effect case less that round's plain case.
Part two runs `--clients` processes at once, each leasing and settling batches of one Kafka
partition at a time (its share of `--partitions`), against one server, then each cluster of
`--masters` (all of them started at first and measured in turn, `--rounds` times over: a figure is
the median of its rounds, a ratio the median of each round's ratio to the one server in that round,
since a server's CPU per id moves from run to run), and prints each one's rate over the one
server's and the Redis CPU per id of all its servers together. Part three prints how the
partitions' shards spread over each cluster's masters (exact: where the store's hash tags land) for
the run's partition count and for 12, 48 and 192, in a fresh namespace each. The fences are set to
epoch 1 before a case starts, so the epoch source is never consulted while one runs, and the record
buckets before the current one are given records as in a store that has run longer than its window,
so a new id is looked up in each of them. Rewrites of the append-only file happen during a case, as
in production, but each single-client case starts with none running.

Targets (issue 24): lease+settle <= 4 us of Redis CPU per id and >= 25% of the SET rate per
client, DUPLICATE <= 1.5 us, an effect adding <= 2 us; a cluster spends no more per id than one
server; the busiest master holds <= 1.25x its fair share of shards; >= 2.7x (3 masters) and >= 5x
(6 masters) over one server on a machine with a core per master. This is a benchmark, not a
test: it prints met/missed and always exits 0.
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
from functools import partial
from itertools import repeat
from pathlib import Path
from statistics import median
from threading import Barrier
from typing import NamedTuple

import redis
from redis.cluster import RedisCluster

from bench.report import table
from dedup import IdempotencyStore, LeaseStatus, Settlement
from dedup.overlap import IDS_PER_CALL, overlapped
from dedup.records import SETTLED, Effect, LeaseRun, SettleResult
from dedup.scripts import fence_key
from dedup.store import Sent
from dedup.wire import Client
from kspout.devstack import RedisServer
from kspout.devstack.components import RedisClusterServers

AIM = 0.25  # lease+settle, of redis-benchmark's pipelined SET rate, one client (issue 24)
PLAIN = "lease+settle DONE"
CPU_AIMS = {  # Redis CPU per id, us (issue 24); the effect case's is the plain case's + 2
    PLAIN: 4.0,
    "lease of DONE ids (DUPLICATE, no settle)": 1.5,
}
EFFECT_EXTRA_AIM = 2.0  # what one effect may add per id, us (each effect case)
SCALE_AIMS = {3: 2.7, 6: 5.0}  # cluster over one server, with a core per master (issue 24)
SPREAD_AIM = 1.25  # the busiest master's shards over its fair share
SPREAD_PARTITIONS = (12, 48, 192)
BATCH = 1000  # ids a call carries where the bench waits for each call
TASK = 10_000  # ids of a task's batch, as the dedup bolt gets them (`batch_size`'s default)
SERIAL = "lease+settle DONE, one call at a time"  # for comparison: no aim
LEASE_ALONE = "lease alone (new ids, 500 a call)"  # the two halves, apart: no aim
SETTLE_ALONE = "settle alone (those ids DONE, 500 a call)"
LEASE_MS = 60_000
DONE_TTL_MS = 3_600_000
OLDER_RECORDS = 20_000  # records in each older bucket a case starts with (`fill_older_buckets`)
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
    """Set the fence of every shard the partitions use to `EPOCH`, counter 0, and fill the
    record buckets before the current one as a steady state would (`fill_older_buckets`)."""
    shards = {store.tag(p): p for p in reversed(range(partitions))}  # a partition per shard
    for tag, partition in shards.items():
        fence = {"epoch": EPOCH, "seq": 0, "bucket": store.bucket_ms, "keep": store.keep_ms}
        client.hset(fence_key(tag), mapping=fence)
        fill_older_buckets(client, store, partition)


def fill_older_buckets(client: Client, store: IdempotencyStore, partition: int) -> None:
    """Give each older bucket of `partition`'s shard that would still exist `OLDER_RECORDS`
    records, so that a new id is looked up in every bucket, as in a store running longer than
    the window."""
    seconds, micros = client.time()  # type: ignore[misc]
    current = (seconds * 1000 + micros // 1000) // store.bucket_ms
    for k in range(current - -(-store.keep_ms // store.bucket_ms), current):
        bucket = store.bucket_key(k, partition)
        for lo in range(0, OLDER_RECORDS, BATCH):
            fields = {f"older-{k}-{i}": "D:10000000001:1" for i in range(lo, lo + BATCH)}
            client.hset(bucket, mapping=fields)  # type: ignore[arg-type]
        client.pexpireat(bucket, (k + 1) * store.bucket_ms + store.keep_ms)


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


def settlements(
    batch: Sequence[str], start: int, runs: list[LeaseRun], effects: Effects | None
) -> list[Settlement]:
    """DONE settlements of the ids `runs` leased (all of them), `runs` counted from `start` in
    `batch`. Built with `map` (about 1 us per id less than a comprehension that indexes the
    batch per id), so the figures are the store's more than this loop's."""
    items: list[Settlement] = []
    for run in runs:
        assert run.status is LeaseStatus.LEASED, run
        leased = batch[start + run.start : start + run.start + run.length]
        extra = map(effects, leased) if effects else repeat(())
        token, attempts = repeat(run.token), repeat(run.attempts)
        items += map(Settlement, leased, token, repeat(True), repeat(None), extra, attempts)
    return items


def lease_settle(
    store: IdempotencyStore, ids: Sequence[str], effects: Effects | None, partition: int = 0
) -> float:
    """Seconds to lease and settle DONE all `ids` (of one partition) as the dedup bolt does: a
    task's batch of TASK ids at a time, in parts, each part's lease written before the one
    before it settles (`dedup.overlap`)."""

    def work(
        batch: Sequence[str], start: int, runs: list[LeaseRun]
    ) -> tuple[list[Settlement], int, int]:
        items = settlements(batch, start, runs, effects)
        return items, partition, len(items)

    def answer(sent: Sent[list[SettleResult]], count: int) -> None:
        assert sent.result().count(SETTLED) == count, "refused"

    t0 = time.perf_counter()
    for lo in range(0, len(ids), TASK):
        batch = ids[lo : lo + TASK]
        overlapped(store, batch, [partition] * len(batch), "bench", partial(work, batch), answer)
    return time.perf_counter() - t0


def lease_settle_serially(store: IdempotencyStore, ids: Sequence[str]) -> float:
    """Seconds to lease and settle DONE all `ids`, BATCH at a time, each call waited for before
    the next is written: the store's cost without the overlap, for comparison."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        batch = ids[lo : lo + BATCH]
        items = settlements(batch, 0, store.lease_runs(batch, "bench"), None)
        statuses = store.settle(items)
        assert len(items) == len(batch) and statuses.count(SETTLED) == len(batch), "refused"
    return time.perf_counter() - t0


Leased = list[tuple[Sequence[str], list[LeaseRun]]]  # each call's ids and its answer


def lease_alone(store: IdempotencyStore, ids: Sequence[str], leased: Leased) -> float:
    """Seconds to lease fresh `ids`, IDS_PER_CALL a call, each waited for; the answers are
    kept in `leased` for `settle_alone`."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), IDS_PER_CALL):
        part = ids[lo : lo + IDS_PER_CALL]
        leased.append((part, store.lease_runs(part, "bench")))
    return time.perf_counter() - t0


def settle_alone(store: IdempotencyStore, leased: Leased) -> float:
    """Seconds to settle DONE what `lease_alone` leased, a call per lease call, each waited for."""
    t0 = time.perf_counter()
    for part, runs in leased:
        assert store.settle(settlements(part, 0, runs, None)).count(SETTLED) == len(part)
    return time.perf_counter() - t0


def replay(store: IdempotencyStore, ids: list[str]) -> float:
    """Seconds to lease already-DONE `ids` again (all DUPLICATE), in batches of BATCH."""
    t0 = time.perf_counter()
    for lo in range(0, len(ids), BATCH):
        [run] = store.lease_runs(ids[lo : lo + BATCH], "bench")
        assert run.status is LeaseStatus.DUPLICATE
    return time.perf_counter() - t0


def server_cpu(ports: Sequence[int]) -> list[float]:
    """Seconds of CPU each Redis server process has used (INFO cpu: system + user)."""
    seconds = []
    for port in ports:
        with redis.Redis(host="127.0.0.1", port=port) as client:
            info = client.info("cpu")
        seconds.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
    return seconds


def cpu_us_per_id(before: list[float], after: list[float], n: int) -> list[float]:
    """Each server's CPU per id over a case, us."""
    return [(b - a) * 1e6 / n for a, b in zip(before, after, strict=True)]


# -- part one: one client, one server ------------------------------------------------------------


class Measured(NamedTuple):
    """One case of part one in one round."""

    seconds: float
    cpu_us: float  # Redis CPU per id
    script_us: float  # the scripts' share of it
    alone_us: float | None  # an effect case's effects sent alone (`effects_alone`), per id


def hincrby(id: str) -> list[Effect]:  # 100 counters: each batch sums each one's
    return [("HINCRBY", "bench:counts", id[-2:], 1)]


def hincrby_own(id: str) -> list[Effect]:  # a counter per id: a field group, no sum
    return [("HINCRBY", "bench:own", id, 1)]


def set_own(id: str) -> list[Effect]:  # a result per id: the batch's SETs, one MSET
    return [("SET", f"bench:result:{id}", "ok")]


def sadd(id: str) -> list[Effect]:  # one set of ids: the batch's SADDs, one SADD
    return [("SADD", "bench:seen", id)]


EFFECT_CASES: dict[str, Effects] = {
    "lease+settle DONE + 1 HINCRBY effect, 100 counters": hincrby,
    "lease+settle DONE + 1 HINCRBY effect, a counter per id": hincrby_own,
    "lease+settle DONE + 1 SET effect, a key per id": set_own,
    "lease+settle DONE + 1 SADD effect, one set": sadd,
}


def one_client(workdir: Path, n: int, rounds: int) -> tuple[list[float], dict[str, list[Measured]]]:
    """The SET baseline of each round, and each one-client case's figures in each round (every
    case once per round, in the same order, fresh ids each time)."""
    server = RedisServer(workdir / "one-client", appendonly=True, appendfsync="everysec")
    server.start()
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        baselines: list[float] = []
        cases: dict[str, list[Measured]] = {}
        for round_ in range(rounds):
            print(f"part one, round {round_ + 1} of {rounds}", file=sys.stderr)
            baselines.append(set_rate(server.port, max(n, 10**6)))
            for name, measured in one_round(client, server.port, n, f"r{round_}-").items():
                cases.setdefault(name, []).append(measured)
        client.close()
    finally:
        server.stop()
    return baselines, cases


def one_round(client: redis.Redis, port: int, n: int, prefix: str) -> dict[str, Measured]:
    """Each one-client case once, its ids `prefix`ed; each effect case on an empty server (as
    the first case is), then its effects alone on an empty server."""
    client.flushall()
    store = new_store(client, "bench")
    preset_fences(client, store, 1)
    lease_settle(store, [f"{prefix}warm-{i}" for i in range(BATCH * 5)], None)
    plain = [f"{prefix}m-{i}" for i in range(n)]
    leased: Leased = []
    cases: list[tuple[str, Callable[[], float]]] = [
        (PLAIN, lambda: lease_settle(store, plain, None)),
        (SERIAL, lambda: lease_settle_serially(store, [f"{prefix}c-{i}" for i in range(n)])),
        (LEASE_ALONE, lambda: lease_alone(store, [f"{prefix}l-{i}" for i in range(n)], leased)),
        (SETTLE_ALONE, lambda: settle_alone(store, leased)),
        ("lease of DONE ids (DUPLICATE, no settle)", lambda: replay(store, plain)),
    ]
    effect_ids = {
        name: [f"{prefix}{k}-{i}" for i in range(n)] for k, name in enumerate(EFFECT_CASES)
    }
    for name, ids in effect_ids.items():
        cases.append((name, partial(lease_settle, store, ids, EFFECT_CASES[name])))
    figures: dict[str, Measured] = {}
    for name, run in cases:
        effects = EFFECT_CASES.get(name)
        if effects is not None:
            client.flushall()  # start from an empty server, as the first case did
            preset_fences(client, store, 1)
        wait_for_rewrite(client)
        client.config_resetstat()
        before = server_cpu([port])
        seconds = run()
        [cpu_us] = cpu_us_per_id(before, server_cpu([port]), n)
        script_us = client.info("commandstats")["cmdstat_evalsha"]["usec"] / n
        alone = (
            effects_alone(client, port, effect_ids[name], effects) if effects is not None else None
        )
        figures[name] = Measured(seconds, cpu_us, script_us, alone)
    return figures


def effects_alone(client: redis.Redis, port: int, ids: list[str], effects: Effects) -> float:
    """Redis CPU per id of `effects` of `ids` sent as plain commands, IDS_PER_CALL ids to a
    pipeline, on an empty server: what the effects cost a client with no store."""
    client.flushall()
    wait_for_rewrite(client)
    before = server_cpu([port])
    with client.pipeline(transaction=False) as pipe:
        for lo in range(0, len(ids), IDS_PER_CALL):
            for id in ids[lo : lo + IDS_PER_CALL]:
                for effect in effects(id):
                    pipe.execute_command(*effect)  # type: ignore[no-untyped-call]
            pipe.execute()
    [cpu_us] = cpu_us_per_id(before, server_cpu([port]), len(ids))
    return cpu_us


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


class ScaleRow(NamedTuple):
    """One server or cluster in part two."""

    rate: float  # ids/s
    cpu_us: list[float]  # Redis CPU per id, us, per server
    shards: list[int]  # the partitions' shards per server, most first


def many_clients(
    url: str, cluster: bool, ports: list[int], clients: int, partitions: int, n: int
) -> ScaleRow:
    """`clients` processes leasing and settling `n` ids in all, at once, on the server or
    cluster at `url` (its servers on `ports`)."""
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
        before = server_cpu(ports)
        seconds = max(pool.map(_run_worker, jobs))
        after = server_cpu(ports)
    done = (n // clients) * clients
    return ScaleRow(done / seconds, cpu_us_per_id(before, after, done), spread)


def shards_per_server(client: Client, store: IdempotencyStore, partitions: int) -> list[int]:
    """How many of the partitions' shards each server holds, most first (every master of a
    cluster, those with none included)."""
    if not isinstance(client, RedisCluster):
        return [len({store.tag(p) for p in range(partitions)})]
    nodes = [client.get_node_from_key(store.effect_key("x", p)) for p in range(partitions)]  # type: ignore[no-untyped-call]
    ports = [node.port for node in nodes]
    masters = [node.port for node in client.get_primaries()]  # type: ignore[no-untyped-call]
    return sorted((ports.count(port) for port in masters), reverse=True)


def busiest_over_fair(shards: list[int]) -> float:
    """The busiest server's shards over its fair share."""
    return max(shards) * len(shards) / sum(shards)


Spread = dict[int, list[int]]  # partitions -> shards per master, most first


def spread(url: str, partitions: Sequence[int]) -> Spread:
    """Where each partition count's shards land on the cluster at `url`, a fresh namespace each."""
    with RedisCluster.from_url(url) as client:
        return {
            p: shards_per_server(client, new_store(client, f"spread-{p}-{time.monotonic_ns()}"), p)
            for p in partitions
        }


def scaling(
    workdir: Path, clients: int, partitions: int, n: int, masters: Sequence[int], rounds: int
) -> tuple[dict[str, list[ScaleRow]], dict[int, Spread]]:
    """The many-clients case on one server and each cluster of `masters`, all started at once
    and measured in turn, `rounds` times over (each round: every one of them once, in the same
    order, a fresh namespace each time); and each cluster's shard spread."""
    one = RedisServer(workdir / "one-server", appendonly=True, appendfsync="everysec")
    clusters = {
        count: RedisClusterServers(workdir / f"cluster-{count}", count) for count in masters
    }
    targets: dict[str, tuple[str, bool, list[int]]] = {}
    try:
        one.start()
        targets["one server"] = (one.url, False, [one.port])
        for count, servers in clusters.items():
            servers.start()
            ports = [node.port for node in servers.nodes]
            targets[f"{count}-master cluster"] = (servers.url, True, ports)
        rows: dict[str, list[ScaleRow]] = {name: [] for name in targets}
        for round_ in range(rounds):
            for name, (url, cluster, ports) in targets.items():
                print(f"part two, round {round_ + 1} of {rounds}: {name}", file=sys.stderr)
                for port in ports:
                    with redis.Redis(host="127.0.0.1", port=port) as client:
                        wait_for_rewrite(client)
                rows[name].append(many_clients(url, cluster, ports, clients, partitions, n))
        counts = sorted({partitions, *SPREAD_PARTITIONS})
        spreads = {count: spread(servers.url, counts) for count, servers in clusters.items()}
    finally:
        one.stop()
        for servers in clusters.values():
            servers.stop()
    return rows, spreads


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10**5 ids per case")
    parser.add_argument("-n", type=int, default=None, help="ids per case (overrides)")
    parser.add_argument("--clients", type=int, default=3, help="client processes in part two")
    parser.add_argument("--partitions", type=int, default=12, help="Kafka partitions, part two")
    parser.add_argument("--masters", default="1,3", help="cluster sizes of part two, e.g. 1,3,6")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of each part (medians; cases in turn)"
    )
    args = parser.parse_args(argv)
    n = args.n or (10**5 if args.quick else 10**6)
    masters = [int(m) for m in args.masters.split(",")]

    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as workdir:
        baselines, cases = one_client(Path(workdir), n, args.rounds)
        scale, spreads = scaling(
            Path(workdir), args.clients, args.partitions, n, masters, args.rounds
        )

    print(
        f"dedup lease+settle, tasks of {TASK:,} ids in overlapped parts of {IDS_PER_CALL}: "
        f"{n:,} ids per case; redis-server with appendonly yes, appendfsync everysec"
    )
    print(
        f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    )
    each = ", ".join(f"{rate:,.0f}" for rate in baselines)
    print(f"baseline: redis-benchmark -t set -P 64: {median(baselines):,.0f} SET/s ({each})")
    print()
    print(one_client_table(cases, n, baselines))
    print()
    print(scale_table(scale, args.clients, args.partitions))
    print()
    print(spread_table(spreads))
    return 0


def one_client_table(cases: dict[str, list[Measured]], n: int, baselines: list[float]) -> str:
    """Part one's table, each figure the median of the rounds, with each case's aims met or
    missed; `each round` lists the figure an aim judges (CPU per id, or what an effect adds)."""
    plain = [m.cpu_us for m in cases[PLAIN]]
    cells = []
    for name, rounds in cases.items():
        cpu = [m.cpu_us for m in rounds]
        ratios = [n / m.seconds / base for m, base in zip(rounds, baselines, strict=True)]
        judged = cpu
        if name == SERIAL:
            said = "without the overlap, for comparison"
        elif name in (LEASE_ALONE, SETTLE_ALONE):
            said = "the two halves apart, for comparison"
        elif name in CPU_AIMS:
            aim = CPU_AIMS[name]
            said = f"<= {aim} us: {verdict(median(cpu) <= aim)}"
            if name == PLAIN:
                said += f"; >= {AIM:.0%}: {verdict(median(ratios) >= AIM)}"
        else:
            judged = [c - p for c, p in zip(cpu, plain, strict=True)]
            extra = median(judged)
            said = (
                f"adds {extra:.2f} us, <= {EFFECT_EXTRA_AIM}: {verdict(extra <= EFFECT_EXTRA_AIM)}"
            )
        alone = [m.alone_us for m in rounds if m.alone_us is not None]
        cells.append(
            [
                name,
                f"{median(n / m.seconds for m in rounds):,.0f}",
                f"{median(ratios):.1%}",
                f"{median(cpu):.2f} us",
                f"{median(m.script_us for m in rounds):.2f} us",
                f"{median(alone):.2f} us" if alone else "",
                said,
                " ".join(f"{x:.2f}" for x in judged),
            ]
        )
    return "\n".join(
        [
            f"One client, median of {len(baselines)} round(s); ratio = ids/s / that round's "
            "baseline SET/s; Redis CPU = the server process's CPU per id (INFO cpu); scripts = "
            "their share of it (INFO commandstats); alone = the case's effects sent as plain "
            f"commands, {IDS_PER_CALL} ids to a pipeline, without the store",
            table(
                ["case", "ids/s", "ratio", "Redis CPU", "scripts", "alone", "aims", "each round"],
                cells,
                "<>>>>><<",
            ),
        ]
    )


def scale_table(scale: dict[str, list[ScaleRow]], clients: int, partitions: int) -> str:
    """Part two's table: rates, Redis CPU per id (all servers; the busiest), shards; with
    several rounds, each figure is the median of the rounds, a ratio that of each round's own
    ratios (one server measured in the same round), and `rounds` lists those ratios."""
    one = scale["one server"]
    lines = [
        f"{clients} client processes at once, {partitions} partitions, {len(one)} round(s); "
        "ratio = ids/s / one server's in the same round; Redis CPU = all its servers' CPU per "
        "id (the busiest server's); shards = the partitions' shards per master; median of the "
        "rounds",
        table(
            ["servers", "ids/s", "ratio", "Redis CPU", "busiest", "shards", "rounds"],
            [
                [
                    name,
                    f"{median(row.rate for row in rows):,.0f}",
                    f"{median(rate_ratios(rows, one)):.2f}x",
                    f"{median(sum(row.cpu_us) for row in rows):.2f} us",
                    f"{median(max(row.cpu_us) for row in rows):.2f} us",
                    "/".join(map(str, rows[0].shards)),
                    " ".join(f"{r:.2f}x" for r in rate_ratios(rows, one)),
                ]
                for name, rows in scale.items()
            ],
            "<>>>><<",
        ),
    ]
    one_cpu = median(sum(row.cpu_us) for row in one)
    for name, rows in scale.items():
        if name == "one server":
            continue
        more = median(sum(row.cpu_us) for row in rows) / one_cpu
        masters = len(rows[0].shards)
        line = f"{name}: Redis CPU per id {more:.2f}x one server's (aim <= 1.00x: "
        line += f"{verdict(more <= 1)})"
        if masters in SCALE_AIMS:
            cores = os.cpu_count() or 1
            got = median(rate_ratios(rows, one))
            aim = SCALE_AIMS[masters]
            line += f"; {got:.2f}x its rate (aim {aim}x: {verdict(got >= aim)}"
            if cores < masters + clients:
                line += (
                    f", not judged here: {cores} CPUs for {masters} masters and {clients} clients"
                )
            line += ")"
        lines.append(line)
    return "\n".join(lines)


def rate_ratios(rows: list[ScaleRow], one: list[ScaleRow]) -> list[float]:
    """Each round's rate over the one server's in the same round."""
    return [row.rate / base.rate for row, base in zip(rows, one, strict=True)]


def spread_table(spreads: dict[int, Spread]) -> str:
    """Part three's table: each cluster's shards per master, for each partition count."""
    cells = []
    for masters, by_count in spreads.items():
        for partitions, shards in by_count.items():
            worst = busiest_over_fair(shards)
            ceiling = -(-partitions // masters)  # the best any spread can do
            met = worst <= SPREAD_AIM or max(shards) <= ceiling
            cells.append(
                [
                    f"{masters}",
                    f"{partitions}",
                    "/".join(map(str, shards)),
                    f"{worst:.2f}x",
                    verdict(met),
                ]
            )
    return "\n".join(
        [
            f"Shards per master (exact), a fresh namespace each; aim: the busiest <= {SPREAD_AIM}x "
            "its fair share (or the fewest possible, where partitions do not divide)",
            table(["masters", "partitions", "shards", "busiest/fair", "aim"], cells, ">>>><"),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())

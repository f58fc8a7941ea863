"""The dedup bolt while its Redis is SIGKILLed: no effect applied twice, none lost.

A `redis-server` of the test's own (append-only file, `appendfsync everysec`) keeps the dedup
records; the bolt runs in process (`kspout run`'s executor: one batch at a time, each a lease,
the handler on every leased message, a settlement). Once a third of the messages are handled,
the test snapshots every dedup record, SIGKILLs the server while a batch holds leases, keeps it
down for `OUTAGE` seconds and starts it again on the same files. Two kinds of kill:

* `process`: the server process dies. What `write()` had handed the kernel survives (the OS
  still has it), so `everysec` loses at most what the server had not yet written out.
* `machine`: the same kill, then the append-only file is cut back to its length when the batch
  before the one in flight entered the bolt (less than `FSYNC_LAG` seconds before the kill):
  what `everysec` can lose when the machine dies, since only what was fsynced is on the disk.
  The records of those two batches (their leases, DONE records, and the fencing counter that
  handed out their tokens) are really gone, and the previous batch's offsets were committed.

What the kill lost is read from a copy of the server's files, opened by a second server
before the first comes back (so the bolt cannot have written anything since): each record
the snapshot held that is gone or moved back, and how far the fencing counter went back.

The effect of each message goes to Redis (with its DONE record, in one script) or to
PostgreSQL (through the fenced sink, in one transaction with the id's fence row). Judged
against the test's own ledger (the ids it produced) and what the sinks durably hold (the Redis
hash read back after the restart, PostgreSQL's rows), never kspout's records: every id applied
exactly once; commit points at the high watermarks. The fault is counted as struck: batches in
the bolt at the kill, and batches whose Redis calls failed with the outage.

Not here: effects in Redis with a `machine` kill. A DONE record lost with its effect after its
message was committed is an effect lost for good; README ("Redis durability") says so, and
`[dedup] wait_aof` (Redis 7.2) or `appendfsync always` close that window.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka import Producer

from dedup import Effects, IdempotencyBolt
from dedup.errors import FencedOut
from dedup.postgres import PostgresSink
from kspout.bolts import Collector, Tuple
from kspout.config import TopicConfig
from kspout.devstack import DevStack, RedisServer
from kspout.driver import Driver
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from tests.chaos.jobs import applied_table, count_applied, create_tables, postgres_sink
from tests.integration.helpers import PARTITIONS, highs, produce, stored

PER_PARTITION = 400
PAUSE = 0.002  # seconds of work per message: a batch of 4 x 50 holds its leases ~0.4 s
OUTAGE = 1.5  # seconds Redis stays down
FSYNC_LAG = 2.0  # seconds of writes `everysec` may not have fsynced when the machine dies


def keyed(p: int, o: int) -> bytes:
    return b"id-%d-%d" % (p, o)


@dataclass
class Watch:
    """What the test counts inside the bolt and its handler (one process: the in-process
    executor runs the bolt on a thread of this one)."""

    aof: Path  # the server's append-only file
    lock: threading.Lock = field(default_factory=threading.Lock)
    handled: int = 0  # handler calls that returned
    sink: Counter[str] = field(default_factory=Counter)  # the SQL sink's answers, and refusals
    in_flight: int = 0  # batches inside the bolt now
    in_flight_at_kill: int = 0
    met_outage: list[str] = field(default_factory=list)  # what each batch's Redis call raised
    # Per batch: when it entered the bolt, the append-only file's size then, and the offset
    # after its last message, by partition.
    batches: list[tuple[float, int, dict[int, int]]] = field(default_factory=list)


class WatchedBolt(IdempotencyBolt):
    """The dedup bolt, unchanged, counted: batches in it, and those that met the outage."""

    watch: Watch

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        ends: dict[int, int] = {}
        for tuple_ in tuples:
            record = tuple_.record
            ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
        try:
            size = self.watch.aof.stat().st_size
        except FileNotFoundError:  # a restarted server may write another file: not cut then
            size = -1
        with self.watch.lock:
            self.watch.in_flight += 1
            self.watch.batches.append((time.monotonic(), size, ends))
        try:
            super().execute_batch(tuples, collector)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            with self.watch.lock:
                self.watch.met_outage.append(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            with self.watch.lock:
                self.watch.in_flight -= 1


@dataclass
class Handler:
    """Works `PAUSE` seconds, then applies the message's one effect: a count of its id in the
    Redis hash `effect` (with DONE), or in PostgreSQL through `sink`."""

    watch: Watch
    effect: str
    sink: PostgresSink | None

    def __call__(self, record: Record, effects: Effects) -> None:
        time.sleep(PAUSE)
        if self.sink is None:
            effects.hincrby(self.effect, effects.id)
        else:
            table = applied_table(self.sink.namespace)
            try:
                answer = self.sink.write(effects, partial(count_applied, table, effects.id))
            except FencedOut:
                with self.watch.lock:
                    self.watch.sink["fenced_out"] += 1
                raise
            with self.watch.lock:
                self.watch.sink[answer.value] += 1
        with self.watch.lock:
            self.watch.handled += 1


def dedup_records(client: redis.Redis, namespace: str) -> dict[str, str]:
    """Every dedup record of `namespace` (by id, its state string), and the fencing counter
    (under `fence`)."""
    marks = f"{{{namespace}}}:done:"  # lease calls settled DONE whole: their records read DONE
    done = {bytes(k).decode()[len(marks) :] for k in client.scan_iter(match=marks + "*")}
    out = {
        bytes(id_).decode(): _as_done(bytes(record).decode(), done)
        for bucket in client.scan_iter(match=f"{{{namespace}}}:ids:*", count=1000)
        for id_, record in client.hgetall(bucket).items()
    }
    seq = client.hget(f"{{{namespace}}}:fence", "seq")
    out["fence"] = "" if seq is None else bytes(seq).decode()
    return out


def _as_done(record: str, done: set[str]) -> str:
    """`record`, as `D:` if it is IN_FLIGHT under a token marked DONE."""
    state, token, rest = record.split(":", 2)
    return f"D:{token}:{rest}" if state == "I" and token in done else record


def lost_records(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """What a kill lost: per id, the state the snapshot held and what survived of it."""
    lost = {}
    for id_, state in before.items():
        if id_ == "fence":
            continue
        now = after.get(id_)
        if now is None or (state.startswith("D:") and not now.startswith("D:")):
            lost[id_] = f"{state.split(':', 1)[0]} -> {now.split(':', 1)[0] if now else 'gone'}"
    return lost


def survivors(server: RedisServer, workdir: Path, namespace: str) -> dict[str, str]:
    """The dedup records in a copy of the killed server's files, read by a server of its own."""
    shutil.copytree(server.home, workdir / "redis")
    copy = RedisServer(workdir)
    copy.start()
    try:
        client = redis.Redis.from_url(copy.url)
        try:
            return dedup_records(client, namespace)
        finally:
            client.close()
    finally:
        copy.stop()


def newest_aof(server: RedisServer) -> Path:
    """The append-only file the server writes to (`appendonly.aof.<n>.incr.aof`, highest n)."""
    files = (server.home / "appendonlydir").glob("*.incr.aof")
    return max(files, key=lambda path: int(path.name.split(".")[-3]))


@dataclass
class Kill:
    """The kill, from a thread. Once a third is handled, it waits for a batch in the bolt
    whose predecessor's offsets are committed, snapshots the dedup records and SIGKILLs the
    server; for a `machine` kill, it cuts the append-only file back to its size when that
    predecessor entered the bolt (its leases and DONE records and the batch's are lost; that
    must be less than `FSYNC_LAG` seconds before the kill). Then it reads what survived and starts
    the server again after `OUTAGE`."""

    server: RedisServer
    config: TopicConfig
    namespace: str
    watch: Watch
    machine: bool
    workdir: Path
    threshold: int
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    cut: int = 0
    cut_age: float = 0.0  # seconds between the file's cut point and the kill
    error: BaseException | None = None

    def __call__(self) -> None:
        try:
            self._strike()
        except BaseException as exc:  # re-raised by the test once the run has ended
            self.error = exc
            if not self.server.running:
                self.server.start()

    def _ready(self) -> tuple[float, int] | None:
        """When the previous batch entered the bolt and the file's size then, if a batch is in
        the bolt now and the previous one's offsets are committed."""
        with self.watch.lock:
            batches = list(self.watch.batches)
            running = self.watch.in_flight > 0
        if self.watch.handled < self.threshold or not running or len(batches) < 2:
            return None
        started, size, ends = batches[-2]
        if size < 0:
            return None
        committed = stored(self.config)
        if any(committed.get(p, 0) < end for p, end in ends.items()):
            return None
        with self.watch.lock:
            if len(self.watch.batches) != len(batches) or self.watch.in_flight == 0:
                return None  # the batch ended meanwhile: wait for the next
        return started, size

    def _strike(self) -> None:
        deadline = time.monotonic() + 120
        while (point := self._ready()) is None:
            assert time.monotonic() < deadline, "no batch to strike within 120 s"
            time.sleep(0.005)
        client = redis.Redis.from_url(self.server.url)
        try:
            self.before = dedup_records(client, self.namespace)
        finally:
            client.close()
        with self.watch.lock:
            self.watch.in_flight_at_kill = self.watch.in_flight
        self.server.kill()  # SIGKILL
        killed_at = time.monotonic()
        if self.machine:
            started, size = point
            self.cut_age = killed_at - started
            self.cut = self.watch.aof.stat().st_size - size
            with self.watch.aof.open("r+b") as aof:
                aof.truncate(size)
        self.after = survivors(self.server, self.workdir, self.namespace)
        time.sleep(max(0.0, killed_at + OUTAGE - time.monotonic()))
        self.server.start()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("effects_in", "kill"),
    [("redis", "process"), ("postgres", "process"), ("postgres", "machine")],
)
def test_redis_sigkilled_under_the_dedup_bolt_applies_every_effect_exactly_once(
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    effects_in: str,
    kill: str,
) -> None:
    server = RedisServer(tmp_path / "killed", appendfsync="everysec")
    server.start()
    try:
        config = make_config(
            batch_size=50,
            max_retries=0,  # no message here fails for its own fault: none may spend an attempt
            redis={"url": server.url},
            dedup={"id_source": "key", "lease": 3.0},
            infra_backoff={"initial": 0.2, "multiplier": 1.5, "max": 1.0},
        )
        sent = {p: range(PER_PARTITION) for p in PARTITIONS}
        produce(producer, config.topic, sent, key=keyed)
        ids = {keyed(p, o).decode() for p in PARTITIONS for o in sent[p]}  # the test's ledger
        sink = None
        if effects_in == "postgres":
            sink = postgres_sink(config, request.getfixturevalue("postgres").url)
            create_tables(sink)
        watch = Watch(newest_aof(server))
        effect = f"{{{config.spout_id}}}:applied"
        bolt = WatchedBolt(Handler(watch, effect, sink), config)
        bolt.watch = watch
        machine = kill == "machine"
        strike = Kill(
            server, config, bolt.namespace, watch, machine, tmp_path / "copy", len(ids) // 3
        )
        killer = threading.Thread(target=strike)
        killer.start()
        with Driver(config, LocalExecutor(config, bolt)) as driver:
            progress = driver.run(until_caught_up=True)
        killer.join()
        if strike.error is not None:
            raise strike.error

        if sink is None:
            client = redis.Redis.from_url(server.url)  # the restarted server, read back
            try:
                raw = client.hgetall(effect)
            finally:
                client.close()
            counts = {bytes(k).decode(): int(v) for k, v in raw.items()}
        else:
            with psycopg.connect(sink.conninfo) as conn:
                rows = conn.execute(f"SELECT id, n FROM {applied_table(sink.namespace)}")
                counts = dict(rows.fetchall())
    finally:
        server.stop()

    lost = lost_records(strike.before, strike.after)
    kinds = Counter(lost.values())
    examples = {kind: sorted(i for i, k in lost.items() if k == kind)[:3] for kind in kinds}
    fence_before, fence_after = strike.before["fence"], strike.after["fence"]
    print(
        f"\neffects in {effects_in}, {kill} kill: {len(ids)} ids; {watch.in_flight_at_kill} "
        f"batch(es) in the bolt at the kill; {len(watch.met_outage)} batch(es) met the outage "
        f"({watch.met_outage[:1]}); {strike.cut} bytes of the append-only file cut "
        f"({strike.cut_age:.2f}s of writes); "
        f"dedup records before the kill {len(strike.before) - 1}, lost {len(lost)}: "
        f"{dict(kinds)} (e.g. {examples}); fencing counter "
        f"{fence_before} before, {fence_after} after; run: {progress.total('acked')} "
        f"acked, {progress.total('duplicates')} duplicates, {progress.total('deferred')} "
        f"deferred, {progress.total('retried')} retried, {progress.total('dead_lettered')} "
        f"dead-lettered" + (f"; the SQL sink answered {dict(watch.sink)}" if sink else "")
    )
    missing = ids - counts.keys()
    twice = {i: n for i, n in counts.items() if n != 1}
    assert not missing, f"lost: {sorted(missing)[:10]}"
    assert not twice, f"applied more than once: {dict(list(twice.items())[:10])}"
    assert counts.keys() == ids
    assert stored(config) == highs(config)
    # The fault struck: a batch held leases when Redis died, and met the outage.
    assert watch.in_flight_at_kill >= 1
    assert watch.met_outage
    assert progress.total("dead_lettered") == 0, "none given up for a fault not its own"
    if kill == "machine":
        assert 0 < strike.cut_age < FSYNC_LAG
        assert strike.cut > 0 and lost, "the cut lost records the snapshot held"
        assert int(fence_after) < int(fence_before), "the fencing counter went back"
        # Tokens were handed out again: the sink refused the writes they would have repeated.
        assert watch.sink["fenced_out"] >= 1

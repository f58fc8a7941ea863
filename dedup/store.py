"""The lease/settle protocol of the dedup bolt: one record per message id, moved by Lua scripts.

Records live in shards, one Redis hash tag each, so that every script call touches one Redis
Cluster slot. On one server there is one shard, the namespace `{<namespace>}`. On a Redis Cluster
(a `redis.cluster.RedisCluster` client) there is one shard per Kafka partition, `{<tag>}` with the
partition's tag chosen by slot so the partitions spread evenly over the masters, and fixed once
chosen (`dedup.shards`: `<namespace>:p<partition>`, with a `:<k>` suffix where needed); a task's
batch (one partition) is still one script call. An id's record is a field of one of its shard's
buckets, hashes `{<tag>}:ids:<k>` named by the time of the record's last write
(`dedup/lua/buckets.lua`). An id's record is then its partition's: the same id in two partitions is
two messages to the store (keep a message's partition stable, as Kafka's default partitioner does
for a key).

States and transitions of a record:

* absent -> IN_FLIGHT(owner, lease deadline, token, attempts=1): `lease` of a new id;
* IN_FLIGHT -> IN_FLIGHT(attempts+1, new token): `lease` once the lease has ended (the holder
  died or hangs; its token is now stale);
* IN_FLIGHT -> IN_FLIGHT(same attempts, new token): `lease` by the lease's own owner, a renewal
  (a second lease of the same id within one call is DEFERRED instead, so a batch never fences
  itself);
* IN_FLIGHT -> DONE / FAILED: `settle` with the record's current token; both keep the attempt
  count, DONE atomically with the item's Redis effects, if any;
* FAILED -> IN_FLIGHT(attempts+1, new token): `lease` (an exception-failed message runs again);
* DONE: `lease` answers DUPLICATE (ack without running user code) until the key expires.

A live lease held by another owner answers DEFERRED (retry later, no attempt spent). Lease
deadlines come from Redis's clock (`TIME` inside the scripts), never from a client's.

Every record expires, so memory stays bounded: a bucket expires whole, `keep_ms` (`lease_ms +
done_ttl_ms`) after its end, so a record in any state is kept at least `keep_ms` after its last
write and at most one bucket's width (`keep_ms` for a new shard) more. That covers leases
nobody settles or leases again (their messages were skipped, reset past, or dead-lettered by
timeout). An IN_FLIGHT record that expires makes its id's next lease a new one (attempt 1, a
higher token), which is safe: the record outlives its lease, so every holder's deadline has
passed and a lease would take the id over anyway, and the message is not DONE (a DONE record
would have replaced it). Keeping it a whole window past the lease lets a late holder whose
lease ran out still settle DONE if nobody leased the id since.

Per batch, not per id, a lease reads the records with one `HMGET` per bucket that can hold one
(two for a new shard) and writes them with one `HSET`; the ids of one lease call share its
token, so their records share one value, which also says how many ids the call leased. A
settle reads them the same way; when it settles every id of one lease call within the lease, it
marks the lease's token DONE with one `SET` (`{<tag>}:done:<token hex>`, expiring with the
records' bucket) instead of writing each record, and an IN_FLIGHT record of a marked token reads
as DONE. Other settlements are written with one `HSET`. A lease call that leases all its ids at
one attempt also writes a proof (`{<tag>}:lease:<token hex>`: how many, the attempt, the bucket,
the SHA1 of the ids; it expires with the lease, and any later write to one of its records deletes
it), so a settle of exactly those ids, in order, all DONE, marks the token (and applies their
effects) without reading the records back: a bolt's part. The answers are compact (a batch of new
ids answers `1:<n>`, and DUPLICATE and DEFERRED ids come back as counted runs, `LeaseRun`).

The scripts are all or nothing, as Redis does not roll a script back: they check everything a
command could refuse before a write that could leave a batch half done, and an id whose record
field holds something else, or whose effects Redis would refuse, is REJECTED alone (its message
fails with the reason) while the rest of the batch is leased or settled. A server that refuses
writes (out of memory, a replica, a disk error, too few replicas) fails the whole call instead:
that is no message's fault, and nothing was written. The lease script advances its shard's
counter before writing any record, so a token is never handed out by two calls.

Fencing tokens are `epoch * 2**40 + counter`: each shard has its own counter, in its fence hash
`{<tag>}:fence` beside the epoch it belongs to (so no one key takes every lease of a cluster), and
epochs come from an `EpochSource` (ZooKeeper: `dedup.epoch.ZkEpoch`), one per namespace. Tokens
strictly increase per shard from call to call, so per id, which is what fencing compares. When the
lease script finds a shard's fence missing (Redis lost its data, or the shard is new), or its
counter used up, the store takes a fresh epoch from the source and moves that fence to it; a fence
only ever moves to a higher epoch, so tokens stay strictly increasing across clients and across a
Redis data loss. A store always installs an epoch it just took (never the source's current one):
that one may have been installed before and lost with the data, and installing it again would
restart its counter. A loss that keeps the fence but drops recent writes (the last second of an
`appendfsync everysec` file on a machine crash, a failover to a lagging replica) is not detected:
tokens from the lost window can be handed out again.
`dedup.server_checks.server_durability_warnings` names the settings that make losses likely.

Effects atomic with DONE run in the settle script, checked first against the allowlist
(`dedup.effects`); on a cluster an effect key carries its record's hash tag (`effect_key`).

Replicas: with `wait_replicas` (and `wait_aof`), the script calls to a node are followed, on the
same connection and in the same round trip, by `WAIT` (or `WAITAOF`, Redis >= 7.2: `dedup.wire`).
A settle that fewer replicas acknowledged in time raises `NotDurable` (its writes stay on the
primary; the caller must not ack), and a lease's DUPLICATE answers become DEFERRED (a DONE
record on the primary alone is not yet a reason to ack). The lease script always writes (it
reserves counters), so its WAIT covers every DONE record it read. WAIT is not strong
consistency: a failover may still promote a replica that did not acknowledge, and a write that
timed out is not undone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from itertools import groupby
from typing import Generic, Protocol, TypeVar

from redis.cluster import RedisCluster
from redis.typing import EncodableT

from dedup.effects import CallEffects, CheckedEffect, FieldGroup, MergedWrite, Sum, check_effect
from dedup.errors import EffectNotAllowed, EpochConflict, NotDurable
from dedup.records import (
    SETTLED,
    IdRecord,
    IdRecordState,
    Lease,
    LeaseRun,
    LeaseStatus,
    Settlement,
    SettleResult,
    decode_lease_runs,
    decode_settle_results,
    expand,
    remap_runs,
)
from dedup.scripts import (
    ADVANCE_EPOCH,
    BUCKETS,
    LEASE,
    MARKS,
    SETTLE,
    LeaseScriptStatus,
    fence_key,
)
from dedup.shards import ShardTags
from dedup.wire import Answer, Call, Client, ScriptRunner, SentCalls

COUNTER_BITS = 40  # the counter part of a token; the lease script asks for a new epoch at 2**40
MAX_ERROR_CHARS = 1000  # error text kept in a FAILED record: enough to diagnose, bounded memory
EPOCH_ROUNDS = 5  # epoch changes one lease may go through before it gives up (each moves forward)

T = TypeVar("T")


class Sent(Generic[T]):
    """A store call written to Redis: `result()` reads its answer (once; Redis runs the call
    meanwhile), and whoever drops it unread calls `discard()`, which frees its connections."""

    __slots__ = ("_calls", "_finish")

    def __init__(self, calls: SentCalls, finish: Callable[[list[Answer]], T]) -> None:
        self._calls = calls
        self._finish = finish

    def result(self) -> T:
        return self._finish(self._calls.answers())

    def discard(self) -> None:
        self._calls.discard()


class EpochSource(Protocol):
    """Where fencing epochs come from; `dedup.epoch.ZkEpoch` keeps them in ZooKeeper."""

    def current(self) -> int:
        """The latest epoch handed out (0 if none was)."""
        ...

    def bump(self, seen: int) -> int:
        """A fresh epoch, greater than `seen` and than every epoch handed out before."""
        ...


Shards = list[tuple[str, list[int] | None]]  # (tag, positions in the call; None: all, in order)


class IdempotencyStore:
    """Leases and settlements of message ids in one Redis namespace, one round trip per batch
    and node.

    `client` is a `redis.Redis` (one server: one shard) or a `redis.cluster.RedisCluster` (one
    shard per Kafka partition; see the module docstring). Calls take each id's partition
    (`partitions`: one for all, or one per id); ids of several shards are split per shard and
    the calls to one node pipelined. No I/O happens here before the first call; the scripts
    load on first use (EVALSHA, then SCRIPT LOAD on a node that does not know them). Redis
    errors (connection, timeout) propagate as redis-py raised them. Safe to share between
    threads.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str,
        lease_ms: int,
        done_ttl_ms: int,
        epoch_source: EpochSource,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        wait_aof: bool = False,
    ) -> None:
        if not namespace or "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace {namespace!r} must be non-empty, without braces")
        if lease_ms <= 0 or done_ttl_ms <= 0:
            raise ValueError(f"lease_ms ({lease_ms}) and done_ttl_ms ({done_ttl_ms}) must be > 0")
        if wait_replicas < 0 or wait_timeout_ms <= 0:  # WAIT's timeout 0 would block for ever
            raise ValueError(
                f"wait_replicas ({wait_replicas}) must be >= 0, wait_timeout_ms "
                f"({wait_timeout_ms}) > 0"
            )
        self.namespace = namespace
        self.lease_ms = lease_ms
        self.done_ttl_ms = done_ttl_ms
        self.keep_ms = lease_ms + done_ttl_ms  # every record, after its last write
        # a new shard's bucket width: a lookup reads two buckets, and records are kept 1x to 2x
        # `keep_ms` (narrower buckets keep less but cost a lookup more per id)
        self.bucket_ms = self.keep_ms
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.wait_aof = wait_aof
        self._client = client
        self._runner = ScriptRunner(
            client,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            wait_aof=wait_aof,
        )
        # On a cluster, each partition's hash tag (`dedup.shards`); None on one server.
        self._shard_tags = (
            ShardTags(client, self._runner, namespace) if isinstance(client, RedisCluster) else None
        )
        self._source = epoch_source
        self._epochs: dict[str, int] = {}  # per shard tag: its fence's epoch as last seen

    @property
    def sharded(self) -> bool:
        """Whether records are sharded per partition (a Redis Cluster)."""
        return self._shard_tags is not None

    @property
    def epoch(self) -> int | None:
        """The highest epoch this store's tokens carry now (None before the first lease)."""
        return max(self._epochs.values(), default=None)

    def tag(self, partition: int = 0) -> str:
        """The hash tag of the shard that keeps `partition`'s records (without the braces); on a
        cluster, a partition's first use reads (or chooses) it in one round trip."""
        return self._shard_tags[partition] if self._shard_tags is not None else self.namespace

    def effect_key(self, name: str, partition: int = 0) -> str:
        """`name` under the hash tag of `partition`'s records: a key effects can write in the
        same script as those records' DONE, on one server or a cluster."""
        return f"{{{self.tag(partition)}}}:{name}"

    def effect_tag(self, partition: int = 0) -> str | None:
        """The hash tag effect keys of `partition`'s records must carry (None: any key)."""
        return self.tag(partition) if self.sharded else None

    # -- leases ---------------------------------------------------------------------------------

    def lease(
        self, ids: Sequence[str], owner: str, partitions: int | Sequence[int] = 0
    ) -> list[Lease]:
        """Lease `ids` for `owner`: one `Lease` per id, in the same order (`lease_runs`)."""
        return expand(self.lease_runs(ids, owner, partitions))

    def lease_runs(
        self, ids: Sequence[str], owner: str, partitions: int | Sequence[int] = 0
    ) -> list[LeaseRun]:
        """Lease `ids` for `owner`, one script call per shard; the answers as counted runs of
        consecutive ids, in order.

        An epoch change (Redis lost data, or another client moved the fence) costs extra round
        trips, once. With `wait_replicas`/`wait_aof`, DUPLICATE answers become DEFERRED when
        the acknowledgements fell short.
        """
        return self.send_lease(ids, owner, partitions).result()

    def send_lease(
        self, ids: Sequence[str], owner: str, partitions: int | Sequence[int] = 0
    ) -> Sent[list[LeaseRun]]:
        """`lease_runs`, written to Redis now: `result()` reads its runs, so Redis leases while
        the caller works (an epoch change's extra round trips happen in `result()`)."""
        pending = self._shards(partitions, len(ids)) if ids else []
        calls = [self._lease_call(tag, ids, positions, owner) for tag, positions in pending]
        return Sent(self._runner.send(calls), partial(self._leased, ids, owner, pending, calls))

    def _leased(
        self,
        ids: Sequence[str],
        owner: str,
        pending: Shards,
        calls: list[Call],
        answers: list[Answer],
    ) -> list[LeaseRun]:
        """The runs of a lease from its calls' answers; shards whose fence's epoch changed are
        leased again, at most `EPOCH_ROUNDS` rounds in all."""
        runs: list[LeaseRun] = []
        for rounds in range(EPOCH_ROUNDS):
            if rounds:  # the first round's answers came with the call
                calls = [self._lease_call(tag, ids, positions, owner) for tag, positions in pending]
                answers = self._runner.run(calls)
            retry: Shards = []
            for (tag, positions), call, (reply, short) in zip(pending, calls, answers, strict=True):
                status, base, codes, reasons, *read_only = reply
                epoch = int(call.args[0])
                if status == LeaseScriptStatus.LEASED:
                    found = decode_lease_runs((epoch << COUNTER_BITS) + base, codes, reasons)
                    if short is not None or (read_only and self._runner.wanted):
                        found = self._not_yet_duplicates(found)
                    runs += found if positions is None else remap_runs(found, positions)
                    continue
                if status == LeaseScriptStatus.EPOCH_MISMATCH and base > epoch:
                    self._adopt(tag, base)  # another client moved the fence on: use its epoch
                else:
                    self._move_fence(tag, epoch)  # fence missing, older, or its counter used up
                retry.append((tag, positions))
            if not retry:
                runs.sort(key=_start)
                return runs
            pending = retry
        raise EpochConflict(
            self.namespace,
            self.epoch or 0,
            self._source.current(),
            f"the epoch changed {EPOCH_ROUNDS} times during one lease; is something resetting "
            "the fence key?",
        )

    def _lease_call(
        self, tag: str, ids: Sequence[str], positions: list[int] | None, owner: str
    ) -> Call:
        """The lease script's call for the ids at `positions` (None: all), all in shard `tag`."""
        epoch = self._epochs.get(tag)
        if epoch is None:
            epoch = self._epochs[tag] = self._source.current()
        chosen = ids if positions is None else [ids[p] for p in positions]
        args: list[EncodableT] = [epoch, owner, self.lease_ms, self.keep_ms, *chosen]
        return Call(LEASE, [fence_key(tag)], args)

    def _not_yet_duplicates(self, runs: list[LeaseRun]) -> list[LeaseRun]:
        """`runs` with DUPLICATE made DEFERRED: DONE on the primary alone (or not shown to be
        on the replicas) is no reason to ack yet."""
        wait = self.wait_timeout_ms
        return [
            run._replace(status=LeaseStatus.DEFERRED, retry_after_ms=wait)
            if run.status is LeaseStatus.DUPLICATE
            else run
            for run in runs
        ]

    def _move_fence(self, tag: str, seen: int) -> None:
        """Take a fresh epoch from the source and move the shard's fence to it; if another
        client moved it higher meanwhile, use that one."""
        fresh = self._source.bump(seen)
        move = Call(ADVANCE_EPOCH, [fence_key(tag)], [fresh, self.bucket_ms])
        [(fence, _)] = self._runner.run([move])
        if fence > fresh:
            self._adopt(tag, fence)
        else:
            self._epochs[tag] = fresh

    def _adopt(self, tag: str, fence: int) -> None:
        """Use the shard fence's epoch, after checking the source has handed it out."""
        source = self._source.current()
        if source < fence:
            raise EpochConflict(
                self.namespace,
                fence,
                source,
                "the source is behind Redis (it lost data, or another store of this namespace "
                "uses another source)",
            )
        self._epochs[tag] = fence

    # -- settlements ----------------------------------------------------------------------------

    def settle(
        self, items: Sequence[Settlement], partitions: int | Sequence[int] = 0
    ) -> list[SettleResult]:
        """Settle leased ids, one script call per shard; one result per item, in order.

        Items with effects (DONE only) run them in the same script, only if the token holds;
        increments several items make to one key are applied as one sum, and counters of
        distinct fields of one hash as one field group, and SETs, or SADDs or HSETs of one key, as
        one merged write (`CallEffects`).
        Effects are checked first: `EffectNotAllowed` before anything is sent (on a Redis
        Cluster, also for a key without its record's hash tag). With `wait_replicas`/
        `wait_aof`, `NotDurable` if the acknowledgements fell short.
        """
        return self.send_settle(items, partitions).result()

    def send_settle(
        self, items: Sequence[Settlement], partitions: int | Sequence[int] = 0
    ) -> Sent[list[SettleResult]]:
        """`settle`, written to Redis now (`EffectNotAllowed` before that): `result()` reads its
        results, or raises `NotDurable`, so Redis settles while the caller works."""
        shards = self._shards(partitions, len(items)) if items else []
        calls = [
            self._settle_call(tag, items if positions is None else [items[p] for p in positions])
            for tag, positions in shards
        ]
        return Sent(self._runner.send(calls), partial(self._settled, len(items), shards))

    def _settled(self, count: int, shards: Shards, answers: list[Answer]) -> list[SettleResult]:
        """The results of a settlement of `count` items from its calls' answers."""
        if len(shards) == 1:
            results = decode_settle_results(answers[0].reply, count)
        else:
            results = [SETTLED] * count
            for (_, positions), answer in zip(shards, answers, strict=True):
                assert positions is not None
                for position, result in zip(
                    positions, decode_settle_results(answer.reply, len(positions)), strict=True
                ):
                    results[position] = result
        short = next((answer.short for answer in answers if answer.short is not None), None)
        if short is not None:
            assert self._runner.wanted is not None
            command = "WAITAOF" if self.wait_aof else "WAIT"
            raise NotDurable(command, self._runner.wanted, short, results)
        return results

    def _settle_call(self, tag: str, items: Sequence[Settlement]) -> Call:
        """The settle script's call for `items`, all in shard `tag`; checks their effects."""
        ids, tokens, dones, _, effects, attempts = zip(*items, strict=True)
        keys: list[str | bytes] = [fence_key(tag)]
        # `<token hex>:<attempts>/<items>` per run of items with one lease (a batch is one run)
        leases = " ".join(
            f"{token:x}:{attempt}/{sum(1 for _ in run)}"
            for (token, attempt), run in groupby(zip(tokens, attempts, strict=True))
        )
        if all(dones) and not any(effects):
            return Call(SETTLE, keys, [self.keep_ms, leases, "D" * len(items), "", 0, 0, 0, *ids])
        required = tag if self.sharded else None
        checked: list[list[CheckedEffect]] = []
        for id, _, done, _, item_effects, _ in items:
            if item_effects and not done:
                raise EffectNotAllowed(id, item_effects[0], "effects apply only to DONE items")
            checked.append([check_effect(id, effect, required, tag) for effect in item_effects])
        combined = CallEffects(checked)  # once: sums, field groups and merged writes share it
        sums, groups, merged = combined.sums(), combined.groups(), combined.merged()
        every: list[Sum | FieldGroup | MergedWrite] = [*sums, *groups, *merged]
        combined_items = {position for found in every for position in found.positions}
        keys += [found.key for found in sums] + [group.key for group in groups]
        for merge in merged:
            keys += merge.keys
        combined_keys = len(keys)
        outcomes: list[str] = []
        shapes: list[str] = []
        stream: list[EncodableT] = [*ids]  # the ids; what is combined; per item, the rest
        for found in sums:
            stream += [found.code, found.field, found.total, *_increments(found)]
        for group in groups:
            stream += [len(group.fields), *group.fields, *_increments(group)]
        for merge in merged:
            stream += _merged(merge)
        for position, (item, item_checked) in enumerate(zip(items, checked, strict=True)):
            if not item.done:
                outcomes.append("F")
                stream.append((item.error or "")[:MAX_ERROR_CHARS])
            else:
                outcomes.append("D")
                if position not in combined_items:
                    for code, key, rest in item_checked:
                        shapes.append(f"{code}{len(rest)}")
                        keys.append(key)
                        stream += rest
            shapes.append(",")
        # no shapes when every effect is combined: each item reads as one without any
        effect_shapes = "".join(shapes) if len(keys) > combined_keys else ""
        args = [
            self.keep_ms,
            leases,
            "".join(outcomes),
            effect_shapes,
            len(sums),
            len(groups),
            len(merged),
            *stream,
        ]
        return Call(SETTLE, keys, args)

    # -- inspection -----------------------------------------------------------------------------

    def record(self, id: str, partition: int = 0) -> IdRecord | None:
        """`id`'s record as it is now, or None if there is none."""
        found = self._find(id, partition)
        if found is None:
            return None
        record = IdRecord.decode(_as_bytes(found[1]))
        if record.state is IdRecordState.IN_FLIGHT and self._client.exists(
            self.mark_key(record.token, partition)
        ):
            return IdRecord(IdRecordState.DONE, record.token, record.attempts)  # settled whole
        return record

    def record_bucket(self, id: str, partition: int = 0) -> str | None:
        """The key of the bucket (a hash) that holds `id`'s record as a field, or None if no
        bucket does (`dedup/lua/buckets.lua`)."""
        found = self._find(id, partition)
        return None if found is None else found[0]

    def bucket_key(self, k: int, partition: int = 0) -> str:
        """The key of bucket `k` of `partition`'s shard: the records written from k to k + 1
        bucket widths of Redis time."""
        return f"{{{self.tag(partition)}}}:{BUCKETS}{k}"

    def mark_key(self, token: int, partition: int = 0) -> str:
        """The key that marks the lease call of `token` settled DONE whole."""
        return f"{{{self.tag(partition)}}}:{MARKS}{token:x}"

    def _find(self, id: str, partition: int) -> tuple[str, bytes | str] | None:
        """The bucket holding `id`'s record and the record's value. Buckets are named by Redis's
        clock; this looks from one bucket past this machine's clock back to one before the oldest
        that can exist, so clocks that differ by less than a bucket's width find the same one."""
        width, keep = self._client.hmget(fence_key(self.tag(partition)), ["bucket", "keep"])
        if width is None:
            return None
        newest = int(time.time() * 1000) // int(width) + 1
        back = -(-max(int(keep or 0), self.keep_ms) // int(width)) + 2
        for k in range(newest, newest - back - 1, -1):
            bucket = self.bucket_key(k, partition)
            raw = self._client.hget(bucket, id)
            if raw is not None:
                return bucket, raw
        return None

    def still_holds(self, id: str, token: int, partition: int = 0) -> bool:
        """True while `token` holds `id`'s lease (IN_FLIGHT with this token): a sink outside
        Redis checks this before writing, so a zombie whose lease was superseded writes nothing.
        (The check and the write are not atomic; for that, use effects in `settle`.)"""
        record = self.record(id, partition)
        return (
            record is not None and record.state is IdRecordState.IN_FLIGHT and record.token == token
        )

    # -- shards ---------------------------------------------------------------------------------

    def _shards(self, partitions: int | Sequence[int], n: int) -> Shards:
        """The shards `n` ids of `partitions` (one for all, or one per id) live in."""
        if isinstance(partitions, int):
            return [(self.tag(partitions), None)]
        if len(partitions) != n:
            raise ValueError(f"{len(partitions)} partitions for {n} ids")
        if self._shard_tags is None or len(set(partitions)) == 1:
            return [(self.tag(partitions[0] if n else 0), None)]
        self._shard_tags.load(partitions)
        shards: dict[str, list[int]] = {}
        for position, partition in enumerate(partitions):
            shards.setdefault(self.tag(partition), []).append(position)
        return list(shards.items())


def _start(run: LeaseRun) -> int:
    return run.start


def _increments(found: Sum | FieldGroup) -> tuple[str, str]:
    """A sum's or field group's increments and its items' positions (from 1), as the settle
    script reads them: space-separated, in item order."""
    increments = " ".join(map(str, found.increments))
    return increments, _positions(found.positions)


def _merged(merge: MergedWrite) -> list[EncodableT]:
    """A merged write as the settle script reads it: its code, how many arguments, the items'
    arguments, then how many each item has and its position (from 1), space-separated."""
    args = [arg for item_args in merge.args for arg in item_args]
    counts = " ".join(str(len(item_args)) for item_args in merge.args)
    return [merge.code, len(args), *args, counts, _positions(merge.positions)]


def _positions(positions: list[int]) -> str:
    """Items' positions as the settle script reads them: from 1, space-separated."""
    return " ".join(str(position + 1) for position in positions)


def _as_bytes(raw: bytes | str) -> bytes:
    return raw if isinstance(raw, bytes) else raw.encode()

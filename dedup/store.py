"""The Redis side of the dedup bolt: one idempotency record per message id, moved by Lua scripts.

Records live in shards, one Redis hash tag each, so that every script call touches one Redis
Cluster slot. On one server there is one shard, the namespace: an id's record is the string
`{<namespace>}:r:<id>`. On a Redis Cluster (a `redis.cluster.RedisCluster` client) there is one
shard per Kafka partition, `{<namespace>:p<partition>}:r:<id>`, so the partitions' records spread
over the masters and a task's batch (one partition) is still one script call. An id's record is
then its partition's: the same id in two partitions is two messages to the store (keep a
message's partition stable, as Kafka's default partitioner does for a key).

States and transitions of a record:

* absent -> IN_FLIGHT(owner, lease deadline, token, attempts=1): `claim` of a new id;
* IN_FLIGHT -> IN_FLIGHT(attempts+1, new token): `claim` once the lease has ended (the holder
  died or hangs; its token is now stale);
* IN_FLIGHT -> IN_FLIGHT(same attempts, new token): `claim` by the lease's own owner, a renewal
  (a second claim of the same id within one call is DEFERRED instead, so a batch never fences
  itself);
* IN_FLIGHT -> DONE / FAILED: `settle` with the record's current token; both keep the attempt
  count, DONE atomically with the item's Redis effects, if any;
* FAILED -> IN_FLIGHT(attempts+1, new token): `claim` (an exception-failed message runs again);
* DONE: `claim` answers DUPLICATE (ack without running user code) until the key expires.

A live lease held by another owner answers DEFERRED (retry later, no attempt spent). Lease
deadlines come from Redis's clock (`TIME` inside the scripts), never from a client's.

Every record expires, so memory stays bounded: DONE and FAILED after `done_ttl_ms` (the dedup
window), IN_FLIGHT `lease_ms + done_ttl_ms` after its latest claim. That covers claims nobody
settles or claims again (their messages were skipped, reset past, or dead-lettered by timeout).
An IN_FLIGHT record that expires makes its id's next claim a new one (attempt 1, a higher
token), which is safe: the record outlives its lease, so every holder's deadline has passed
and a claim would take the id over anyway, and the message is not DONE (a DONE record would
have replaced it). Keeping it a whole window past the lease lets a late holder whose lease ran
out still settle DONE if nobody claimed the id since, as long as a DONE record would be kept.

Per id, a claim of a new id is one Redis command (`SET NX GET`) and a settle one more (`SET
GET`: write, then compare what was there, and undo the rare write that was refused); the
answers are compact (a batch of new ids answers `1:<n>`, and DUPLICATE and DEFERRED ids come
back as counted runs, `ClaimRun`).

The scripts are all or nothing, as Redis does not roll a script back: they check everything a
command could refuse before a write that could leave a batch half done, and an id whose record
key or effects Redis would refuse is REJECTED alone (its message fails with the reason) while
the rest of the batch is claimed or settled. A server that refuses writes (out of memory, a
replica, a disk error, too few replicas) fails the whole call instead: that is no message's
fault, and nothing was written. The claim script reserves one counter per id before
writing any record, so a token is never handed out twice.

Fencing tokens are `epoch * 2**40 + counter`: each shard has its own counter, in its fence hash
`{<tag>}:fence` beside the epoch it belongs to (so no one key takes every claim of a cluster),
and epochs come from an `EpochSource` (ZooKeeper: `dedup.epoch.ZkEpoch`), one per namespace.
Tokens strictly increase per shard, so per id, which is what fencing compares. When the claim
script finds a shard's fence missing (Redis lost its data, or the shard is new), or its counter
used up, the store takes a fresh epoch from the source and moves that fence to it; a fence only
ever moves to a higher epoch, so tokens stay strictly increasing across clients and across a
Redis data loss. A store always installs an epoch it just took (never the source's current
one): that one may have been installed before and lost with the data, and installing it again
would restart its counter. A loss that keeps the fence but drops recent writes (the last second
of an `appendfsync everysec` file on a machine crash, a failover to a lagging replica) is not
detected: tokens from the lost window can be handed out again. `server_durability_warnings`
names the settings that make losses likely.

Effects atomic with DONE run in the settle script, so on a cluster their keys must be in the
record's slot: the rule is that an effect key carries its record's hash tag (`effect_key(name,
partition)` makes one, e.g. `{orders:p3}:revenue`); other keys are refused with
`EffectNotAllowed` before anything is sent. On one server any key is allowed.

Replicas: with `wait_replicas` (and `wait_aof`), the script calls to a node are followed, on the
same connection and in the same round trip, by `WAIT` (or `WAITAOF`, Redis >= 7.2). A settle that
fewer replicas acknowledged in time raises `NotDurable` (its writes stay on the primary; the
caller must not ack), and a claim's DUPLICATE answers become DEFERRED (a DONE record on the
primary alone is not yet a reason to ack). The claim script always writes (it reserves
counters), so its WAIT covers every DONE record it read. WAIT is not strong consistency: a
failover may still promote a replica that did not acknowledge, and a write that timed out is
not undone.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from hashlib import sha1
from importlib.resources import files
from itertools import chain, islice, repeat
from typing import Any, NamedTuple, Protocol

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT

COUNTER_BITS = 40  # the counter part of a token; the claim script asks for a new epoch at 2**40
MAX_EFFECT_ARGS = 1000  # arguments of one effect; settle.lua's MAX_ARGS (Lua's unpack)
INT64 = range(-(2**63), 2**63)  # increments Redis accepts
MAX_ERROR_CHARS = 1000  # error text kept in a FAILED record: enough to diagnose, bounded memory
EPOCH_ROUNDS = 5  # epoch changes one claim may go through before it gives up (each moves forward)

Client = redis.Redis | RedisCluster


class _Script(NamedTuple):
    """A Lua script and its SHA1, the name EVALSHA runs it by."""

    text: str
    sha: str


def _script(name: str) -> _Script:
    """The script `dedup/lua/<name>`."""
    text = files("dedup").joinpath("lua", name).read_text(encoding="utf-8")
    return _Script(text, sha1(text.encode()).hexdigest())


CLAIM = _script("claim.lua")
ADVANCE_EPOCH = _script("advance_epoch.lua")
SETTLE = _script("settle.lua")

# -- errors ------------------------------------------------------------------------------------


class DedupError(Exception):
    """Root of every error raised by the dedup package."""


class EffectNotAllowed(DedupError, ValueError):
    """A settle item carries an effect outside the allowlist or with malformed arguments: fix the
    caller; nothing was sent to Redis."""

    def __init__(self, id: str, effect: object, reason: str) -> None:
        self.id = id
        self.effect = effect
        self.reason = reason
        super().__init__(f"message {id!r}: effect {effect!r} is not allowed: {reason}")


class EpochConflict(DedupError):
    """The fencing epochs in Redis and in the epoch source disagree in a way that could repeat a
    token: never retried. Either the source lost data or two stores share a namespace with
    different epoch sources; move the source's epoch to at least `fence_epoch` and restart."""

    def __init__(self, namespace: str, fence_epoch: int, source_epoch: int, detail: str) -> None:
        self.namespace = namespace
        self.fence_epoch = fence_epoch
        self.source_epoch = source_epoch
        super().__init__(
            f"namespace {namespace!r}: Redis fence is at epoch {fence_epoch}, the epoch source "
            f"at {source_epoch}: {detail}"
        )


class NotDurable(DedupError):
    """Fewer replicas (or append-only files) than asked acknowledged a settlement within the
    timeout. Its writes are on the primary but may be lost in a failover, so the caller must
    not ack its messages: offering them again is safe (a DONE record that survives makes the
    replay a DUPLICATE; one that was lost lets it run again). `results` are the settle's
    per-item results as the primary saw them."""

    def __init__(
        self,
        command: str,
        wanted: tuple[int, ...],
        acked: tuple[int, ...],
        results: list[SettleResult],
    ) -> None:
        self.command = command  # WAIT (replicas) or WAITAOF (local fsync, replicas' fsync)
        self.wanted = wanted
        self.acked = acked
        self.results = results
        what = "replicas" if command == "WAIT" else "local fsync, replicas"
        super().__init__(
            f"{command} ({what}): {_counts(acked)} of {_counts(wanted)} acknowledged the "
            "settlement in time, so a failover may lose it; its messages are offered again"
        )


def _counts(counts: tuple[int, ...]) -> str:
    return ", ".join(map(str, counts))


class WaitAofUnsupported(DedupError):
    """`wait_aof` is on but the Redis server has no WAITAOF (it came with Redis 7.2): upgrade
    the server, or set `[dedup] wait_aof = false` to wait for replicas only (WAIT)."""

    def __init__(self, server: str) -> None:
        self.server = server
        super().__init__(
            f"[dedup] wait_aof needs WAITAOF (Redis >= 7.2); the server runs Redis {server}: "
            "upgrade it, or set wait_aof = false"
        )


# -- types -------------------------------------------------------------------------------------


class EpochSource(Protocol):
    """Where fencing epochs come from; `dedup.epoch.ZkEpoch` keeps them in ZooKeeper."""

    def current(self) -> int:
        """The latest epoch handed out (0 if none was)."""
        ...

    def bump(self, seen: int) -> int:
        """A fresh epoch, greater than `seen` and than every epoch handed out before."""
        ...


class ClaimStatus(enum.Enum):
    CLAIMED = "claimed"  # run the user code with `token`; settle it afterwards
    DUPLICATE = "duplicate"  # already DONE: ack without running user code
    # a live lease elsewhere, or DONE but not yet acknowledged by the replicas asked for: retry
    # after `retry_after_ms`, no attempt spent
    DEFERRED = "deferred"
    REJECTED = "rejected"  # the id's key holds something else: nothing changed, see `error`


class Claim(NamedTuple):
    """One id's answer to `claim`; `token` and `attempts` are 0 unless CLAIMED."""

    status: ClaimStatus
    token: int
    attempts: int
    retry_after_ms: int  # DEFERRED: when the other owner's lease ends, else 0
    error: str | None = None  # REJECTED: why


class ClaimRun(NamedTuple):
    """Consecutive ids of one `claim_runs` call with one answer, counted: a batch of new ids is
    one run, and DUPLICATE and DEFERRED replays cost no object per id."""

    status: ClaimStatus
    start: int  # the position of the run's first id in the call's ids
    length: int  # how many ids
    token: int  # CLAIMED: the first id's token; the k-th id of the run (from 0) has token + k
    attempts: int  # CLAIMED: the attempt all the run's ids are at
    retry_after_ms: int  # DEFERRED: when the last of the run's other leases ends, else 0
    errors: tuple[str, ...] = ()  # REJECTED: why, one per id


def expand(runs: Sequence[ClaimRun]) -> list[Claim]:
    """One `Claim` per id of the runs, in order (the runs cover positions 0..n-1)."""
    out: list[Claim] = []
    for status, _, length, token, attempts, retry, errors in runs:
        if status is _CLAIMED:
            tokens = range(token, token + length)
            rows = zip(repeat(_CLAIMED), tokens, repeat(attempts), repeat(0), repeat(None))
            out += map(_new_tuple, repeat(Claim), rows)
        elif status is _DUP:
            out += repeat(_DUPLICATE, length)
        elif status is _DEFERRED:
            out += repeat(Claim(_DEFERRED, 0, 0, retry), length)
        else:
            out += (Claim(status, 0, 0, 0, error) for error in errors)
    return out


class SettleStatus(enum.Enum):
    SETTLED = "settled"  # the record is now DONE (effects applied) or FAILED
    STALE = "stale"  # another claim holds the record, or it was already settled: nothing changed
    LOST = "lost"  # no record (expired, or Redis lost it): nothing changed
    # an effect would fail in Redis (none applied, record FAILED with why), or the record's key
    # holds another type (nothing changed)
    REJECTED = "rejected"


class SettleResult(NamedTuple):
    """One item's answer to `settle`."""

    status: SettleStatus
    error: str | None = None  # REJECTED: why


Effect = Sequence[str | bytes | int | float]
"""A Redis write command, e.g. `("HINCRBY", key, field, 1)`; see `ALLOWED_EFFECTS`."""


class Settlement(NamedTuple):
    """How one claimed id ended: DONE (`done=True`, with optional `effects`) or FAILED (`error`).

    `attempts` is what the claim answered with `token`: with it, settling takes one Redis
    command per id; 0 (unknown) costs a second one."""

    id: str
    token: int
    done: bool
    error: str | None = None
    effects: Sequence[Effect] = ()
    attempts: int = 0


class RecordState(enum.Enum):
    IN_FLIGHT = "I"
    DONE = "D"
    FAILED = "F"


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded idempotency record, for inspection; owner and lease only while IN_FLIGHT."""

    state: RecordState
    token: int
    attempts: int
    owner: str | None = None
    lease_deadline_ms: int | None = None
    error: str | None = None

    @classmethod
    def decode(cls, raw: bytes) -> Record:
        state = RecordState(raw[:1].decode())
        if state is RecordState.IN_FLIGHT:
            token, attempts, deadline, owner = raw[2:].split(b":", 3)
            return cls(state, int(token, 16), int(attempts), owner.decode(), int(deadline))
        if state is RecordState.DONE:
            token, attempts = raw[2:].split(b":")
            return cls(state, int(token, 16), int(attempts))
        token, attempts, error = raw[2:].split(b":", 2)
        return cls(state, int(token, 16), int(attempts), error=error.decode())


class _EffectSpec(NamedTuple):
    code: str  # the command's letter in settle.lua's effect shapes
    low: int  # fewest arguments after the key
    high: int | None  # most arguments after the key (None: no limit)
    integers: tuple[int, ...]  # positions of arguments that must be ints
    pairs: bool  # arguments come in pairs


ALLOWED_EFFECTS: dict[str, _EffectSpec] = {
    "SET": _EffectSpec("S", 1, 1, (), False),  # SET key value
    "INCRBY": _EffectSpec("I", 1, 1, (0,), False),  # INCRBY key increment
    "HINCRBY": _EffectSpec("H", 2, 2, (1,), False),  # HINCRBY key field increment
    "SADD": _EffectSpec("A", 1, None, (), False),  # SADD key member [member ...]
    "HSET": _EffectSpec("T", 2, None, (), True),  # HSET key field value [field value ...]
}
_ALLOWED_TEXT = (
    "SET key value, INCRBY key n, HINCRBY key field n, SADD key member..., HSET key field value..."
)


def hash_tag(key: str | bytes) -> bytes | None:
    """The part of `key` Redis Cluster hashes to pick its slot (between the first `{` and the
    next `}`, if not empty), or None if it has none and the whole key is hashed."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    end = raw.find(b"}", start + 1)
    if start < 0 or end <= start + 1:
        return None
    return raw[start + 1 : end]


def check_effect(
    id: str, effect: Effect, tag: str | None = None
) -> tuple[str, str | bytes, list[str | bytes | int | float]]:
    """`(code, key, args)` of an allowed effect (code: its letter in settle.lua), or
    `EffectNotAllowed` saying what is wrong. With `tag` (a Redis Cluster), the effect key must
    carry that hash tag, its record's, to be in the record's slot."""
    if isinstance(effect, str | bytes) or len(effect) < 2:
        raise EffectNotAllowed(
            id, effect, f"give (command, key, args...); allowed: {_ALLOWED_TEXT}"
        )
    command, key, *args = effect
    name = command.upper() if isinstance(command, str) else ""
    spec = ALLOWED_EFFECTS.get(name)
    if spec is None:
        raise EffectNotAllowed(id, effect, f"allowed commands: {_ALLOWED_TEXT}")
    code, low, high, integers, pairs = spec
    if len(args) < low or (high is not None and len(args) > high) or (pairs and len(args) % 2):
        raise EffectNotAllowed(id, effect, f"wrong number of arguments; allowed: {_ALLOWED_TEXT}")
    if len(args) > MAX_EFFECT_ARGS:
        raise EffectNotAllowed(id, effect, f"more than {MAX_EFFECT_ARGS} arguments: split it")
    if not isinstance(key, str | bytes):
        raise EffectNotAllowed(id, effect, "the key must be str or bytes")
    for position, arg in enumerate(args):
        if isinstance(arg, bool) or not isinstance(arg, str | bytes | int | float):
            raise EffectNotAllowed(id, effect, f"argument {arg!r} is not str, bytes, int or float")
        if position in integers and (not isinstance(arg, int) or arg not in INT64):
            raise EffectNotAllowed(id, effect, f"the increment {arg!r} must be a 64-bit int")
    if tag is not None and hash_tag(key) != tag.encode():
        raise EffectNotAllowed(
            id,
            effect,
            f"on a Redis Cluster an effect key must carry its record's hash tag {{{tag}}}, so "
            f"that it is written atomically with the record (Effects.key(name) makes one, "
            f"e.g. {{{tag}}}:{_text(key)})",
        )
    return code, key, args


_RESULT_BY_DIGIT = {ord(str(i)): SettleResult(status) for i, status in enumerate(SettleStatus)}
_REJECTED_DIGIT = ord("3")
_SETTLED = SettleResult(SettleStatus.SETTLED)
_DUPLICATE = Claim(ClaimStatus.DUPLICATE, 0, 0, 0, None)
_CLAIMED = ClaimStatus.CLAIMED
_DEFERRED = ClaimStatus.DEFERRED
_DUP = ClaimStatus.DUPLICATE
_REJECTED = ClaimStatus.REJECTED
# Claims are built with tuple.__new__, skipping the NamedTuple's Python-level __new__ (decoding
# falls from about 0.6 to 0.15 us per id); same Claims
_new_tuple = tuple.__new__


# -- the store ---------------------------------------------------------------------------------


class _Call(NamedTuple):
    """One script call, on the shard of `keys[0]`."""

    script: _Script
    keys: list[str | bytes]
    args: list[EncodableT]


class _Answer(NamedTuple):
    """A script call's reply, and what the wait after it acknowledged if that fell short."""

    reply: Any
    short: tuple[int, ...] | None


Shards = list[tuple[str, list[int] | None]]  # (tag, positions in the call; None: all, in order)


class IdempotencyStore:
    """Claims and settlements of message ids in one Redis namespace, one round trip per batch
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
        self.claim_ttl_ms = lease_ms + done_ttl_ms  # IN_FLIGHT records: see the module docstring
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.wait_aof = wait_aof
        self.sharded = isinstance(client, RedisCluster)
        # the least acceptable reply of WAIT (replicas,) or WAITAOF (1, replicas) after each
        # node's script calls; None before the first (WAITAOF is checked then)
        self._wanted: tuple[int, ...] | None = None
        self._client = client
        self._source = epoch_source
        self._epochs: dict[str, int] = {}  # per shard tag: its fence's epoch as last seen

    @property
    def epoch(self) -> int | None:
        """The highest epoch this store's tokens carry now (None before the first claim)."""
        return max(self._epochs.values(), default=None)

    def tag(self, partition: int = 0) -> str:
        """The hash tag of the shard that keeps `partition`'s records (without the braces)."""
        return f"{self.namespace}:p{partition}" if self.sharded else self.namespace

    def key(self, id: str, partition: int = 0) -> str:
        """The Redis key of `id`'s record."""
        return f"{{{self.tag(partition)}}}:r:{id}"

    def effect_key(self, name: str, partition: int = 0) -> str:
        """`name` under the hash tag of `partition`'s records: a key effects can write in the
        same script as those records' DONE, on one server or a cluster."""
        return f"{{{self.tag(partition)}}}:{name}"

    def effect_tag(self, partition: int = 0) -> str | None:
        """The hash tag effect keys of `partition`'s records must carry (None: any key)."""
        return self.tag(partition) if self.sharded else None

    # -- claims ---------------------------------------------------------------------------------

    def claim(
        self, ids: Sequence[str], owner: str, partitions: int | Sequence[int] = 0
    ) -> list[Claim]:
        """Claim `ids` for `owner`: one `Claim` per id, in the same order (`claim_runs`)."""
        return expand(self.claim_runs(ids, owner, partitions))

    def claim_runs(
        self, ids: Sequence[str], owner: str, partitions: int | Sequence[int] = 0
    ) -> list[ClaimRun]:
        """Claim `ids` for `owner`, one script call per shard; the answers as counted runs of
        consecutive ids, in order.

        An epoch change (Redis lost data, or another client moved the fence) costs extra round
        trips, once. With `wait_replicas`/`wait_aof`, DUPLICATE answers become DEFERRED when
        the acknowledgements fell short.
        """
        if not ids:
            return []
        pending = self._shards(partitions, len(ids))
        runs: list[ClaimRun] = []
        for _ in range(EPOCH_ROUNDS):
            calls = [self._claim_call(tag, ids, positions, owner) for tag, positions in pending]
            answers = self._execute(calls)
            retry: Shards = []
            for (tag, positions), call, (reply, short) in zip(pending, calls, answers, strict=True):
                status, base, codes, reasons, *read_only = reply
                epoch = int(call.args[0])
                if status == 0:
                    found = _claim_runs((epoch << COUNTER_BITS) + base, codes, reasons)
                    if short is not None or (read_only and self._wanted):
                        found = self._not_yet_duplicates(found)
                    runs += found if positions is None else _remap(found, positions)
                    continue
                if status == 2 and base > epoch:
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
            f"the epoch changed {EPOCH_ROUNDS} times during one claim; is something resetting "
            "the fence key?",
        )

    def _claim_call(
        self, tag: str, ids: Sequence[str], positions: list[int] | None, owner: str
    ) -> _Call:
        """The claim script's call for the ids at `positions` (None: all), all in shard `tag`."""
        epoch = self._epochs.get(tag)
        if epoch is None:
            epoch = self._epochs[tag] = self._source.current()
        prefix = f"{{{tag}}}:r:"
        chosen = ids if positions is None else [ids[p] for p in positions]
        keys: list[str | bytes] = [f"{{{tag}}}:fence", *[prefix + id for id in chosen]]
        return _Call(CLAIM, keys, [epoch, owner, self.lease_ms, self.claim_ttl_ms])

    def _not_yet_duplicates(self, runs: list[ClaimRun]) -> list[ClaimRun]:
        """`runs` with DUPLICATE made DEFERRED: DONE on the primary alone (or not shown to be
        on the replicas) is no reason to ack yet."""
        wait = self.wait_timeout_ms
        return [
            run._replace(status=_DEFERRED, retry_after_ms=wait) if run.status is _DUP else run
            for run in runs
        ]

    def _move_fence(self, tag: str, seen: int) -> None:
        """Take a fresh epoch from the source and move the shard's fence to it; if another
        client moved it higher meanwhile, use that one."""
        fresh = self._source.bump(seen)
        [(fence, _)] = self._execute([_Call(ADVANCE_EPOCH, [f"{{{tag}}}:fence"], [fresh])])
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
        """Settle claimed ids, one script call per shard; one result per item, in order.

        Items with effects (DONE only) run them in the same script, only if the token holds.
        Effects are checked first: `EffectNotAllowed` before anything is sent (on a Redis
        Cluster, also for a key without its record's hash tag). With `wait_replicas`/
        `wait_aof`, `NotDurable` if the acknowledgements fell short.
        """
        if not items:
            return []
        shards = self._shards(partitions, len(items))
        calls = [
            self._settle_call(tag, items if positions is None else [items[p] for p in positions])
            for tag, positions in shards
        ]
        answers = self._execute(calls)
        if len(shards) == 1:
            results = _settle_results(answers[0].reply, len(items))
        else:
            results = [_SETTLED] * len(items)
            for (_, positions), answer in zip(shards, answers, strict=True):
                assert positions is not None
                for position, result in zip(
                    positions, _settle_results(answer.reply, len(positions)), strict=True
                ):
                    results[position] = result
        short = next((answer.short for answer in answers if answer.short is not None), None)
        if short is not None:
            assert self._wanted is not None
            command = "WAITAOF" if self.wait_aof else "WAIT"
            raise NotDurable(command, self._wanted, short, results)
        return results

    def _settle_call(self, tag: str, items: Sequence[Settlement]) -> _Call:
        """The settle script's call for `items`, all in shard `tag`; checks their effects."""
        prefix = f"{{{tag}}}:r:"
        ids, tokens, dones, _, effects, attempts = zip(*items, strict=True)
        keys: list[str | bytes] = [prefix + id for id in ids]
        # `<token hex>:<attempts> ` per item: the script reads them with gmatch
        claims = (
            "%x:%d " * len(items) % tuple(chain.from_iterable(zip(tokens, attempts, strict=True)))
        )
        if all(dones) and not any(effects):
            return _Call(SETTLE, keys, [self.done_ttl_ms, claims, "D" * len(items), ""])
        required = tag if self.sharded else None
        outcomes: list[str] = []
        shapes: list[str] = []
        stream: list[EncodableT] = []  # per item: error text or effect arguments
        for id, _, done, error, item_effects, _ in items:
            if done:
                outcomes.append("D")
                for effect in item_effects:
                    code, key, rest = check_effect(id, effect, required)
                    shapes.append(f"{code}{len(rest)}")
                    keys.append(key)
                    stream += rest
            elif item_effects:
                raise EffectNotAllowed(id, item_effects[0], "effects apply only to DONE items")
            else:
                outcomes.append("F")
                stream.append((error or "")[:MAX_ERROR_CHARS])
            shapes.append(",")
        effect_shapes = "".join(shapes) if len(keys) > len(items) else ""
        args = [self.done_ttl_ms, claims, "".join(outcomes), effect_shapes, *stream]
        return _Call(SETTLE, keys, args)

    # -- inspection -----------------------------------------------------------------------------

    def record(self, id: str, partition: int = 0) -> Record | None:
        """`id`'s record as it is now, or None if there is none."""
        raw = self._client.get(self.key(id, partition))
        if raw is None:
            return None
        return Record.decode(raw if isinstance(raw, bytes) else raw.encode())

    def fence_ok(self, id: str, token: int, partition: int = 0) -> bool:
        """True while `token` holds `id`'s lease (IN_FLIGHT with this token): a sink outside
        Redis checks this before writing, so a zombie whose claim was superseded writes nothing.
        (The check and the write are not atomic; for that, use effects in `settle`.)"""
        raw = self._client.get(self.key(id, partition))
        if raw is None:
            return False
        head = f"I:{token:x}:"
        return (raw.decode() if isinstance(raw, bytes) else raw).startswith(head)

    # -- calls ----------------------------------------------------------------------------------

    def _shards(self, partitions: int | Sequence[int], n: int) -> Shards:
        """The shards `n` ids of `partitions` (one for all, or one per id) live in."""
        if isinstance(partitions, int):
            return [(self.tag(partitions), None)]
        if len(partitions) != n:
            raise ValueError(f"{len(partitions)} partitions for {n} ids")
        if not self.sharded or len(set(partitions)) == 1:
            return [(self.tag(partitions[0] if n else 0), None)]
        shards: dict[str, list[int]] = {}
        for position, partition in enumerate(partitions):
            shards.setdefault(self.tag(partition), []).append(position)
        return list(shards.items())

    def _execute(self, calls: Sequence[_Call]) -> list[_Answer]:
        """Run script calls, those to one node pipelined in one round trip (with the wait, if
        any, after them); the answers in the calls' order."""
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        for index, call in enumerate(calls):
            node = self._node(call.keys[0])
            by_node.setdefault(id(node), (node, []))[1].append(index)
        answers: list[_Answer] = [_Answer(None, None)] * len(calls)
        for node, indexes in by_node.values():
            replies, short = self._pipeline(node, [calls[i] for i in indexes])
            for index, reply in zip(indexes, replies, strict=True):
                answers[index] = _Answer(reply, short)
        return answers

    def _node(self, key: str | bytes) -> redis.Redis:
        """The client of the node serving `key`'s slot (on one server, the client itself)."""
        client = self._client
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return client.get_redis_connection(node)
        return client

    def _pipeline(
        self, node: redis.Redis, calls: Sequence[_Call]
    ) -> tuple[list[Any], tuple[int, ...] | None]:
        """Run `calls` on `node` in one round trip, then with `wait_replicas` or `wait_aof`
        WAIT (or WAITAOF) on the same connection. Returns the replies, and what was
        acknowledged if that fell short (else None). A call whose script the node does not
        know runs again, alone with the others that failed so, after SCRIPT LOAD.

        On a cluster, an error that may mean the cluster changed refreshes the client's map of
        it before the error propagates (`_refresh`).
        """
        waiting = bool(self.wait_replicas or self.wait_aof)
        wanted = (self._wanted or self._check_wait(node)) if waiting else ()
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(2):  # the second time after loading scripts
            commands: list[tuple[EncodableT, ...]] = []
            for index in pending:
                script, keys, args = calls[index]
                commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
            if self.wait_aof:
                commands.append(("WAITAOF", 1, self.wait_replicas, self.wait_timeout_ms))
            elif waiting:
                commands.append(("WAIT", self.wait_replicas, self.wait_timeout_ms))
            try:
                answers = _roundtrip(node, commands)
            except (redis.ConnectionError, redis.TimeoutError) as error:
                self._refresh(error)
                raise
            unknown = []
            for index, answer in zip(pending, answers, strict=False):
                if isinstance(answer, redis.exceptions.NoScriptError):
                    unknown.append(index)
                elif isinstance(answer, Exception):
                    self._refresh(answer)
                    raise answer
                else:
                    replies[index] = answer
            if not unknown:
                return replies, _short(answers[-1], wanted) if waiting else None
            for script in {calls[index].script for index in unknown}:
                node.script_load(script.text)
            pending = unknown
        raise redis.exceptions.NoScriptError("the dedup scripts did not load")

    def _refresh(self, error: Exception) -> None:
        """After an error that may mean the cluster changed (MOVED or ASK: a resharding; a node
        that does not answer: a failover may follow), reload the cluster's slot map, if it can
        be read now; the error propagates either way, and the caller's retry goes where the
        map says."""
        changed = (
            redis.exceptions.MovedError,
            redis.exceptions.AskError,
            redis.exceptions.ClusterDownError,
            redis.ConnectionError,
            redis.TimeoutError,
        )
        if isinstance(self._client, RedisCluster) and isinstance(error, changed):
            with contextlib.suppress(redis.RedisError):
                self._client.nodes_manager.initialize()

    def _check_wait(self, node: redis.Redis) -> tuple[int, ...]:
        """The least acceptable reply of the wait; `WaitAofUnsupported` if WAITAOF is asked for
        and the server does not have it."""
        if self.wait_aof:
            require_wait_aof(node)
            self._wanted = (1, self.wait_replicas)
        else:
            self._wanted = (self.wait_replicas,)
        return self._wanted


def _roundtrip(node: redis.Redis, commands: Sequence[tuple[EncodableT, ...]]) -> list[Any]:
    """Send `commands` to `node` in one write on one pooled connection and read every reply,
    an error reply as its exception. Like a redis-py pipeline, without its per-argument
    Python work (1,000 keys a call: ~0.3 us each), and retried the same way on a connection
    error (a stale pooled connection, a restarted server)."""
    pool = node.connection_pool
    connection = pool.get_connection()
    packed = [b"".join(map(_pack, commands))]

    def send_and_read() -> list[Any]:
        connection.send_packed_command(packed)  # type: ignore[no-untyped-call]
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(connection.read_response())
            except redis.exceptions.ResponseError as error:
                replies.append(error)
        return replies

    try:
        result: list[Any] = connection.retry.call_with_retry(
            send_and_read,
            lambda _: connection.disconnect(),  # type: ignore[no-untyped-call]
        )
        return result
    except BaseException:
        connection.disconnect()  # type: ignore[no-untyped-call]  # replies may be unread
        raise
    finally:
        pool.release(connection)


def _pack(command: tuple[EncodableT, ...]) -> bytes:
    """The RESP form of one command, made in C."""
    packed: bytes = hiredis.pack_command(command)  # type: ignore[arg-type]
    return packed


def _short(acked: object, wanted: tuple[int, ...]) -> tuple[int, ...] | None:
    """What a WAIT (an int) or WAITAOF (a list) acknowledged, if less than `wanted`."""
    if isinstance(acked, Exception):
        raise acked
    got = tuple(acked) if isinstance(acked, list) else (int(acked),)  # type: ignore[call-overload]
    return got if any(a < w for a, w in zip(got, wanted, strict=True)) else None


def _start(run: ClaimRun) -> int:
    return run.start


def _claim_runs(first: int, codes: bytes | str, reasons: Sequence[bytes | str]) -> list[ClaimRun]:
    """Decode the claim script's runs (`<code>:<count>` joined by ','); the k-th id of the call
    (from 0) has token first + k + 1 if CLAIMED; `reasons` are the REJECTED ids' errors."""
    text = codes.decode() if isinstance(codes, bytes) else codes
    errors = map(_decoded, reasons)
    runs: list[ClaimRun] = []
    start = 0
    for part in text.split(","):
        code, _, counted = part.partition(":")
        count = int(counted)
        if code == "r":
            runs.append(ClaimRun(_REJECTED, start, count, 0, 0, 0, tuple(islice(errors, count))))
        elif (value := int(code)) > 0:
            runs.append(ClaimRun(_CLAIMED, start, count, first + start + 1, value, 0))
        elif value == 0:
            runs.append(ClaimRun(_DUP, start, count, 0, 0, 0))
        else:
            runs.append(ClaimRun(_DEFERRED, start, count, 0, 0, -value))
        start += count
    return runs


def _remap(runs: Sequence[ClaimRun], positions: list[int]) -> list[ClaimRun]:
    """Runs over a shard's ids (the ids at `positions` of a call) as runs over the call's
    positions: a run is cut where the positions are not consecutive."""
    out: list[ClaimRun] = []
    for run in runs:
        k = 0
        while k < run.length:
            first = positions[run.start + k]
            j = k + 1
            while j < run.length and positions[run.start + j] == first + j - k:
                j += 1
            token = run.token + k if run.status is _CLAIMED else 0
            out.append(run._replace(start=first, length=j - k, token=token, errors=run.errors[k:j]))
            k = j
    return out


def _settle_results(reply: list[Any], n: int) -> list[SettleResult]:
    """Decode a settle script's reply for `n` items."""
    digits, reasons = reply
    raw = digits.encode() if isinstance(digits, str) else digits
    if not raw:
        return [_SETTLED] * n
    results = [_RESULT_BY_DIGIT[digit] for digit in raw]
    if reasons:
        errors = map(_text, reasons)
        results = [
            SettleResult(r.status, next(errors)) if d == _REJECTED_DIGIT else r
            for d, r in zip(raw, results, strict=True)
        ]
    return results


# -- server checks -----------------------------------------------------------------------------


def require_wait_aof(client: redis.Redis) -> None:
    """`WaitAofUnsupported` unless the server runs WAITAOF (Redis >= 7.2, not renamed or
    denied): tried with nothing to wait for."""
    try:
        client.waitaof(0, 0, 1)
    except redis.ResponseError as exc:
        version = client.info("server")["redis_version"]
        raise WaitAofUnsupported(f"{version}; WAITAOF answered: {exc}") from exc


def server_durability_warnings(client: redis.Redis) -> list[str]:
    """Warnings about server settings under which Redis could lose acknowledged records (a lost
    DONE record lets its message run again); empty if none apply.

    Checks `appendonly` (must be yes), `appendfsync` (`no` leaves flushing to the OS; `everysec`,
    the usual choice, can lose about one second of writes on a machine crash, not on a Redis
    crash) and `maxmemory-policy` (only `noeviction` is safe: DONE records have a TTL, so even
    the `volatile-*` policies may evict them). If CONFIG is disabled or denied, one warning says
    what to check by hand.
    """
    try:
        raw = client.config_get("appendonly", "appendfsync", "maxmemory-policy")
    except redis.ResponseError as exc:  # renamed/disabled command or ACL NOPERM
        return [
            f"cannot read the Redis configuration (CONFIG GET failed: {exc}); check by hand "
            "that the server runs with appendonly yes, appendfsync everysec or always, and "
            "maxmemory-policy noeviction"
        ]
    config = {_text(k): _text(v) for k, v in raw.items()}
    warnings = []
    if config.get("appendonly") != "yes":
        warnings.append(
            "appendonly is no: a Redis restart loses every record written since the last "
            "snapshot, so DONE messages run again, and a restart from a snapshot brings back "
            "an old token counter, so tokens can repeat; set appendonly yes (CONFIG SET "
            "appendonly yes, and in redis.conf)"
        )
    elif config.get("appendfsync") == "no":
        warnings.append(
            "appendfsync is no: the OS writes the append-only file when it likes (often 30 s), "
            "and a machine crash loses that much; set appendfsync everysec or always"
        )
    policy = config.get("maxmemory-policy")
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {policy}: at maxmemory Redis evicts keys; DONE and FAILED "
            "records carry a TTL, so even volatile-* policies evict DONE records and their "
            "messages run again (allkeys-* also evict claims in flight); set "
            "maxmemory-policy noeviction (writes then fail loudly when memory is full)"
        )
    return warnings


def _decoded(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)

"""The Redis side of the dedup bolt: one idempotency record per message id, moved by Lua scripts.

Each id has one record, a short string under `{<namespace>}:r:<id>` (the hash tag keeps a whole
namespace on one Redis Cluster slot, so a batch is one script call). States and transitions:

* absent -> IN_FLIGHT(owner, lease deadline, token, attempts=1): `claim` of a new id;
* IN_FLIGHT -> IN_FLIGHT(attempts+1, new token): `claim` once the lease has ended (the holder
  died or hangs; its token is now stale);
* IN_FLIGHT -> IN_FLIGHT(same attempts, new token): `claim` by the lease's own owner, a renewal
  (a second claim of the same id within one call is DEFERRED instead, so a batch never fences
  itself);
* IN_FLIGHT -> DONE / FAILED: `settle` with the record's current token; both keep the attempt
  count and expire after `done_ttl_ms`, DONE atomically with the item's Redis effects, if any;
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

The scripts are all or nothing, as Redis does not roll a script back: they check everything a
command could refuse before their first write, and an id whose record key or effects Redis
would refuse is REJECTED alone (its message fails with the reason) while the rest of the batch
is claimed or settled. The claim script reserves one counter per id before writing any record,
so a token is never handed out twice.

Fencing tokens are `epoch * 2**40 + counter`: the counter lives in the namespace's fence hash
`{<namespace>}:fence` beside the epoch it belongs to, and epochs come from an `EpochSource`
(ZooKeeper: `dedup.epoch.ZkEpoch`). When the claim script finds the fence missing (Redis lost
its data, or the namespace is new), or the counter used up, the store takes a fresh epoch from
the source and moves the fence to it; the fence only ever moves to a higher epoch, so tokens stay
strictly increasing across clients and across a Redis data loss. A store always installs an epoch
it just took (never the source's current one): that one may have been installed before and lost
with the data, and installing it again would restart its counter. A loss that keeps the fence
but drops recent writes (the last second of an `appendfsync everysec` file on a machine crash, a
failover to a lagging replica) is not detected: tokens from the lost window can be handed out
again. `server_durability_warnings` names the settings that make losses likely.

Replicas: with `wait_replicas` (and `wait_aof`), each script call is followed, on the same
connection and in the same round trip, by `WAIT` (or `WAITAOF`, Redis >= 7.2). A settle that
fewer replicas acknowledged in time raises `NotDurable` (its writes stay on the primary; the
caller must not ack), and a claim's DUPLICATE answers become DEFERRED (a DONE record on the
primary alone is not yet a reason to ack). The claim script always writes (it reserves
counters), so its WAIT covers every DONE record it read. WAIT is not strong consistency: a
failover may still promote a replica that did not acknowledge, and a write that timed out is
not undone.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import redis
from redis.commands.core import Script
from redis.typing import EncodableT

COUNTER_BITS = 40  # the counter part of a token; the claim script asks for a new epoch at 2**40
MAX_EFFECT_ARGS = 1000  # arguments of one effect; settle_effects.lua's MAX_ARGS (Lua's unpack)
INT64 = range(-(2**63), 2**63)  # increments Redis accepts
MAX_ERROR_CHARS = 1000  # error text kept in a FAILED record: enough to diagnose, bounded memory
EPOCH_ROUNDS = 5  # epoch changes one claim may go through before it gives up (each moves forward)


def _script(name: str) -> str:
    return files("dedup").joinpath("lua", name).read_text(encoding="utf-8")


CLAIM_LUA = _script("claim.lua")
ADVANCE_EPOCH_LUA = _script("advance_epoch.lua")
SETTLE_LUA = _script("settle.lua")
SETTLE_EFFECTS_LUA = _script("settle_effects.lua")


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
    """How one claimed id ended: DONE (`done=True`, with optional `effects`) or FAILED (`error`)."""

    id: str
    token: int
    done: bool
    error: str | None = None
    effects: Sequence[Effect] = ()


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
    code: str  # the command's letter in settle_effects.lua's shapes
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


def check_effect(
    id: str, effect: Effect
) -> tuple[str, str | bytes, list[str | bytes | int | float]]:
    """`(code, key, args)` of an allowed effect (code: its letter in settle_effects.lua), or
    `EffectNotAllowed` saying what is wrong."""
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
    return code, key, args


_RESULT_BY_DIGIT = {ord(str(i)): SettleResult(status) for i, status in enumerate(SettleStatus)}
_REJECTED_DIGIT = ord("3")
_DUPLICATE = Claim(ClaimStatus.DUPLICATE, 0, 0, 0, None)
_CLAIMED = ClaimStatus.CLAIMED
_DEFERRED = ClaimStatus.DEFERRED
# Claims are built with tuple.__new__, skipping the NamedTuple's Python-level __new__ (with the
# all-new fast path in _claims, decoding falls from about 0.6 to 0.15 us per id); same Claims
_new_tuple = tuple.__new__


# -- the store ---------------------------------------------------------------------------------


class IdempotencyStore:
    """Claims and settlements of message ids in one Redis namespace, one round trip per batch.

    No I/O happens here before the first call; the scripts load on first use (EVALSHA, then
    SCRIPT LOAD once if the server does not know them). Redis errors (connection, timeout)
    propagate as redis-py raised them. Safe to share between threads.
    """

    def __init__(
        self,
        client: redis.Redis,
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
        # the least acceptable reply of WAIT (replicas,) or WAITAOF (1, replicas) after each
        # script call; None before the first (WAITAOF is checked then)
        self._wanted: tuple[int, ...] | None = None
        self._client = client
        self._source = epoch_source
        self._prefix = f"{{{namespace}}}:r:"
        self._fence = f"{{{namespace}}}:fence".encode()
        self._claim = client.register_script(CLAIM_LUA)
        self._advance = client.register_script(ADVANCE_EPOCH_LUA)
        self._settle = client.register_script(SETTLE_LUA)
        self._settle_effects = client.register_script(SETTLE_EFFECTS_LUA)
        self._epoch: int | None = None  # the fence's epoch as this store last saw it

    @property
    def epoch(self) -> int | None:
        """The epoch this store's tokens carry now (None before the first claim)."""
        return self._epoch

    def key(self, id: str) -> str:
        """The Redis key of `id`'s record."""
        return self._prefix + id

    def claim(self, ids: Sequence[str], owner: str) -> list[Claim]:
        """Claim `ids` for `owner` in one script call; one `Claim` per id, in the same order.

        An epoch change (Redis lost data, or another client moved the fence) costs extra round
        trips, once. With `wait_replicas`/`wait_aof`, DUPLICATE answers become DEFERRED when
        the acknowledgements fell short.
        """
        if not ids:
            return []
        prefix = self._prefix
        # bytes keys: redis-py packs them without its per-argument encoding step
        keys = [self._fence, *[(prefix + id).encode() for id in ids]]
        for _ in range(EPOCH_ROUNDS):
            epoch = self._epoch
            if epoch is None:
                epoch = self._epoch = self._source.current()
            args = (epoch, owner, self.lease_ms, self.claim_ttl_ms)
            reply, acked = self._call(self._claim, keys, args)
            status, base, codes, reasons, *read_only = reply
            if status == 0:
                claims = self._claims((epoch << COUNTER_BITS) + base, codes, reasons, len(ids))
                if acked is not None or (read_only and self._wanted):
                    # DONE on the primary alone (or not shown otherwise): no reason to ack yet
                    retry = self.wait_timeout_ms
                    claims = [
                        Claim(_DEFERRED, 0, 0, retry) if c.status is ClaimStatus.DUPLICATE else c
                        for c in claims
                    ]
                return claims
            if status == 2 and base > epoch:
                self._adopt(base)  # another client moved the fence on: use its epoch
            else:
                self._move_fence(epoch)  # fence missing, older, or its counter used up
        raise EpochConflict(
            self.namespace,
            self._epoch or 0,
            self._source.current(),
            f"the epoch changed {EPOCH_ROUNDS} times during one claim; is something resetting "
            "the fence key?",
        )

    @staticmethod
    def _claims(
        first: int, codes: bytes | str, reasons: Sequence[bytes | str], n: int
    ) -> list[Claim]:
        """Decode the claim script's codes for `n` ids; the k-th id (from 1) has token first+k
        if CLAIMED; `reasons` are the REJECTED ids' errors, in order."""
        raw = codes.encode() if isinstance(codes, str) else codes
        tokens = range(first + 1, first + n + 1)
        if raw == b"1," * (n - 1) + b"1":
            # the common case, all n ids new (each CLAIMED at attempt 1): one Claim per token
            rows = zip(repeat(_CLAIMED), tokens, repeat(1), repeat(0), repeat(None), strict=False)
            return list(map(_new_tuple, repeat(Claim), rows))
        out: list[Claim] = []
        append = out.append
        errors = map(_text, reasons)
        for token, code in zip(tokens, raw.split(b","), strict=True):
            if code == b"r":
                append(Claim(ClaimStatus.REJECTED, 0, 0, 0, next(errors)))
            elif (attempts := int(code)) > 0:
                append(_new_tuple(Claim, (_CLAIMED, token, attempts, 0, None)))
            elif attempts == 0:
                append(_DUPLICATE)
            else:
                append(_new_tuple(Claim, (_DEFERRED, 0, 0, -attempts, None)))
        return out

    def _call(
        self, script: Script, keys: Sequence[str | bytes], args: Sequence[EncodableT]
    ) -> tuple[Any, tuple[int, ...] | None]:
        """Run `script`; with `wait_replicas` or `wait_aof`, then WAIT (or WAITAOF) on the same
        connection, in the same round trip. Returns the script's reply, and what was
        acknowledged if that fell short (else None)."""
        if not (self.wait_replicas or self.wait_aof):
            return script(keys=keys, args=args), None
        wanted = self._wanted or self._check_wait()
        replicas, timeout = self.wait_replicas, self.wait_timeout_ms
        for _ in range(2):  # the second time after loading the script
            with self._client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                if self.wait_aof:
                    pipe.waitaof(1, replicas, timeout)
                else:
                    pipe.wait(replicas, timeout)
                reply, acked = pipe.execute(raise_on_error=False)
            if isinstance(reply, redis.exceptions.NoScriptError):
                self._client.script_load(script.script)
                continue
            for answer in (reply, acked):
                if isinstance(answer, Exception):
                    raise answer
            got = tuple(acked) if isinstance(acked, list) else (acked,)
            short = any(a < w for a, w in zip(got, wanted, strict=True))
            return reply, got if short else None
        raise redis.exceptions.NoScriptError(f"script {script.sha} did not load")

    def _check_wait(self) -> tuple[int, ...]:
        """The least acceptable reply of the wait; `WaitAofUnsupported` if WAITAOF is asked for
        and the server does not have it."""
        if self.wait_aof:
            require_wait_aof(self._client)
            self._wanted = (1, self.wait_replicas)
        else:
            self._wanted = (self.wait_replicas,)
        return self._wanted

    def _move_fence(self, seen: int) -> None:
        """Take a fresh epoch from the source and move the fence to it; if another client moved
        it higher meanwhile, use that one."""
        fresh = self._source.bump(seen)
        fence: int = self._advance(keys=[self._fence], args=[fresh])
        if fence > fresh:
            self._adopt(fence)
        else:
            self._epoch = fresh

    def _adopt(self, fence: int) -> None:
        """Use the fence's epoch, after checking the source has handed it out."""
        source = self._source.current()
        if source < fence:
            raise EpochConflict(
                self.namespace,
                fence,
                source,
                "the source is behind Redis (it lost data, or another store of this namespace "
                "uses another source)",
            )
        self._epoch = fence

    def settle(self, items: Sequence[Settlement]) -> list[SettleResult]:
        """Settle claimed ids in one script call; one result per item, in the same order.

        Items with effects (DONE only) run them in the same script, only if the token holds.
        Effects are checked first: `EffectNotAllowed` before anything is sent. Effect keys are
        the caller's own keys; on Redis Cluster they must carry the `{namespace}` hash tag, or
        Redis refuses the call (CROSSSLOT). With `wait_replicas`/`wait_aof`, `NotDurable` if
        the acknowledgements fell short.
        """
        if not items:
            return []
        if any(item.effects for item in items):
            return self._settle_with_effects(items)
        ids, tokens, dones, errors, _ = zip(*items, strict=True)
        prefix = self._prefix
        keys = [(prefix + id).encode() for id in ids]
        if all(dones):
            outcomes = "D" * len(items)
            texts: list[str] = []
        else:
            outcomes = "".join(["D" if done else "F" for done in dones])
            texts = [
                (error or "")[:MAX_ERROR_CHARS]
                for done, error in zip(dones, errors, strict=True)
                if not done
            ]
        # one %x per token, each followed by a space: the script reads them with gmatch
        args: list[str | int] = [self.done_ttl_ms, "%x " * len(tokens) % tokens, outcomes, *texts]
        return self._results(*self._call(self._settle, keys, args))

    def _settle_with_effects(self, items: Sequence[Settlement]) -> list[SettleResult]:
        prefix = self._prefix
        keys: list[str | bytes] = []
        effect_keys: list[str | bytes] = []
        tokens: list[str] = []
        outcomes: list[str] = []
        shapes: list[str] = []
        stream: list[str | bytes | int | float] = []  # per item: error text or effect arguments
        for id, token, done, error, effects in items:
            keys.append((prefix + id).encode())
            tokens.append(f"{token:x}")
            if done:
                outcomes.append("D")
                for effect in effects:
                    code, key, rest = check_effect(id, effect)
                    shapes.append(f"{code}{len(rest)}")
                    effect_keys.append(key)
                    stream += rest
            elif effects:
                raise EffectNotAllowed(id, effects[0], "effects apply only to DONE items")
            else:
                outcomes.append("F")
                stream.append((error or "")[:MAX_ERROR_CHARS])
            shapes.append(",")
        args = [self.done_ttl_ms, " ".join(tokens), "".join(outcomes), "".join(shapes), *stream]
        return self._results(*self._call(self._settle_effects, keys + effect_keys, args))

    def _results(self, reply: list[Any], acked: tuple[int, ...] | None) -> list[SettleResult]:
        """Decode a settle script's reply; `NotDurable` if the wait after it fell short."""
        digits, reasons = reply
        raw = digits.encode() if isinstance(digits, str) else digits
        results = [_RESULT_BY_DIGIT[digit] for digit in raw]
        if reasons:
            errors = map(_text, reasons)
            results = [
                SettleResult(r.status, next(errors)) if d == _REJECTED_DIGIT else r
                for d, r in zip(raw, results, strict=True)
            ]
        if acked is not None:
            assert self._wanted is not None
            command = "WAITAOF" if self.wait_aof else "WAIT"
            raise NotDurable(command, self._wanted, acked, results)
        return results

    def record(self, id: str) -> Record | None:
        """`id`'s record as it is now, or None if there is none."""
        raw = self._client.get(self._prefix + id)
        if raw is None:
            return None
        return Record.decode(raw if isinstance(raw, bytes) else raw.encode())

    def fence_ok(self, id: str, token: int) -> bool:
        """True while `token` holds `id`'s lease (IN_FLIGHT with this token): a sink outside
        Redis checks this before writing, so a zombie whose claim was superseded writes nothing.
        (The check and the write are not atomic; for that, use effects in `settle`.)"""
        raw = self._client.get(self._prefix + id)
        if raw is None:
            return False
        head = f"I:{token:x}:"
        return (raw.decode() if isinstance(raw, bytes) else raw).startswith(head)


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


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)

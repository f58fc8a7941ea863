"""The store's Redis client: the Lua scripts, sent in one raw round trip per node, and WAIT."""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import sha1
from importlib.resources import files
from typing import Any, NamedTuple

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT

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


class _Call(NamedTuple):
    """One script call, on the shard of `keys[0]`."""

    script: _Script
    keys: list[str | bytes]
    args: list[EncodableT]


class _Answer(NamedTuple):
    """A script call's reply, and what the wait after it acknowledged if that fell short."""

    reply: Any
    short: tuple[int, ...] | None


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

"""The store's Redis client: script calls, sent in one raw round trip per node, then WAIT.

The calls to one node go out in one write, as RESP packed in C (`hiredis`), and their replies
are read back on the same pooled connection; a node that does not know a script gets SCRIPT
LOAD and the call again. On a Redis Cluster the calls are grouped by the node serving their
first key's slot, and an error that may mean the cluster changed reloads the slot map.

With `wait_replicas` (and `wait_aof`), a node's script calls are followed, on the same
connection and in the same round trip, by `WAIT` (or `WAITAOF`, Redis >= 7.2); each answer
says what the wait acknowledged if that fell short of what was asked (the store decides what a
short wait means: `dedup.store`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.typing import EncodableT

from dedup.scripts import Script
from dedup.server_checks import require_wait_aof

Client = redis.Redis | RedisCluster


class Call(NamedTuple):
    """One script call, on the shard of `keys[0]`."""

    script: Script
    keys: list[str | bytes]
    args: list[EncodableT]


class Answer(NamedTuple):
    """A script call's reply, and what the wait after it acknowledged if that fell short."""

    reply: Any
    short: tuple[int, ...] | None


class ScriptRunner:
    """Runs script calls on one Redis server or cluster: the calls to one node in one round
    trip, with the wait after them if the store asks for one.

    `wanted` is the least acceptable reply of WAIT `(replicas,)` or WAITAOF `(1, replicas)`,
    None before the first call (WAITAOF is checked then). No I/O before the first call.
    """

    def __init__(
        self, client: Client, *, wait_replicas: int, wait_timeout_ms: int, wait_aof: bool
    ) -> None:
        self.client = client
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.wait_aof = wait_aof
        self.wanted: tuple[int, ...] | None = None

    def run(self, calls: Sequence[Call]) -> list[Answer]:
        """Run script calls, those to one node pipelined in one round trip (with the wait, if
        any, after them); the answers in the calls' order."""
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        for index, call in enumerate(calls):
            node = self._node(call.keys[0])
            by_node.setdefault(id(node), (node, []))[1].append(index)
        answers: list[Answer] = [Answer(None, None)] * len(calls)
        for node, indexes in by_node.values():
            replies, short = self._pipeline(node, [calls[i] for i in indexes])
            for index, reply in zip(indexes, replies, strict=True):
                answers[index] = Answer(reply, short)
        return answers

    def _node(self, key: str | bytes) -> redis.Redis:
        """The client of the node serving `key`'s slot (on one server, the client itself)."""
        client = self.client
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return client.get_redis_connection(node)
        return client

    def _pipeline(
        self, node: redis.Redis, calls: Sequence[Call]
    ) -> tuple[list[Any], tuple[int, ...] | None]:
        """Run `calls` on `node` in one round trip, then with `wait_replicas` or `wait_aof`
        WAIT (or WAITAOF) on the same connection. Returns the replies, and what was
        acknowledged if that fell short (else None). A call whose script the node does not
        know runs again, alone with the others that failed so, after SCRIPT LOAD.

        On a cluster, an error that may mean the cluster changed refreshes the client's map of
        it before the error propagates (`_refresh`).
        """
        waiting = bool(self.wait_replicas or self.wait_aof)
        wanted = (self.wanted or self._check_wait(node)) if waiting else ()
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
        if isinstance(self.client, RedisCluster) and isinstance(error, changed):
            with contextlib.suppress(redis.RedisError):
                self.client.nodes_manager.initialize()

    def _check_wait(self, node: redis.Redis) -> tuple[int, ...]:
        """The least acceptable reply of the wait; `WaitAofUnsupported` if WAITAOF is asked for
        and the server does not have it."""
        if self.wait_aof:
            require_wait_aof(node)
            self.wanted = (1, self.wait_replicas)
        else:
            self.wanted = (self.wait_replicas,)
        return self.wanted


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

"""The store's Redis client: script calls, sent in one raw round trip per node, then WAIT.

The calls to one node go out in one write, as RESP packed in C (`hiredis`), and their replies
are read back on the same pooled connection, at once (`ScriptRunner.run`) or later
(`ScriptRunner.send`, then `SentCalls.answers`: Redis runs the calls while the caller works); a
node that does not know a script gets SCRIPT LOAD and the call again. On a Redis Cluster the
calls are grouped by the node serving their first key's slot, and an error that may mean the
cluster changed reloads the slot map.

With `wait_replicas` (and `wait_aof`), a node's script calls are followed, on the same
connection and in the same round trip, by `WAIT` (or `WAITAOF`, Redis >= 7.2); each answer
says what the wait acknowledged if that fell short of what was asked (the store decides what a
short wait means: `dedup.store`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
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
        return self.send(calls).answers()

    def send(self, calls: Sequence[Call]) -> SentCalls:
        """Write script calls to their nodes now, those to one node in one write (with the
        wait, if any, after them); `answers()` on what this returns reads their replies."""
        by_node: dict[int, tuple[redis.Redis, list[int]]] = {}
        for index, call in enumerate(calls):
            node = self._node(call.keys[0])
            by_node.setdefault(id(node), (node, []))[1].append(index)
        waiting = bool(self.wait_replicas or self.wait_aof)
        sent: list[_NodeCalls] = []
        try:
            for node, indexes in by_node.values():
                wanted = (self.wanted or self._check_wait(node)) if waiting else None
                mine = [calls[i] for i in indexes]
                sent.append(_NodeCalls(node, indexes, mine, wanted, self._write(node, mine)))
        except BaseException:
            for written in sent:
                written.in_flight.discard()
            raise
        return SentCalls(len(calls), sent, self._read)

    def _node(self, key: str | bytes) -> redis.Redis:
        """The client of the node serving `key`'s slot (on one server, the client itself)."""
        client = self.client
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
            return client.get_redis_connection(node)
        return client

    def _commands(self, calls: Sequence[Call]) -> list[tuple[EncodableT, ...]]:
        """The EVALSHA of each call, then the wait, if any."""
        commands: list[tuple[EncodableT, ...]] = [
            ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args in calls
        ]
        if self.wait_aof:
            commands.append(("WAITAOF", 1, self.wait_replicas, self.wait_timeout_ms))
        elif self.wait_replicas:
            commands.append(("WAIT", self.wait_replicas, self.wait_timeout_ms))
        return commands

    def _read(self, sent: _NodeCalls) -> tuple[list[Any], tuple[int, ...] | None]:
        """The replies of the calls written to one node, and what its wait acknowledged if that
        fell short (else None). A call whose script the node does not know runs again, alone
        with the others that failed so, after SCRIPT LOAD.

        On a cluster, an error that may mean the cluster changed refreshes the client's map of
        it before the error propagates (`_refresh`).
        """
        node, calls, in_flight = sent.node, sent.calls, sent.in_flight
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for again in range(2):  # again: after loading scripts
            if again:
                in_flight = self._write(node, [calls[index] for index in pending])
            try:
                answers = in_flight.replies()
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
                wanted = sent.wanted
                return replies, None if wanted is None else _short(answers[-1], wanted)
            for script in {calls[index].script for index in unknown}:
                node.script_load(script.text)
            pending = unknown
        raise redis.exceptions.NoScriptError("the dedup scripts did not load")

    def _write(self, node: redis.Redis, calls: Sequence[Call]) -> _InFlight:
        """Write `calls` (and the wait, if any) to `node` in one write. A node that cannot be
        reached (on a cluster: a failover may follow) refreshes the map as a failed read does."""
        try:
            return _InFlight(node, self._commands(calls))
        except (redis.ConnectionError, redis.TimeoutError) as error:
            self._refresh(error)
            raise

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


class _NodeCalls(NamedTuple):
    """Script calls written to one node: their positions among the calls sent, the calls, the
    least acceptable reply of the wait after them (None: no wait), and what is in flight."""

    node: redis.Redis
    indexes: list[int]
    calls: list[Call]
    wanted: tuple[int, ...] | None
    in_flight: _InFlight


class SentCalls:
    """Script calls written to their nodes; `answers()` reads their replies (once), in the
    calls' order. Whoever drops one unread calls `discard()`, which frees its connections."""

    def __init__(
        self,
        count: int,
        sent: list[_NodeCalls],
        read: Callable[[_NodeCalls], tuple[list[Any], tuple[int, ...] | None]],
    ) -> None:
        self._count = count
        self._sent = sent
        self._read = read

    def answers(self) -> list[Answer]:
        answers: list[Answer] = [Answer(None, None)] * self._count
        try:
            for sent in self._sent:
                replies, short = self._read(sent)
                for index, reply in zip(sent.indexes, replies, strict=True):
                    answers[index] = Answer(reply, short)
        finally:
            self.discard()
        return answers

    def discard(self) -> None:
        """Free the connections of replies not read (closed: their replies may still come)."""
        for sent in self._sent:
            sent.in_flight.discard()


class _InFlight:
    """Commands written to a node in one write on one pooled connection; `replies()` reads
    every reply, an error reply as its exception, and frees the connection. Like a redis-py
    pipeline, without its per-argument Python work (1,000 keys a call: ~0.3 us each), and
    retried the same way on a connection error (a stale pooled connection, a restarted server):
    a failed write or read counts as the first attempt, and each retry writes and reads again."""

    def __init__(self, node: redis.Redis, commands: Sequence[tuple[EncodableT, ...]]) -> None:
        self._count = len(commands)
        self._packed = [b"".join(map(_pack, commands))]
        self._pool: redis.ConnectionPool = node.connection_pool
        self._connection: Any = self._pool.get_connection()
        self._failed: Exception | None = None
        try:
            self._connection.send_packed_command(self._packed)  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError) as error:
            self._failed = error  # raised by the first attempt of `replies`, then retried
        except BaseException:
            self.discard()
            raise

    def replies(self) -> list[Any]:
        connection = self._connection
        if connection is None:
            raise RuntimeError("these replies were read or discarded already")
        first = True

        def attempt() -> list[Any]:
            nonlocal first
            if first:
                first = False
                if self._failed is not None:
                    raise self._failed
            else:
                connection.send_packed_command(self._packed)
            replies: list[Any] = []
            for _ in range(self._count):
                try:
                    replies.append(connection.read_response())
                except redis.exceptions.ResponseError as error:
                    replies.append(error)
            return replies

        try:
            result: list[Any] = connection.retry.call_with_retry(
                attempt, lambda _: connection.disconnect()
            )
        except BaseException:
            connection.disconnect()  # replies may be unread
            raise
        finally:
            self._connection = None
            self._pool.release(connection)
        return result

    def discard(self) -> None:
        """Close the connection if its replies were not read, and give it back to the pool."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.disconnect()
            self._pool.release(connection)


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

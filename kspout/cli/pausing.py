"""Pausing partitions through ZooKeeper: what `kspout pause`/`resume` and `offsets set --force`
do. A pause is a node the owner watches (`kspout.ownership.tree`); the owner stops planning the
partition, lets what runs there finish, commits, and acks the pause in the node.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from kspout.config import TopicConfig
from kspout.errors import PauseNotAcked
from kspout.ownership.tree import SpoutTree, encode, read_ownership
from kspout.zk.record import now_ms
from kspout.zk.session import ZkSession

ACK_POLL = 0.2  # seconds between reads while waiting for owners' acks


def operator() -> str:
    """Who writes as an operator: `operator@<host>`."""
    return f"operator@{socket.gethostname()}"


def pause(session: ZkSession, partitions: Sequence[int], reason: str) -> list[int]:
    """Create the pause nodes; returns the partitions that were not paused already."""
    tree = SpoutTree(session.path)
    data = encode({"by": operator(), "at": now_ms(), "reason": reason})
    created = []
    for p in partitions:
        path = tree.pause(p)

        def create(zk: KazooClient, path: str = path) -> None:
            zk.create(path, data, makepath=True)

        try:
            session.call(f"pause {path}", path, create)
            created.append(p)
        except NodeExistsError:
            pass
    return created


def resume(session: ZkSession, partitions: Sequence[int]) -> list[int]:
    """Delete the pause nodes; returns the partitions that were paused."""
    tree = SpoutTree(session.path)
    resumed = []
    for p in partitions:
        path = tree.pause(p)

        def delete(zk: KazooClient, path: str = path) -> None:
            zk.delete(path)

        try:
            session.call(f"resume {path}", path, delete)
            resumed.append(p)
        except NoNodeError:
            pass
    return resumed


def unacked(session: ZkSession, partitions: Sequence[int]) -> dict[int, str]:
    """Paused partitions whose live owner has not acked: partition -> owner."""
    own = read_ownership(session)
    out = {}
    for p in partitions:
        owner = own.claims.get(p)
        pause = own.paused.get(p)
        if owner is not None and (pause is None or pause.acked_by != owner):
            out[p] = owner
    return out


def wait_for_acks(session: ZkSession, partitions: Sequence[int], timeout: float) -> None:
    """Until every owner of `partitions` acked its pause (`PauseNotAcked` after `timeout`)."""
    deadline = time.monotonic() + timeout
    told = False
    while waiting := unacked(session, partitions):
        if time.monotonic() >= deadline:
            raise PauseNotAcked(waiting, timeout)
        if not told:
            click.echo(f"waiting for the owners of partitions {sorted(waiting)} to pause", err=True)
            told = True
        time.sleep(ACK_POLL)


def ack_timeout(config: TopicConfig) -> float:
    """How long an owner may take to finish what runs on a paused partition."""
    return 2 * config.message_timeout + 10


@contextmanager
def paused_while(
    session: ZkSession, config: TopicConfig, partitions: Sequence[int]
) -> Iterator[None]:
    """Pause `partitions`, wait for their owners' acks, run the body, resume the ones paused
    here (a partition an operator had paused stays paused)."""
    created = pause(session, partitions, "kspout offsets set --force")
    try:
        wait_for_acks(session, partitions, ack_timeout(config))
        yield
    finally:
        resume(session, created)

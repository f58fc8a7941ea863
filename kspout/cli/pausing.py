"""Pausing partitions through ZooKeeper: what `kspout pause`/`resume` and `offsets set --force`
do. A pause is a node the owner watches (`kspout.ownership.tree`); the owner stops planning the
partition, lets what runs there finish, commits, and acks the pause in the node.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from kazoo.exceptions import NodeExistsError, NoNodeError

from kspout.config import TopicConfig
from kspout.errors import KspoutError
from kspout.zk.offsets import ZkOffsetStore, now_ms
from kspout.ownership.tree import SpoutTree, encode, read_ownership

ACK_POLL = 0.2  # seconds between reads while waiting for owners' acks


class PauseNotAcked(KspoutError):
    """Owners did not ack a pause in time (a batch still running there, or a stuck owner)."""

    def __init__(self, waiting: dict[int, str], timeout: float) -> None:
        self.waiting = waiting
        shown = ", ".join(f"{p} (owner {owner})" for p, owner in sorted(waiting.items()))
        super().__init__(
            f"no ack within {timeout:g}s for the pause of partitions {shown}: their owners "
            "still run batches there, or are stuck; look at `kspout status`, and try again"
        )


def operator() -> str:
    """Who writes as an operator: `operator@<host>`."""
    return f"operator@{socket.gethostname()}"


def pause(store: ZkOffsetStore, partitions: Sequence[int], reason: str) -> list[int]:
    """Create the pause nodes; returns the partitions that were not paused already."""
    tree = SpoutTree(store.path)
    data = encode({"by": operator(), "at": now_ms(), "reason": reason})
    created = []
    for p in partitions:
        path = tree.pause(p)

        def create(zk: Any, path: str = path) -> None:
            zk.create(path, data, makepath=True)

        try:
            store.call(f"pause {path}", path, create)
            created.append(p)
        except NodeExistsError:
            pass
    return created


def resume(store: ZkOffsetStore, partitions: Sequence[int]) -> list[int]:
    """Delete the pause nodes; returns the partitions that were paused."""
    tree = SpoutTree(store.path)
    resumed = []
    for p in partitions:
        path = tree.pause(p)

        def delete(zk: Any, path: str = path) -> None:
            zk.delete(path)

        try:
            store.call(f"resume {path}", path, delete)
            resumed.append(p)
        except NoNodeError:
            pass
    return resumed


def unacked(store: ZkOffsetStore, partitions: Sequence[int]) -> dict[int, str]:
    """Paused partitions whose live owner has not acked: partition -> owner."""
    own = read_ownership(store)
    out = {}
    for p in partitions:
        owner = own.claims.get(p)
        pause = own.paused.get(p)
        if owner is not None and (pause is None or pause.acked_by != owner):
            out[p] = owner
    return out


def wait_for_acks(store: ZkOffsetStore, partitions: Sequence[int], timeout: float) -> None:
    """Until every owner of `partitions` acked its pause (`PauseNotAcked` after `timeout`)."""
    deadline = time.monotonic() + timeout
    told = False
    while waiting := unacked(store, partitions):
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
    store: ZkOffsetStore, config: TopicConfig, partitions: Sequence[int]
) -> Iterator[None]:
    """Pause `partitions`, wait for their owners' acks, run the body, resume the ones paused
    here (a partition an operator had paused stays paused)."""
    created = pause(store, partitions, "kspout offsets set --force")
    try:
        wait_for_acks(store, partitions, ack_timeout(config))
        yield
    finally:
        resume(store, created)

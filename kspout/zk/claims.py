"""The ownership claim: one instance at a time commits a partition's offsets.

ZooKeeper layout: the claim is an ephemeral node (its path chosen by `kspout.ownership`,
`<zk_root>/<spout_id>/owners/partition_<n>`, holding who claimed it and when) beside the offset
record `<zk_root>/<spout_id>/partition_<n>` (`kspout.zk.offsets`). Every commit of the owner
checks the claim node in the same transaction (`OffsetWrite.fence`).

A claim, per round (`until_won`: again while another writer wins the race)::

    read the record --transaction: create claim + rewrite record--> CLAIMED
        the claim node exists (another live session)                  --> BUSY (None)
        the record changed since the read                             --> read it again
        the claim node is ours (an earlier attempt's reply was lost)  --> CLAIMED

Taking the claim moves the record's version, so a former owner's next commit is refused even
if it has not noticed yet that its session expired.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset, encode, now_ms
from kspout.zk.session import Race, until_won


def claim_partition(
    store: ZkOffsetStore, partition: int, fence: str, payload: bytes, initial: Callable[[], int]
) -> StoredOffset | None:
    """Take the partition: create the ephemeral claim node `fence` (holding `payload`) and,
    in the same transaction, rewrite the record unchanged (or create it at offset `initial()`
    when there is none), so its version moves and a former owner's next commit is refused.

    Returns the record as claimed, or None when another live session holds the claim.
    """
    path = store.partition_path(partition)
    return until_won(
        path, "claiming it", lambda: _claim_round(store, partition, fence, payload, initial)
    )


def _claim_round(
    store: ZkOffsetStore, partition: int, fence: str, payload: bytes, initial: Callable[[], int]
) -> StoredOffset | Literal[Race.LOST] | None:
    """One read and claim transaction of `claim_partition`."""
    session = store.session
    path = store.partition_path(partition)
    found = session.read_node(path)
    if found is None:
        record = store.record(partition, initial(), ("", -1), "claim", {"advanced_at": now_ms()})
        raw, version = encode(record), None
    else:
        raw, version = found
        store.decode(partition, path, raw, version)  # refuse another topic's record
    outcome = session.call(
        f"claim {path}",
        fence,
        functools.partial(
            _claim_once,
            store,
            fence=fence,
            payload=payload,
            path=path,
            raw=raw,
            version=version,
        ),
    )
    if outcome == "busy":
        return None
    if outcome == "raced":
        return Race.LOST
    return store.decode(partition, path, raw, 0 if version is None else version + 1)


def _claim_once(
    store: ZkOffsetStore,
    zk: KazooClient,
    *,
    fence: str,
    payload: bytes,
    path: str,
    raw: bytes,
    version: int | None,
) -> str:
    """One claim transaction: "ok", "busy" (the claim node is held) or "raced" (the record
    changed since it was read)."""
    session = store.session
    session.ensure_parent(zk, fence)
    session.ensure_parent(zk, path)
    t = zk.transaction()
    t.create(fence, payload, ephemeral=True)
    if version is None:
        t.create(path, raw)
    else:
        t.set_data(path, raw, version=version)
    results = session.wait(t.commit_async())
    if not any(isinstance(r, Exception) for r in results):
        return "ok"
    if isinstance(results[0], NodeExistsError):
        stat = session.wait(zk.exists_async(fence))
        # Ours when an earlier attempt went through before its reply was lost.
        if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
            return "ok"
        return "busy"
    return "raced"

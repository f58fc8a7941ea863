"""A spout's ownership nodes in ZooKeeper, beside storm-kafka's `partition_<n>` records.

    <zk_root>/<spout_id>/instances/<id>         ephemeral: host, pid, since, the last report
    <zk_root>/<spout_id>/owners/partition_<n>   ephemeral: the owner's claim (instance, since)
    <zk_root>/<spout_id>/assignment             who should own each partition (the leader's)
    <zk_root>/<spout_id>/paused/partition_<n>   an operator's pause; the owner acks it once idle

Every node is created by a client with the topic file's `[zookeeper_auth]`, so it carries the
same digest ACL as the offset records. Requests to live owners (pause, move) are writes to
these nodes, which owners watch; nothing reaches an owner any other way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient

from kspout.ownership.assignment import Assignment
from kspout.zk.session import ZkSession

PARTITION_NODE = re.compile(r"^partition_(\d+)$")


class SpoutTree:
    """The paths of one spout's ownership nodes."""

    def __init__(self, spout_path: str) -> None:
        self.instances = f"{spout_path}/instances"
        self.owners = f"{spout_path}/owners"
        self.assignment = f"{spout_path}/assignment"
        self.paused = f"{spout_path}/paused"

    def instance(self, instance_id: str) -> str:
        return f"{self.instances}/{instance_id}"

    def claim(self, partition: int) -> str:
        return f"{self.owners}/partition_{partition}"

    def pause(self, partition: int) -> str:
        return f"{self.paused}/partition_{partition}"


def encode(data: dict[str, Any]) -> bytes:
    """A node's compact JSON."""
    return json.dumps(data, separators=(",", ":")).encode()


def decode(raw: bytes | None) -> dict[str, Any]:
    """A node's JSON object; {} when absent or unreadable (written by something else)."""
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True, slots=True)
class Pause:
    """An operator's pause of one partition, and the owner's ack once nothing runs there."""

    by: str
    at_ms: int
    reason: str
    acked_by: str | None = None  # the owner that stopped planning and committed
    acked_offset: int | None = None  # its commit point then

    @classmethod
    def of(cls, data: dict[str, Any]) -> Pause:
        found = data.get("ack")
        ack: dict[str, Any] = found if isinstance(found, dict) else {}
        return cls(
            str(data.get("by", "")),
            int(data.get("at", 0) or 0),
            str(data.get("reason", "")),
            ack.get("instance"),
            ack.get("offset"),
        )


@dataclass(slots=True)
class Ownership:
    """What the ownership nodes say right now (for the operator commands)."""

    instances: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> node data
    claims: dict[int, str] = field(default_factory=dict)  # partition -> owning instance
    paused: dict[int, Pause] = field(default_factory=dict)
    assignment: Assignment = field(default_factory=Assignment)


def partitions_named(children: list[str]) -> list[int]:
    """The partition numbers among `partition_<n>` child names."""
    return sorted(int(m.group(1)) for c in children if (m := PARTITION_NODE.match(c)))


def read_ownership(session: ZkSession) -> Ownership:
    """Every ownership node of the session's spout (a few reads per node; for commands)."""
    tree = SpoutTree(session.path)
    out = Ownership()
    for name in session.children_of(tree.instances):
        found = session.read_node(tree.instance(name))
        if found is not None:
            out.instances[name] = decode(found[0])
    for p in partitions_named(session.children_of(tree.owners)):
        found = session.read_node(tree.claim(p))
        if found is not None:
            out.claims[p] = str(decode(found[0]).get("instance", "?"))
    for p in partitions_named(session.children_of(tree.paused)):
        found = session.read_node(tree.pause(p))
        if found is not None:
            out.paused[p] = Pause.of(decode(found[0]))
    found = session.read_node(tree.assignment)
    if found is not None:
        out.assignment = Assignment.decode(found[0])
    return out


def write_assignment(session: ZkSession, assignment: Assignment, version: int | None) -> None:
    """Create the assignment node (`version` None) or compare-and-set it; raises kazoo's
    `NodeExistsError` or `BadVersionError` when another writer went first."""
    path, payload = SpoutTree(session.path).assignment, assignment.encode()

    def write(zk: KazooClient) -> None:
        if version is None:
            zk.create(path, payload, makepath=True)
        else:
            zk.set(path, payload, version=version)

    session.call(f"assign {path}", path, write)

"""Which live instance owns which partition: balanced and sticky.

`balance` is pure: given the topic's partitions, the live instances and who owns what now, it
returns an assignment where every instance holds `n // k` or `n // k + 1` partitions and as
few partitions as possible change hands. A partition keeps its owner while that owner is live
and within its share; the larger shares go to the instances that already hold the most, so a
join takes partitions only from the busiest, and a leave moves only the partitions of the one
that left. (kazoo's `SetPartitioner` instead releases every partition on every change, which
would stop and replay the whole topic whenever one instance joins or dies.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

FORMAT_VERSION = 1


def balance(
    partitions: Sequence[int], instances: Sequence[str], current: Mapping[int, str]
) -> dict[int, str]:
    """Partition -> instance, balanced within one and sticky (see the module docstring)."""
    members = sorted(set(instances))
    if not members:
        return {}
    share, larger = divmod(len(partitions), len(members))
    held: dict[str, list[int]] = {m: [] for m in members}
    for p in sorted(partitions):
        owner = current.get(p)
        if owner in held:
            held[owner].append(p)
    by_holding = sorted(members, key=lambda m: (-len(held[m]), m))
    quota = {m: share + (1 if i < larger else 0) for i, m in enumerate(by_holding)}
    out: dict[int, str] = {}
    for m in members:
        for p in held[m][: quota[m]]:
            out[p] = m
    room = {m: quota[m] - min(len(held[m]), quota[m]) for m in members}
    for p in sorted(set(partitions) - out.keys()):
        m = max(members, key=lambda m: (room[m], -members.index(m)))
        out[p] = m
        room[m] -= 1
    return out


def moves(before: Mapping[int, str], after: Mapping[int, str]) -> list[tuple[int, str | None, str]]:
    """`(partition, from, to)` for every partition whose owner differs, by partition."""
    return [(p, before.get(p), to) for p, to in sorted(after.items()) if before.get(p) != to]


@dataclass(frozen=True, slots=True)
class Assignment:
    """The `assignment` node: who should own each partition, and what it was computed from.

    `members` are the live instances it was balanced for: the leader balances again only when
    the live set or the partitions differ (or an owner is gone), so an operator's `rebalance
    --move` stays until then.
    """

    owners: dict[int, str] = field(default_factory=dict)
    members: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    by: str = ""  # the leader instance, or "operator@<host>"
    at_ms: int = 0

    def of(self, instance: str) -> set[int]:
        """The partitions assigned to `instance`."""
        return {p for p, owner in self.owners.items() if owner == instance}

    def stale(self, live: Sequence[str], partitions: Sequence[int]) -> bool:
        """True when the live set or the partitions changed since it was balanced, or a
        partition has no live owner."""
        alive = set(live)
        return (
            set(self.members) != alive
            or set(self.partitions) != set(partitions)
            or any(self.owners.get(p) not in alive for p in partitions)
        )

    def encode(self) -> bytes:
        """The node's JSON bytes."""
        data: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "owners": {str(p): owner for p, owner in sorted(self.owners.items())},
            "members": list(self.members),
            "partitions": list(self.partitions),
            "by": self.by,
            "at": self.at_ms,
        }
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Assignment:
        """Read the node; anything unreadable is an empty assignment (balanced afresh)."""
        try:
            data = json.loads(raw)
            return cls(
                owners={int(p): str(owner) for p, owner in data["owners"].items()},
                members=tuple(str(m) for m in data["members"]),
                partitions=tuple(int(p) for p in data["partitions"]),
                by=str(data.get("by", "")),
                at_ms=int(data.get("at", 0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return cls()

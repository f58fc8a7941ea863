"""Hash tags by slot (dedup.shards): any namespace's partitions spread evenly over the masters,
whatever the cluster's slot split, and each tag lands on the master it was meant for."""

from __future__ import annotations

from collections import Counter

import pytest

from dedup.shards import choose_tag, masters_in_slot_order, slot_of

SLOTS = 16384


def even_split(masters: int) -> dict[int, str]:
    """The slot owners of `redis-cli --cluster create` with `masters` masters: equal ranges."""
    return {slot: f"m{slot * masters // SLOTS}" for slot in range(SLOTS)}


def uneven_split() -> dict[int, str]:
    """Three masters, the first owning half the slots in two ranges (after a resharding)."""
    return {
        slot: "a" if slot < 4096 or slot >= 12288 else "b" if slot < 8192 else "c"
        for slot in range(SLOTS)
    }


@pytest.mark.parametrize("owners", [even_split(3), even_split(6), even_split(1), uneven_split()])
@pytest.mark.parametrize("namespace", ["orders", "bench-123", "spout_x", "a"])
@pytest.mark.parametrize("partitions", [12, 48, 7, 192])
def test_the_busiest_master_holds_its_fair_share_rounded_up(
    owners: dict[int, str], namespace: str, partitions: int
) -> None:
    masters = masters_in_slot_order(owners)
    tags = [choose_tag(namespace, p, owners.get, masters) for p in range(partitions)]
    per_master = Counter(owners[slot_of(tag)] for tag in tags)

    assert len(set(tags)) == partitions  # a shard (and a fence) per partition
    assert all(tag.startswith(f"{namespace}:p{p}") for p, tag in enumerate(tags))
    assert max(per_master.values()) == -(-partitions // len(masters))  # ceil(P / M)
    assert min(per_master.values(), default=0) == partitions // len(masters)
    assert len(per_master) == min(partitions, len(masters))


def test_a_tag_that_already_lands_right_keeps_the_plain_name() -> None:
    owners = even_split(3)
    masters = masters_in_slot_order(owners)
    tags = [choose_tag("orders", p, owners.get, masters) for p in range(48)]
    assert any(tag == f"orders:p{p}" for p, tag in enumerate(tags))
    assert all(
        tag == f"orders:p{p}" or tag.startswith(f"orders:p{p}:") for p, tag in enumerate(tags)
    )


def test_masters_are_ordered_by_their_lowest_slot() -> None:
    assert masters_in_slot_order(uneven_split()) == ["a", "b", "c"]
    assert masters_in_slot_order({5: "y", 1: "x", 9: "y"}) == ["x", "y"]

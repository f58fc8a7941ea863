"""The balanced, sticky assignment (`kspout.ownership.assignment`), property-tested."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from kspout.ownership.assignment import Assignment, balance, moves

partitions_st = st.integers(0, 40).map(range)
members_st = st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=8, unique=True)


@st.composite
def situations(draw: st.DrawFn) -> tuple[range, list[str], dict[int, str]]:
    """Partitions, live members, and a current owner map that may name dead instances."""
    partitions = draw(partitions_st)
    members = draw(members_st)
    owners = st.sampled_from([*members, "dead-1", "dead-2"])
    current = draw(
        st.dictionaries(st.sampled_from(partitions) if partitions else st.nothing(), owners)
    )
    return partitions, members, current


@given(situations())
def test_every_partition_goes_to_a_live_member_within_one_of_the_others(
    situation: tuple[range, list[str], dict[int, str]],
) -> None:
    partitions, members, current = situation
    out = balance(partitions, members, current)
    assert sorted(out) == list(partitions)
    assert set(out.values()) <= set(members)
    counts = Counter(out.values())
    loads = [counts.get(m, 0) for m in members]
    assert max(loads) - min(loads) <= 1


@given(situations())
def test_a_balanced_assignment_stays_as_it_is(
    situation: tuple[range, list[str], dict[int, str]],
) -> None:
    partitions, members, current = situation
    once = balance(partitions, members, current)
    assert balance(partitions, members, once) == once


@given(situations())
def test_a_member_within_its_share_keeps_all_it_holds(
    situation: tuple[range, list[str], dict[int, str]],
) -> None:
    partitions, members, current = situation
    share = len(partitions) // len(members)
    out = balance(partitions, members, current)
    for m in members:
        held = {p for p, owner in current.items() if owner == m}
        if len(held) <= share:
            assert all(out[p] == m for p in held)


@given(partitions_st, members_st, st.data())
def test_a_leave_moves_only_the_partitions_of_the_one_that_left(
    partitions: range, members: list[str], data: st.DataObject
) -> None:
    before = balance(partitions, members, {})
    gone = data.draw(st.sampled_from(members))
    rest = [m for m in members if m != gone]
    after = balance(partitions, rest, before)
    assert {p for p, _, _ in moves(before, after)} <= {p for p, o in before.items() if o == gone}


@given(partitions_st, members_st)
def test_a_join_moves_partitions_only_to_the_newcomer(
    partitions: range, members: list[str]
) -> None:
    before = balance(partitions, members, {})
    after = balance(partitions, [*members, "new"], before)
    moved = moves(before, after)
    assert all(to == "new" for _, _, to in moved)
    assert len(moved) <= -(-len(partitions) // (len(members) + 1))  # the newcomer's share


def test_the_node_round_trips_and_knows_when_it_is_stale() -> None:
    a = Assignment({0: "a", 1: "b"}, ("a", "b"), (0, 1), "a", 123)
    assert Assignment.decode(a.encode()) == a
    assert a.of("a") == {0}
    assert not a.stale(["b", "a"], [1, 0])
    assert a.stale(["a"], [0, 1])  # b left
    assert a.stale(["a", "b"], [0, 1, 2])  # a partition was added
    assert Assignment.decode(b"not json") == Assignment()

"""Poison-pill isolation: `split`, `Suspects`, `Isolation`, and a property test against a model.

The model: the offsets a dead task left open hold exactly one "killer". Running a group alone
dies iff the group holds the killer; a dead run reports the offset it was last seen on (any
offset of the group at or before the killer, or None) and leaves open whatever it had not
settled (everything from some point at or before the killer). Isolation must find the killer,
only the killer, in a logarithmic number of deaths, and its groups must always partition the
offsets still open, each at the attempt it was planned at.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from kspout.driver.isolation import Isolation, Suspects, split
from kspout.partition_manager import Plan, Span

P = 3  # the partition every test uses
EPOCH = 2


def offsets_of(spans: Iterable[Span]) -> list[tuple[int, int]]:
    """`(offset, attempt)` for every offset of `spans`, in order."""
    return [(o, s.attempt) for s in spans for o in range(s.start, s.end)]


def group(*spans: tuple[int, int, int]) -> Suspects:
    return Suspects(P, EPOCH, tuple(Span(a, b, attempt) for a, b, attempt in spans))


# -- Suspects and split --------------------------------------------------------------------------


def test_suspects_size_and_plan_run_exactly_their_offsets() -> None:
    g = group((10, 14, 2), (20, 21, 1))
    assert g.size == 5
    plan = g.plan()
    assert plan == Plan((Span(10, 14, 2), Span(20, 21, 1)), EPOCH)
    assert list(plan) == [10, 11, 12, 13, 20]


def test_split_puts_the_last_seen_offset_alone_first_then_halves_by_count() -> None:
    parts = split(group((0, 10, 1)), last_seen=7)
    assert [p.spans for p in parts] == [
        (Span(7, 8, 1),),
        (Span(0, 5, 1),),
        (Span(5, 7, 1), Span(8, 10, 1)),
    ]
    assert all((p.partition, p.generation) == (P, EPOCH) for p in parts)


def test_split_without_last_seen_bisects() -> None:
    parts = split(group((0, 5, 1)), last_seen=None)
    assert [p.spans for p in parts] == [(Span(0, 3, 1),), (Span(3, 5, 1),)]


def test_split_ignores_a_last_seen_offset_that_is_not_a_suspect() -> None:
    """The task was last seen on a record it settled (or on another partition's)."""
    parts = split(group((0, 4, 1)), last_seen=99)
    assert [p.spans for p in parts] == [(Span(0, 2, 1),), (Span(2, 4, 1),)]


def test_split_keeps_each_offsets_attempt_and_never_joins_different_attempts() -> None:
    g = group((0, 3, 4), (3, 6, 1), (9, 11, 2))
    parts = split(g, last_seen=4)
    assert parts[0].spans == (Span(4, 5, 1),)
    assert sorted(o for p in parts for o in offsets_of(p.spans)) == offsets_of(g.spans)
    for p in parts:
        for a, b in zip(p.spans, p.spans[1:], strict=False):
            assert a.end < b.start or a.attempt != b.attempt, "adjacent alike spans are joined"


def test_split_of_two_with_the_last_seen_gives_two_singletons() -> None:
    parts = split(group((5, 7, 1)), last_seen=6)
    assert [p.spans for p in parts] == [(Span(6, 7, 1),), (Span(5, 6, 1),)]


# -- Isolation ---------------------------------------------------------------------------------


def test_suspect_queues_one_group_and_ignores_nothing_open() -> None:
    iso = Isolation()
    iso.suspect(P, EPOCH, [])
    assert len(iso) == 0
    assert iso.next() is None
    assert iso.runs == 0
    iso.suspect(P, EPOCH, [Span(0, 4, 1)])
    assert len(iso) == 1
    assert list(iso.waiting()) == [group((0, 4, 1))]
    assert iso.next() == group((0, 4, 1))
    assert iso.runs == 1
    assert len(iso) == 0


def test_a_group_that_dies_splits_and_a_singleton_that_dies_is_the_culprit() -> None:
    iso = Isolation()
    iso.suspect(P, EPOCH, [Span(0, 8, 2)])
    first = iso.next()
    assert first is not None
    assert iso.died(first, [Span(3, 8, 2)], last_seen=5) is None  # 0..2 were settled
    queued = list(iso.waiting())
    assert [g.spans for g in queued] == [
        (Span(5, 6, 2),),
        (Span(3, 5, 2),),
        (Span(6, 8, 2),),
    ]
    alone = iso.next()
    assert alone == group((5, 6, 2))
    assert iso.died(alone, [Span(5, 6, 2)], last_seen=5) == 5


def test_a_run_that_died_with_nothing_open_charges_nobody() -> None:
    iso = Isolation()
    g = group((0, 4, 1))
    assert iso.died(g, [], last_seen=2) is None
    assert len(iso) == 0
    _, alone = iso.carve(P, Plan((Span(0, 4, 1),), EPOCH))
    assert alone == [], "nobody became a known crasher"


def test_carve_runs_known_crashers_alone_keeping_attempt_and_epoch() -> None:
    iso = Isolation()
    iso.died(group((7, 8, 3)), [Span(7, 8, 3)], last_seen=None)
    iso.died(group((12, 13, 1)), [Span(12, 13, 1)], last_seen=12)
    plan = Plan((Span(5, 10, 4), Span(10, 14, 1)), 5)
    kept, alone = iso.carve(P, plan)
    assert kept == Plan((Span(5, 7, 4), Span(8, 10, 4), Span(10, 12, 1), Span(13, 14, 1)), 5)
    assert alone == [
        Suspects(P, 5, (Span(7, 8, 4),)),
        Suspects(P, 5, (Span(12, 13, 1),)),
    ]
    # Nothing lost, nothing doubled, every offset at the attempt the plan gave it.
    together = sorted(offsets_of(kept.spans) + [o for g in alone for o in offsets_of(g.spans)])
    assert together == offsets_of(plan.spans)


def test_carve_of_crashers_at_span_edges_makes_no_empty_spans() -> None:
    iso = Isolation()
    for o in (0, 4, 5):
        iso.died(group((o, o + 1, 1)), [Span(o, o + 1, 1)], last_seen=None)
    kept, alone = iso.carve(P, Plan((Span(0, 6, 2),), 0))
    assert kept == Plan((Span(1, 4, 2),), 0)
    assert [g.spans for g in alone] == [(Span(o, o + 1, 2),) for o in (0, 4, 5)]


def test_carve_leaves_other_partitions_and_clean_plans_untouched() -> None:
    iso = Isolation()
    iso.died(group((7, 8, 1)), [Span(7, 8, 1)], last_seen=7)
    plan = Plan((Span(0, 20, 1),), 0)
    assert iso.carve(P + 1, plan) == (plan, [])
    clean = Plan((Span(8, 20, 1),), 0)
    assert iso.carve(P, clean) == (clean, [])


def test_forget_below_drops_finished_crashers_only() -> None:
    iso = Isolation()
    for o in (3, 9):
        iso.died(group((o, o + 1, 1)), [Span(o, o + 1, 1)], last_seen=o)
    iso.forget_below(P, 9)
    _, alone = iso.carve(P, Plan((Span(0, 20, 1),), 0))
    assert [g.spans for g in alone] == [(Span(9, 10, 1),)]
    iso.forget_below(P, 10)
    assert iso.carve(P, Plan((Span(0, 20, 1),), 0))[1] == []


def test_drop_partition_forgets_its_groups_and_crashers_only() -> None:
    iso = Isolation()
    iso.suspect(P, EPOCH, [Span(0, 4, 1)])
    iso.suspect(P + 1, EPOCH, [Span(0, 4, 1)])
    iso.suspect(P, EPOCH, [Span(10, 14, 1)])
    iso.died(group((7, 8, 1)), [Span(7, 8, 1)], last_seen=7)
    iso.died(Suspects(P + 1, EPOCH, (Span(7, 8, 1),)), [Span(7, 8, 1)], last_seen=7)
    iso.drop_partition(P)
    assert [g.partition for g in iso.waiting()] == [P + 1]
    plan = Plan((Span(0, 20, 1),), 0)
    assert iso.carve(P, plan) == (plan, [])
    assert [g.spans for g in iso.carve(P + 1, plan)[1]] == [(Span(7, 8, 1),)]


def test_queue_front_runs_before_waiting_groups_in_order() -> None:
    iso = Isolation()
    iso.suspect(P, EPOCH, [Span(0, 2, 1)])
    a, b = group((10, 11, 1)), group((20, 21, 1))
    iso.queue_front([a, b])
    assert [iso.next(), iso.next(), iso.next()] == [a, b, group((0, 2, 1))]


# -- the model ---------------------------------------------------------------------------------


@st.composite
def open_spans(draw: st.DrawFn) -> list[Span]:
    """Ascending spans, possibly with gaps and different attempts: what a dead task left."""
    spans: list[Span] = []
    start = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 4))):
        start += draw(st.integers(0, 5))
        length = draw(st.integers(1, 60))
        spans.append(Span(start, start + length, draw(st.integers(1, 6))))
        start += length
    return spans


@settings(max_examples=300, deadline=None)
@given(spans=open_spans(), data=st.data())
def test_isolation_finds_the_killer_and_only_it(spans: list[Span], data: st.DataObject) -> None:
    everything = offsets_of(spans)
    attempt_of = dict(everything)
    n = len(everything)
    killer = data.draw(st.sampled_from([o for o, _ in everything]), label="killer")

    iso = Isolation()
    settled: set[int] = set()  # proven innocent: ran to the end, or settled before a death
    culprits: list[int] = []
    deaths = 1  # the original task died: that is where isolation starts

    def run_dies(g: Suspects) -> tuple[list[Span], int | None]:
        """Run `g` alone: it died. What it left open, and the offset it was last seen on."""
        members = offsets_of(g.spans)
        at_or_before = [o for o, _ in members if o <= killer]
        first_open = data.draw(st.sampled_from(at_or_before), label="settled up to")
        seen = data.draw(st.none() | st.sampled_from(at_or_before), label="last seen")
        settled.update(o for o, _ in members if o < first_open)
        left = [Span(o, o + 1, a) for o, a in members if o >= first_open]
        return left, seen

    def check_partition() -> None:
        queued = [o for g in iso.waiting() for o in offsets_of(g.spans)]
        assert len(queued) == len(set(queued)), "an offset is in two groups"
        for o, a in queued:
            assert attempt_of[o] == a, f"offset {o} changed attempt"
        owned = {o for o, _ in queued} | settled | set(culprits)
        assert owned == set(attempt_of), "an offset was lost or invented"
        assert not ({o for o, _ in queued} & settled), "a settled offset is queued again"

    # The original task (not an isolation run) died: what it left open is one group.
    left, _ = run_dies(Suspects(P, EPOCH, tuple(spans)))
    iso.suspect(P, EPOCH, left)
    check_partition()
    named_killer_at: int | None = None

    while (g := iso.next()) is not None:
        assert g.partition == P and g.generation == EPOCH
        members = {o for o, _ in offsets_of(g.spans)}
        if killer not in members:
            settled.update(members)  # ends normally: its offsets are settled by their outcomes
            check_partition()
            continue
        deaths += 1
        left, seen = run_dies(g)
        culprit = iso.died(g, left, seen)
        if culprit is not None:
            assert culprit == killer, f"innocent offset {culprit} charged"
            culprits.append(culprit)
        elif seen == killer and named_killer_at is None:
            named_killer_at = deaths
        check_partition()
        assert deaths <= math.ceil(math.log2(n)) + 2, "isolation takes more than log2(n) rounds"

    assert culprits == [killer]
    assert settled == set(attempt_of) - {killer}
    if named_killer_at is not None:
        assert deaths == named_killer_at + 1, "the channel named the killer: it runs alone next"
    # The culprit is a known crasher: a fresh plan over it runs it alone, at the plan's attempt.
    plan = Plan(tuple(spans), EPOCH + 1)
    kept, alone = iso.carve(P, plan)
    assert [g.spans for g in alone] == [(Span(killer, killer + 1, attempt_of[killer]),)]
    assert all(g.generation == EPOCH + 1 for g in alone)
    assert killer not in set(kept)
    assert sorted([*kept, killer]) == sorted(plan)

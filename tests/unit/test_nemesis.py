"""The nemesis's pure parts (bench/nemesis): its schedule, its ledger's messages, and how it
lays replays and recovery times to each fault (the run itself: tests/chaos/test_nemesis.py)."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

from bench.nemesis.faults import KINDS, Strike, schedule
from bench.nemesis.ledger import MIN_EACH, sentences
from bench.nemesis.monitor import Sample
from bench.nemesis.verdict import at_highs, handler_runs, recovery, replays


def strike(began: float, over: float, partitions: list[int]) -> Strike:
    return Strike("zombie", "instance 0", began, over, True, "", partitions)


def sample(at: float, **commits: int) -> Sample:
    return Sample(at, {int(p[1:]): o for p, o in commits.items()}, {}, {})


def test_the_schedule_strikes_every_kind_once_first_then_more_while_the_window_allows() -> None:
    plan = schedule(seed=3, start=8.0, window=300.0, gap=(8.0, 14.0))
    assert sorted(p.kind for p in plan[: len(KINDS)]) == sorted(KINDS)
    assert len(plan) > len(KINDS) and plan[-2].at < 300.0
    assert all(8.0 <= b.at - a.at <= 14.0 for a, b in pairwise(plan))
    assert plan == schedule(seed=3, start=8.0, window=300.0, gap=(8.0, 14.0))  # the seed's own
    assert [p.kind for p in schedule(seed=3, start=8.0, window=10.0, gap=(8.0, 14.0))] == [
        p.kind for p in plan[: len(KINDS)]
    ]


def test_the_ledger_holds_a_few_poison_and_unkeyed_messages_at_the_least() -> None:
    kinds = Counter(kind for _, kind, _ in sentences(100, seed=1))
    assert kinds == {"none": 100 - 2 * MIN_EACH, "poison": MIN_EACH, "noid": MIN_EACH}
    kinds = Counter(kind for _, kind, _ in sentences(100_000, seed=1))
    assert kinds["poison"] == 200 and kinds["noid"] == 100


def test_replays_are_laid_to_the_last_fault_before_them(tmp_path: Path) -> None:
    log = tmp_path / "instance-0-0.attempts"
    log.write_text(
        "D 4.0 3,9\nA 1 1 10.0\nA 2 1 11.0\nA 1 2 25.0\nA 3 1 5.0\nA 3 2 6.0\nA 9 1 7.0\n"
        "D 21.0 3\nA 9 2"
    )
    runs, delivered = handler_runs([log, tmp_path / "missing"])
    assert runs == {1: [10.0, 25.0], 2: [11.0], 3: [5.0, 6.0], 9: [7.0]}  # a half line is left
    assert delivered == {3: [4.0, 21.0], 9: [4.0]}
    strikes = [strike(8.0, 9.0, []), strike(20.0, 21.0, [])]
    assert replays(runs, healthy={1, 2, 3}, strikes=strikes) == {1: 1, -1: 1}
    assert replays(delivered, healthy={1, 2, 3}, strikes=strikes) == {1: 1}


def test_recovery_counts_from_the_strike_until_every_touched_partition_moves_on() -> None:
    samples = [sample(9.0, p0=5, p1=7), sample(10.5, p0=5, p1=8), sample(12.0, p0=6, p1=9)]
    assert recovery(strike(8.0, 10.0, [0, 1]), samples, {0: 10, 1: 10}) == 4.0
    assert recovery(strike(8.0, 10.0, [1]), samples, {0: 10, 1: 10}) == 2.5
    assert recovery(strike(8.0, 10.0, [1]), samples, {0: 10, 1: 7}) is None  # nothing left
    assert recovery(strike(8.0, 12.0, [0]), samples, {0: 10}) is None  # never moved on


def test_commit_points_are_at_the_highs_only_when_all_are() -> None:
    assert at_highs({0: 5, 1: 3}, {0: 5, 1: 3, 2: 0})  # an empty partition has no commit point
    assert not at_highs({0: 5}, {0: 5, 1: 3})
    assert not at_highs({}, {})

"""PartitionManager throughput and memory beside a storm-kafka-style baseline, in one run.

    python -m bench.bench_partition_manager            # 10**6 offsets per case (~1 min)
    python -m bench.bench_partition_manager --quick    # 10**5 offsets per case (seconds)

The baseline, `StormStyleManager`, is storm-kafka 0.9.3's bookkeeping at its most minimal:
offsets go into a sorted `pending` set when emitted and are removed on ack, failed offsets go
into a sorted `failed` set, and the commit point is `pending[0]`. It is built on
`sortedcontainers.SortedSet`, the fastest pure-Python sorted set, so the comparison is with a
good implementation of the old design, not a strawman. Both do the same work in each case;
only the outcome calls are timed (planning / emitting is setup), best of 3 after a warm-up.

Targets come from design.md ("Performance targets"): >= 1,000,000 offsets/s for batch outcomes
and >= 300,000 offsets/s for single calls, memory O(gaps). This is a benchmark, not a test: it
prints PASS/MISS and always exits 0.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from sortedcontainers import SortedSet  # type: ignore[import-untyped]

from bench.report import table
from kspout.outcomes import FailReason, Outcome, OutcomeKind
from kspout.partition_manager import PartitionManager
from kspout.policy import PartitionPolicy

SINGLE_TARGET = 300_000  # offsets/s, single fail calls (design.md)
BATCH_TARGET = 1_000_000  # offsets/s, batch outcomes (design.md)
WINDOW = 1000  # out-of-order fails are shuffled within windows of this many offsets
FAIL_EVERY = 100  # "every 100th offset failed" in the mixed batch and memory cases
REPEAT = 3

EXC = FailReason.EXCEPTION


class StormStyleManager:
    """storm-kafka 0.9.3 PartitionManager bookkeeping: `pending` and `failed` sorted sets."""

    def __init__(self, start: int) -> None:
        self.pending: SortedSet = SortedSet()
        self.failed: SortedSet = SortedSet()
        self.emitted_to = start
        self.acked = 0
        self.number_failed = 0

    def emit(self, n: int) -> None:
        """`fill()` + `next()`: every emitted offset enters `pending`."""
        self.pending.update(range(self.emitted_to, self.emitted_to + n))
        self.emitted_to += n

    def fail(self, offset: int) -> None:
        self.failed.add(offset)  # stays in `pending` until acked, as in storm-kafka
        self.number_failed += 1

    def ack_many(self, offsets: list[int]) -> None:
        self.pending.difference_update(offsets)
        self.acked += len(offsets)

    def fail_many(self, offsets: list[int]) -> None:
        self.failed.update(offsets)
        self.number_failed += len(offsets)

    @property
    def commit_point(self) -> int:
        """`lastCompletedOffset()`: the smallest pending offset, or `emitted_to`."""
        return self.pending[0] if self.pending else self.emitted_to


def new_pm() -> PartitionManager:
    # A long timeout: no deadline passes during a run, so no case measures expiry.
    return PartitionManager(PartitionPolicy(message_timeout=3600.0), 0)


def planned_pm(n: int) -> PartitionManager:
    pm = new_pm()
    pm.plan(n, n)
    return pm


def emitted_storm(n: int) -> StormStyleManager:
    storm = StormStyleManager(0)
    storm.emit(n)
    return storm


def windowed_order(n: int, seed: int = 7) -> list[int]:
    """0..n-1, shuffled within consecutive windows of WINDOW offsets."""
    rng = random.Random(seed)
    out: list[int] = []
    for lo in range(0, n, WINDOW):
        block = list(range(lo, min(lo + WINDOW, n)))
        rng.shuffle(block)
        out.extend(block)
    return out


# -- cases: `prepare(n)` does the untimed setup and returns the work to time --------------------

Work = Callable[[], None]
Prepare = Callable[[int], Work]


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "single" or "batch": which target applies
    kspout: Prepare
    storm: Prepare


def _in_order(n: int) -> list[int]:
    return list(range(n))


def _outcomes(n: int) -> list[Outcome]:
    """One batch's outcomes: ACK, except a FAIL(EXCEPTION) every FAIL_EVERY offsets."""
    return [
        Outcome(o, OutcomeKind.FAIL, 1, EXC, "boom")
        if o % FAIL_EVERY == FAIL_EVERY - 1
        else Outcome(o, OutcomeKind.ACK, 1)
        for o in range(n)
    ]


def pm_fail_each(order: Callable[[int], list[int]]) -> Prepare:
    def prepare(n: int) -> Work:
        pm, offsets = planned_pm(n), order(n)

        def work() -> None:
            fail = pm.fail
            for o in offsets:
                fail(o, EXC, None, 1)
            assert pm.stats().waiting == n

        return work

    return prepare


def storm_fail_each(order: Callable[[int], list[int]]) -> Prepare:
    def prepare(n: int) -> Work:
        storm, offsets = emitted_storm(n), order(n)

        def work() -> None:
            fail = storm.fail
            for o in offsets:
                fail(o)
            assert len(storm.failed) == n

        return work

    return prepare


def pm_ack_batch(n: int) -> Work:
    pm, outcomes = planned_pm(n), [Outcome(o, OutcomeKind.ACK, 1) for o in range(n)]

    def work() -> None:
        pm.apply(outcomes, generation=pm.generation)
        assert pm.commit_point == n

    return work


def storm_ack_batch(n: int) -> Work:
    storm, offsets = emitted_storm(n), list(range(n))

    def work() -> None:
        storm.ack_many(offsets)
        assert storm.commit_point == n

    return work


def pm_apply(n: int) -> Work:
    pm, outcomes = planned_pm(n), _outcomes(n)

    def work() -> None:
        pm.apply(outcomes, generation=pm.generation)
        assert pm.stats().waiting == n // FAIL_EVERY

    return work


def storm_apply(n: int) -> Work:
    storm, outcomes = emitted_storm(n), _outcomes(n)

    def work() -> None:
        storm.ack_many([o.offset for o in outcomes if o.kind is OutcomeKind.ACK])
        storm.fail_many([o.offset for o in outcomes if o.kind is OutcomeKind.FAIL])
        assert len(storm.failed) == n // FAIL_EVERY

    return work


def cases() -> list[Case]:
    return [
        Case(
            "fail, single calls, in order",
            "single",
            pm_fail_each(_in_order),
            storm_fail_each(_in_order),
        ),
        Case(
            f"fail, single calls, shuffled per {WINDOW}",
            "single",
            pm_fail_each(windowed_order),
            storm_fail_each(windowed_order),
        ),
        Case("apply, one batch, all ACK", "batch", pm_ack_batch, storm_ack_batch),
        Case(f"apply, one batch, 1/{FAIL_EVERY} FAIL", "batch", pm_apply, storm_apply),
    ]


# -- measuring ---------------------------------------------------------------------------------


def best_time(prepare: Prepare, n: int, repeat: int = REPEAT) -> float:
    """Best wall time of the prepared work over `repeat` fresh setups, after a smaller warm-up."""
    prepare(max(1, n // 10))()  # warm-up: caches, bytecode specialisation, allocator
    best = float("inf")
    for _ in range(repeat):
        work = prepare(n)
        gc.collect()
        gc.disable()  # as timeit does: time the work, not an unlucky collection
        try:
            t0 = time.perf_counter()
            work()
            elapsed = time.perf_counter() - t0
        finally:
            gc.enable()
        best = min(best, elapsed)
        del work
    return best


def traced_bytes(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated after `build()` returns (its result is kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        obj = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, obj


def _pm_every_100th_failed(n: int) -> PartitionManager:
    pm = planned_pm(n)
    for o in range(FAIL_EVERY - 1, n, FAIL_EVERY):
        pm.fail(o, EXC, None, 1)
    return pm


def _storm_every_100th_failed(n: int) -> StormStyleManager:
    storm = emitted_storm(n)
    for o in range(FAIL_EVERY - 1, n, FAIL_EVERY):
        storm.fail(o)
    return storm


# -- report ------------------------------------------------------------------------------------


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:>13,.0f}"


def _size(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):,.1f} MiB"
    if nbytes >= 1 << 10:
        return f"{nbytes / (1 << 10):,.1f} KiB"
    return f"{nbytes} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10**5 offsets per case")
    parser.add_argument("-n", type=int, default=None, help="offsets per case (overrides)")
    args = parser.parse_args(argv)
    n = args.n or (10**5 if args.quick else 10**6)

    print(
        f"PartitionManager vs storm-kafka-style SortedSet manager: {n:,} offsets per case, "
        f"best of {REPEAT} after a warm-up"
    )
    print(f"Python {platform.python_version()} ({sys.implementation.name}), {platform.machine()}")
    print()

    rows = []
    for case in cases():
        pm_s = best_time(case.kspout, n)
        storm_s = best_time(case.storm, n)
        target = SINGLE_TARGET if case.kind == "single" else BATCH_TARGET
        rate = n / pm_s
        rows.append(
            [
                case.name,
                _rate(n, pm_s),
                _rate(n, storm_s),
                f"{storm_s / pm_s:.2f}x",
                f">= {target:,}/s",
                "PASS" if rate >= target else "MISS",
            ]
        )
    print("Throughput (offsets/s; ratio = kspout / baseline, > 1 means kspout is faster)")
    print(
        table(
            ["case", "kspout", "storm-style", "ratio", "target (kspout)", "result"],
            rows,
            "<>>>><",
        )
    )
    print()

    mem_rows = []
    for label, build_pm, build_storm in (
        (f"{n:,} in flight", lambda: planned_pm(n), lambda: emitted_storm(n)),
        (
            f"{n:,} in flight, every {FAIL_EVERY}th failed",
            lambda: _pm_every_100th_failed(n),
            lambda: _storm_every_100th_failed(n),
        ),
    ):
        pm_bytes, pm = traced_bytes(build_pm)
        storm_bytes, storm = traced_bytes(build_storm)
        assert isinstance(pm, PartitionManager) and isinstance(storm, StormStyleManager)
        spans = pm.stats().spans
        mem_rows.append(
            [
                label,
                _size(pm_bytes),
                f"{spans:,}",
                f"{pm_bytes / n:.3f}",
                _size(storm_bytes),
                f"{storm_bytes / n:.1f}",
                f"{storm_bytes / max(pm_bytes, 1):,.0f}x",
            ]
        )
        del pm, storm
    print("Memory (tracemalloc; ratio = baseline / kspout, > 1 means kspout is smaller)")
    print(
        table(
            ["case", "kspout", "spans", "B/offset", "storm-style", "B/offset", "ratio"],
            mem_rows,
            "<>>>>>>",
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

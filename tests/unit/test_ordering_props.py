"""Property test of `ordering = key` against its rule, over the real planning and task code.

A simulated driver plans with a real PartitionManager, hands each task its blockers, runs it
(split into key slices or not) with `settle` over records held in memory, and
applies the merged outcomes. Handlers fail some records a few times; some task results are
lost (the offsets stay in flight until they time out); dead letters are written at once. The
rule checked at every call of the handler: every earlier record of the same key is finished
(acked, or dead-lettered). And in the end every record is finished.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kspout.contract import PartitionTask
from kspout.executor.slices import join_slices, split_by_key
from kspout.executor.task import settle
from kspout.kafka.records import FetchResult, Record
from kspout.ordering import KeyOrder, blockers_of
from kspout.partition_manager import DONE, PartitionManager
from kspout.policy import Backoff, ExhaustedPolicy, PartitionPolicy

TOPIC = "t"


class Simulation:
    """One partition driven to the end; `handled` logs (offset, key) per handler call."""

    def __init__(self, keys: Sequence[bytes | None], failures: dict[int, int], batch: int) -> None:
        self.records = [
            Record(TOPIC, 0, offset, key, b"v", -1, ()) for offset, key in enumerate(keys)
        ]
        self.failures = dict(failures)  # offset -> how many more calls fail
        self.batch = batch
        self.now = 0.0
        policy = PartitionPolicy(
            max_retries=2,
            backoff=Backoff(1.0, 2.0, 4.0),
            on_exhausted=ExhaustedPolicy.DEAD_LETTER,
            message_timeout=5.0,
            defer_delay=0.5,
        )
        self.pm = PartitionManager(policy, 0, lambda: self.now, topic=TOPIC, partition=0)
        self.acked_in_task: set[int] = set()
        self.handled: list[tuple[int, bytes | None]] = []

    def finished(self, offset: int) -> bool:
        return offset in self.acked_in_task or self.pm.state_of(offset) is DONE

    def handle(self, record: Record) -> None:
        """The handler: checks the rule, then fails the record while it owes failures."""
        earlier = [r for r in self.records[: record.offset] if r.key == record.key]
        if record.key is not None:
            waiting = [r.offset for r in earlier if not self.finished(r.offset)]
            assert not waiting, f"offset {record.offset} ran before {waiting} of its key"
        self.handled.append((record.offset, record.key))
        if self.failures.get(record.offset, 0) > 0:
            self.failures[record.offset] -= 1
            raise RuntimeError("boom")
        self.acked_in_task.add(record.offset)

    def fetch(self, ranges: Sequence[tuple[int, int]]) -> FetchResult:
        return FetchResult([r for lo, hi in ranges for r in self.records[lo:hi]], [])

    def step(self, slices: int, lose: bool) -> None:
        plan = self.pm.plan(len(self.records), self.batch)
        if plan:
            ranges = plan.ranges()
            blockers = blockers_of(self.pm.unfinished_below(ranges[-1][1]), ranges)
            task = PartitionTask(TOPIC, 0, plan, KeyOrder(blockers))
            results = []
            for part in split_by_key([task], slices):
                fetched = self.fetch(part.fetch_ranges())
                assert part.keys is not None
                results.append(settle(part, fetched, self.handle))
            (merged,) = join_slices([task], results)
            if not lose:
                self.pm.apply(merged.outcomes, generation=plan.generation)
            self.acked_in_task.clear()
        tickets = self.pm.take_dead_letters()
        self.pm.dead_lettered(t.offset for t in tickets)
        self.now += 0.5


keys = st.lists(st.sampled_from([b"a", b"b", b"c", b"d", None]), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    keys=keys,
    failures=st.dictionaries(st.integers(0, 39), st.integers(1, 4), max_size=8),
    batch=st.integers(1, 12),
    slices=st.sampled_from([1, 2, 3]),
    lost=st.sets(st.integers(0, 30), max_size=3),
)
def test_no_record_runs_before_an_earlier_record_of_its_key_finished(
    keys: list[bytes | None], failures: dict[int, int], batch: int, slices: int, lost: set[int]
) -> None:
    sim = Simulation(keys, failures, batch)
    for step in range(400):
        sim.step(slices, lose=step in lost)
        if sim.pm.commit_point == len(keys):
            break
    assert sim.pm.commit_point == len(keys), "every record finishes"
    assert {offset for offset, _ in sim.handled} == set(range(len(keys)))


def test_a_failed_record_holds_back_its_key_and_lets_the_others_run() -> None:
    sim = Simulation([b"a", b"a", b"b", b"a", b"b"], {0: 1}, batch=5)
    sim.step(slices=1, lose=False)
    assert sim.handled == [(0, b"a"), (2, b"b"), (4, b"b")]
    assert sim.pm.stats().deferred == 2  # offsets 1 and 3 wait for offset 0

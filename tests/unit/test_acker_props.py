"""Property tests: Storm's XOR acker against a naive reference model of tuple DAGs.

The model keeps, per root, the set of tuples created under it and not yet acked, and the marks
bolts put on it (failed, and the dedup bolt's duplicate / deferred / invalid) with their
errors. The real side builds the same DAG through the bolt API (`root_tuple`,
`Collector.emit/ack/fail/duplicate/defer/invalid`), with every event going to one of 1-3
separate `Acker` ledgers at random, as separate Spark tasks would; the partial ledgers are
merged in random orders (and shapes) and must always agree with the model:

* COMPLETE iff every tuple of the root's tree was acked and nothing marked it,
* FAILED iff some tuple under it failed (whatever else happened, unless marked INVALID),
* PENDING otherwise; the highest mark wins (INVALID > FAILED > DEFERRED > DUPLICATE), and a
  DUPLICATE root still waits for its tree like an unmarked one,

with exactly one ledger entry per root however many tuples the tree holds. Acks also arrive
as a columnar stage gives them, as columns (`Acker.xor_columns`), read back through the dict
(`merge`) and as columns (`Ledger.cut`).

A second property runs the acker's outcome through `task_results` into a real
`PartitionManager` on a fake clock: pending roots get no outcome and time out after
`message_timeout`; late ACKs are applied, late FAILs ignored.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kspout.acker import Acker, Mark, RootState, new_tuple_id
from kspout.bolts import Collector, RootKey, Tuple, root_tuple
from kspout.contract import PartitionTask
from kspout.executor.topology import FetchReport, task_results
from kspout.kafka import Record
from kspout.outcomes import FailReason, OutcomeKind
from kspout.partition_manager import DONE, InFlight, PartitionManager, Waiting
from kspout.policy import Backoff, PartitionPolicy
from kspout.spark.worker import Ledger

MAX_ROOTS = 8
MAX_TUPLES = 40


# -- the reference model ------------------------------------------------------------------------


@dataclass
class ModelTuple:
    roots: frozenset[RootKey]  # the roots whose trees this tuple belongs to
    acked: bool = False
    failed: bool = False

    @property
    def settled(self) -> bool:
        return self.acked or self.failed


@dataclass
class DagModel:
    """Tuples by index; per root, the unacked tuples of its tree and the errors that failed it."""

    tuples: list[ModelTuple] = field(default_factory=list)
    live: dict[RootKey, set[int]] = field(default_factory=dict)
    marks: dict[RootKey, Mark] = field(default_factory=dict)
    errors: dict[RootKey, dict[Mark, set[str]]] = field(default_factory=dict)

    def root(self, key: RootKey) -> int:
        index = len(self.tuples)
        self.tuples.append(ModelTuple(frozenset({key})))
        self.live[key] = {index}
        return index

    def emit(self, anchors: list[int]) -> int:
        roots: frozenset[RootKey] = frozenset().union(*(self.tuples[a].roots for a in anchors))
        index = len(self.tuples)
        self.tuples.append(ModelTuple(roots))
        for root in roots:
            self.live[root].add(index)
        return index

    def ack(self, index: int) -> None:
        t = self.tuples[index]
        t.acked = True
        for root in t.roots:
            self.live[root].discard(index)

    def mark(self, index: int, mark: Mark, error: str | None) -> None:
        for root in self.tuples[index].roots:
            self.marks[root] = max(self.marks.get(root, Mark.NONE), mark)
            if error is not None:
                self.errors.setdefault(root, {}).setdefault(mark, set()).add(error)

    def fail(self, index: int, error: str) -> None:
        self.tuples[index].failed = True
        self.mark(index, Mark.FAILED, error)

    def expected(self, key: RootKey) -> RootState:
        mark = self.marks.get(key, Mark.NONE)
        if mark >= Mark.DEFERRED:
            return {
                Mark.DEFERRED: RootState.DEFERRED,
                Mark.FAILED: RootState.FAILED,
                Mark.INVALID: RootState.INVALID,
            }[mark]
        if self.live[key]:
            return RootState.PENDING
        return RootState.DUPLICATE if mark is Mark.DUPLICATE else RootState.COMPLETE

    def possible_errors(self, key: RootKey) -> set[str | None]:
        """The error the ledger may report: any given with the winning mark (merges reorder)."""
        mark = self.marks.get(key, Mark.NONE)
        if mark in (Mark.FAILED, Mark.INVALID):
            return set(self.errors[key][mark])
        return {None}

    def unsettled(self) -> list[int]:
        return [i for i, t in enumerate(self.tuples) if not t.settled]

    def unsettled_under(self, key: RootKey) -> list[int]:
        return sorted(i for i in self.live[key] if not self.tuples[i].settled)


# -- the real side: the bolt API over partial ledgers -------------------------------------------


def make_record(partition: int, offset: int) -> Record:
    return Record("t", partition, offset, None, b"payload", -1, ())


class Dag:
    """The same DAG built through the bolt API, each event landing in one of `parts` ledgers."""

    def __init__(self, parts: int) -> None:
        self.ackers: list[Acker[RootKey]] = [Acker() for _ in range(parts)]
        self.outs: list[list[Tuple]] = [[] for _ in range(parts)]
        self.collectors = [
            Collector(acker, ("n",), out) for acker, out in zip(self.ackers, self.outs, strict=True)
        ]
        self.tuples: list[Tuple] = []
        self.model = DagModel()

    def add_part(self) -> int:
        """A new ledger (a late task), returning its index."""
        acker: Acker[RootKey] = Acker()
        out: list[Tuple] = []
        self.ackers.append(acker)
        self.outs.append(out)
        self.collectors.append(Collector(acker, ("n",), out))
        return len(self.ackers) - 1

    def root(self, key: RootKey, part: int) -> None:
        t = root_tuple(make_record(*key), self.ackers[part])
        assert t.roots.keys() == {key}
        self.tuples.append(t)
        self.model.root(key)

    def emit(self, anchors: list[int] | None, part: int, *, single: bool = False) -> None:
        index = len(self.tuples)
        if anchors is None:
            self.collectors[part].emit(None, (index,))
        elif single and len(anchors) == 1:
            self.collectors[part].emit(self.tuples[anchors[0]], (index,))
        else:
            self.collectors[part].emit([self.tuples[a] for a in anchors], (index,))
        child = self.outs[part].pop()
        assert child.values == (index,)
        expected_roots = self.model.tuples[self.model.emit(anchors or [])].roots
        # The child carries one id per root, however many anchors share that root.
        assert child.roots.keys() == expected_roots
        self.tuples.append(child)

    def ack(self, index: int, part: int, *, ship: bool = False) -> None:
        t = self.tuples[index]
        if ship:  # the tuple travelled to another task (pickled) before it was acked
            t = pickle.loads(pickle.dumps(t))
        self.collectors[part].ack(t)
        self.model.ack(index)

    def ack_as_columns(self, indices: list[int], part: int) -> None:
        """Ack tuples as a columnar stage does: their ids handed to the ledger as columns, a
        row per (tuple, root), with no `Collector` in between."""
        rows = [(root, id_) for i in indices for root, id_ in self.tuples[i].roots.items()]
        self.ackers[part].xor_columns(
            np.array([partition for (partition, _), _ in rows], np.int64),
            np.array([offset for (_, offset), _ in rows], np.int64),
            np.array([id_ for _, id_ in rows], np.uint64),
        )
        for index in indices:
            self.model.ack(index)

    def fail(self, index: int, part: int) -> None:
        error = f"boom {index}"
        self.collectors[part].fail(self.tuples[index], error)
        self.model.fail(index, error)

    def mark(self, index: int, part: int, mark: Mark) -> None:
        """The dedup bolt's verdicts: each marks the tuple's roots and acks the tuple."""
        collector, t = self.collectors[part], self.tuples[index]
        error = None
        if mark is Mark.DUPLICATE:
            collector.duplicate(t)
        elif mark is Mark.DEFERRED:
            collector.defer(t)
        else:
            error = f"invalid {index}"
            collector.invalid(t, error)
        self.model.mark(index, mark, error)
        self.model.ack(index)

    def merged(self, order: list[int] | None = None) -> Acker[RootKey]:
        total: Acker[RootKey] = Acker()
        for i in order if order is not None else range(len(self.ackers)):
            total.merge(self.ackers[i])
        return total

    def check(self, merged: Acker[RootKey]) -> None:
        model = self.model
        assert {root for root, *_ in merged.entries()} == set(model.live)
        # Constant memory per root: one entry each, however many tuples the trees hold.
        assert len(merged) == len(model.live)
        entries = list(merged.entries())
        assert len(entries) == len(model.live)
        for root, value, mark, error in entries:
            expected = model.expected(root)
            assert merged.state(root) is expected, (root, expected)
            assert mark is model.marks.get(root, Mark.NONE)
            assert 0 <= value < 2**64
            assert (value != 0) == bool(model.live[root]), "the XOR value tracks the tree"
            assert error in model.possible_errors(root)
        for acker in self.ackers:
            assert len(acker) <= len(model.live)


def shipped_and_folded(ackers: list[Acker[RootKey]], model: DagModel) -> Acker[RootKey]:
    """Partial ledgers as Spark carries them: each cut per Kafka partition in columns
    (`Ledger.cut`), pickled, and merged per partition in the order given (what `combine`
    does). Each partition's merged ledger settles as the model says (what `combine` settles
    by); the ledgers are joined back under `(partition, offset)` keys for the other checks."""
    shipped: dict[int, list[Ledger]] = {}
    for acker in ackers:
        for partition, part in Ledger.cut(acker).items():
            shipped.setdefault(partition, []).append(pickle.loads(pickle.dumps(part)))
    folded = {partition: Ledger.merge(parts) for partition, parts in shipped.items()}
    for partition, part in folded.items():
        complete, marked = part.settled()
        mine = [root for root in model.live if root[0] == partition]
        expected = {offset: model.expected((p, offset)) for p, offset in mine}
        assert complete == sorted(o for o, state in expected.items() if state is RootState.COMPLETE)
        marks = {offset for p, offset in model.marks if p == partition}
        assert {offset: state for offset, state, _ in marked} == {o: expected[o] for o in marks}
    joined: Acker[RootKey] = Acker()
    for partition, part in folded.items():
        pairs = zip(part.offsets.tolist(), part.values.tolist(), strict=True)
        joined.values.update(((partition, offset), value) for offset, value in pairs)
        for offset, mark, error in part.marked.marked():
            joined.mark((partition, offset), mark, error)
    return joined


# -- the state machine --------------------------------------------------------------------------


class AckerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dag = Dag(1)
        self.next_offset = [0, 0]

    @initialize(parts=st.integers(1, 3))
    def setup(self, parts: int) -> None:
        self.dag = Dag(parts)

    def _part(self, data: st.DataObject) -> int:
        return data.draw(st.integers(0, len(self.dag.ackers) - 1), label="part")

    def _unsettled(self, data: st.DataObject) -> int:
        return data.draw(st.sampled_from(self.dag.model.unsettled()), label="tuple")

    def _room(self) -> bool:
        return len(self.dag.tuples) < MAX_TUPLES

    @precondition(lambda self: len(self.dag.model.live) < MAX_ROOTS)
    @rule(partition=st.integers(0, 1), data=st.data())
    def new_root(self, partition: int, data: st.DataObject) -> None:
        offset = self.next_offset[partition]
        self.next_offset[partition] += data.draw(st.integers(1, 3), label="gap")
        self.dag.root((partition, offset), self._part(data))

    @precondition(lambda self: self._room() and bool(self.dag.model.unsettled()))
    @rule(data=st.data(), single=st.booleans())
    def emit_anchored(self, data: st.DataObject, single: bool) -> None:
        """Anchored to one or several current inputs (not yet acked), possibly across roots."""
        candidates = self.dag.model.unsettled()
        anchors = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=3), label="anchors"
        )
        self.dag.emit(anchors, self._part(data), single=single)

    @precondition(lambda self: self._room() and bool(self.dag.tuples))
    @rule(data=st.data())
    def emit_anchored_to_any(self, data: st.DataObject) -> None:
        """Anchoring to an already-acked tuple: in Storm a race, here it simply re-opens the
        tree (the child is one more tuple to ack), which the XOR ledger handles alike."""
        anchors = data.draw(
            st.lists(st.integers(0, len(self.dag.tuples) - 1), min_size=1, max_size=3),
            label="anchors",
        )
        self.dag.emit(anchors, self._part(data))

    @precondition(lambda self: self._room())
    @rule(data=st.data())
    def emit_unanchored(self, data: st.DataObject) -> None:
        self.dag.emit(None, self._part(data))

    @precondition(lambda self: bool(self.dag.model.unsettled()))
    @rule(data=st.data(), ship=st.booleans())
    def ack(self, data: st.DataObject, ship: bool) -> None:
        """Any unsettled tuple, in any order: children before parents, across roots."""
        self.dag.ack(self._unsettled(data), self._part(data), ship=ship)

    @precondition(lambda self: bool(self.dag.model.unsettled()))
    @rule(data=st.data())
    def ack_as_columns(self, data: st.DataObject) -> None:
        """Several unsettled tuples at once, as columns (a root may be on several rows)."""
        candidates = self.dag.model.unsettled()
        indices = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique=True),
            label="tuples",
        )
        self.dag.ack_as_columns(indices, self._part(data))
        # Shipped before any reader folded the columns into the dict (as Spark ships them).
        self.dag.check(shipped_and_folded(self.dag.ackers, self.dag.model))

    @precondition(lambda self: bool(self.dag.model.unsettled()))
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        self.dag.fail(self._unsettled(data), self._part(data))

    @precondition(lambda self: bool(self.dag.model.unsettled()))
    @rule(data=st.data(), mark=st.sampled_from([Mark.DUPLICATE, Mark.DEFERRED, Mark.INVALID]))
    def dedup_verdict(self, data: st.DataObject, mark: Mark) -> None:
        self.dag.mark(self._unsettled(data), self._part(data), mark)

    @precondition(lambda self: bool(self.dag.model.live))
    @rule(data=st.data())
    def drain_root(self, data: st.DataObject) -> None:
        """Ack every unsettled tuple of one root's tree, in random order, across ledgers."""
        root = data.draw(st.sampled_from(sorted(self.dag.model.live)), label="root")
        pending = self.dag.model.unsettled_under(root)
        for index in data.draw(st.permutations(pending), label="order"):
            self.dag.ack(index, self._part(data))
        assert self.dag.merged().state(root) is self.dag.model.expected(root)

    @rule(data=st.data())
    def merge_in_any_order_and_shape(self, data: st.DataObject) -> None:
        parts = len(self.dag.ackers)
        order = data.draw(st.permutations(range(parts)), label="order")
        self.dag.check(self.dag.merged(order))
        # A tree of merges (partial results combined before the final merge) agrees too.
        cut = data.draw(st.integers(0, parts), label="cut")
        left, right = self.dag.merged(order[:cut]), self.dag.merged(order[cut:])
        right.merge(left)
        self.dag.check(right)
        # Shipped and folded as Spark's combine step does, it agrees too.
        ackers = [self.dag.ackers[i] for i in order]
        self.dag.check(shipped_and_folded(ackers, self.dag.model))

    @invariant()
    def merged_ledger_matches_model(self) -> None:
        self.dag.check(self.dag.merged())


AckerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestAckerAgainstModel = AckerMachine.TestCase


# -- example-based anchors of the property ------------------------------------------------------


def test_child_acked_before_its_parent_completes_the_root() -> None:
    acker: Acker[RootKey] = Acker()
    out: list[Tuple] = []
    collector = Collector(acker, ("w",), out)
    root = root_tuple(make_record(0, 7), acker)
    collector.emit(root, ("a",))
    collector.emit(root, ("b",))
    a, b = out
    collector.ack(b)
    collector.ack(a)
    assert acker.state((0, 7)) is RootState.PENDING  # the root tuple itself is not acked yet
    collector.ack(root)
    assert acker.state((0, 7)) is RootState.COMPLETE


def test_a_diamond_completes_only_when_the_join_is_acked() -> None:
    acker: Acker[RootKey] = Acker()
    out: list[Tuple] = []
    collector = Collector(acker, ("w",), out)
    root = root_tuple(make_record(0, 0), acker)
    collector.emit(root, ("l",))
    collector.emit(root, ("r",))
    left, right = out
    collector.emit([left, right], ("join",))
    join = out[2]
    assert join.roots.keys() == {(0, 0)}
    for t in (root, left, right):
        collector.ack(t)
    assert acker.state((0, 0)) is RootState.PENDING
    collector.ack(join)
    assert acker.state((0, 0)) is RootState.COMPLETE


def test_a_huge_tree_costs_one_entry() -> None:
    acker: Acker[RootKey] = Acker()
    out: list[Tuple] = []
    collector = Collector(acker, ("n",), out)
    root = root_tuple(make_record(3, 1), acker)
    for i in range(5000):
        collector.emit(root, (i,))
    collector.ack(root)
    assert len(acker) == 1 and acker.state((3, 1)) is RootState.PENDING
    for child in out:
        collector.ack(child)
    assert len(acker) == 1 and acker.state((3, 1)) is RootState.COMPLETE


def test_new_tuple_ids_are_nonzero_64_bit_and_distinct() -> None:
    ids = [new_tuple_id() for _ in range(2000)]
    assert all(0 < i < 2**64 for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_failure_survives_a_merge_in_either_direction() -> None:
    failing: Acker[RootKey] = Acker()
    failing.fail((0, 1), "boom")
    failing.fail((0, 1), "second")
    clean: Acker[RootKey] = Acker()
    clean.xor((0, 1), 5)
    clean.xor((0, 1), 5)
    clean.mark((0, 1), Mark.DUPLICATE)
    for first, second in ((failing, clean), (clean, failing)):
        total: Acker[RootKey] = Acker()
        total.merge(first)
        total.merge(second)
        assert total.state((0, 1)) is RootState.FAILED
        [(_, _, mark, error)] = total.entries()
        assert (mark, error) == (Mark.FAILED, "boom"), "the first error is kept"
    assert list(failing.entries()) == [((0, 1), 0, Mark.FAILED, "boom")]


# -- acker outcomes through task_results into a real PartitionManager ---------------------------

TIMEOUT = 10.0
POLICY = PartitionPolicy(max_retries=5, backoff=Backoff(0.0, 1.0, 0.0), message_timeout=TIMEOUT)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def random_batch(data: st.DataObject, dag: Dag, roots: list[RootKey]) -> None:
    """Random DAG events over `roots`, then a random subset of roots drained to completion."""
    for key in roots:
        dag.root(key, data.draw(st.integers(0, len(dag.ackers) - 1), label="part"))
    steps = data.draw(st.integers(0, 25), label="steps")
    for _ in range(steps):
        part = data.draw(st.integers(0, len(dag.ackers) - 1), label="part")
        unsettled = dag.model.unsettled()
        kind = data.draw(st.sampled_from(["emit", "unanchored", "ack", "fail"]), label="kind")
        if kind == "unanchored" or not unsettled:
            dag.emit(None, part)
        elif kind == "emit":
            anchors = data.draw(st.lists(st.sampled_from(unsettled), min_size=1, max_size=3))
            dag.emit(anchors, part)
        elif kind == "ack":
            dag.ack(data.draw(st.sampled_from(unsettled), label="tuple"), part)
        elif data.draw(st.integers(0, 3), label="fail?") == 0:  # failures are rarer
            dag.fail(data.draw(st.sampled_from(unsettled), label="tuple"), part)
    for key in roots:
        if data.draw(st.booleans(), label="drain"):
            for index in dag.model.unsettled_under(key):
                dag.ack(index, data.draw(st.integers(0, len(dag.ackers) - 1), label="part"))


def expand(outcomes: list[tuple[int, int]]) -> set[int]:
    return {o for start, count in outcomes for o in range(start, start + count)}


@settings(max_examples=120, deadline=None)
@given(
    data=st.data(),
    n=st.integers(1, MAX_ROOTS),
    parts=st.integers(1, 3),
    late_batch=st.booleans(),
    replan=st.booleans(),
)
def test_pending_roots_time_out_in_the_partition_manager_and_late_acks_still_count(
    data: st.DataObject, n: int, parts: int, late_batch: bool, replan: bool
) -> None:
    clock = Clock()
    pm = PartitionManager(POLICY, 0, clock, topic="t", partition=0)
    plan = pm.plan(n, n)
    assert list(plan) == list(range(n))
    task = PartitionTask("t", 0, plan)
    roots = [(0, o) for o in range(n)]
    dag = Dag(parts)
    random_batch(data, dag, roots)
    order = data.draw(st.permutations(range(parts)), label="merge order")
    states = {o: dag.model.expected((0, o)) for o in range(n)}
    complete = {o for o, s in states.items() if s is RootState.COMPLETE}
    failed = {o for o, s in states.items() if s is RootState.FAILED}
    pending = {o for o, s in states.items() if s is RootState.PENDING}

    (result,) = task_results([task], dag.merged(order), [FetchReport(0, (), None)])
    acks = [(o.offset, o.count) for o in result.outcomes if o.kind is OutcomeKind.ACK]
    fails = [o for o in result.outcomes if o.kind is OutcomeKind.FAIL]
    assert expand(acks) == complete
    assert {o.offset for o in fails} == failed
    assert all(o.reason is FailReason.EXCEPTION and o.attempt == 1 for o in fails)
    assert all(o.error in dag.model.possible_errors((0, o.offset)) for o in fails)
    assert all(o.attempt == 1 for o in result.outcomes if o.kind is OutcomeKind.ACK)
    assert len(result.outcomes) == len(acks) + len(fails), "a pending root got an outcome"

    if late_batch:  # the whole batch's result arrives after message_timeout
        clock.now = TIMEOUT + 0.5
        assert pm.expire() == n
    pm.apply(result.outcomes, generation=result.generation)
    stats = pm.stats()
    assert stats.acked == len(complete), "an ACK (late or not) is always applied"
    for o in complete:
        assert pm.state_of(o) is DONE
    if late_batch:
        assert stats.stale >= len(failed), "a late FAIL of a timed-out attempt is ignored"
        for o in failed | pending:
            state = pm.state_of(o)
            assert isinstance(state, Waiting) and state.reason is FailReason.TIMEOUT
    else:
        for o in failed:
            state = pm.state_of(o)
            assert isinstance(state, Waiting) and state.reason is FailReason.EXCEPTION
        for o in pending:  # no outcome: still in flight, waiting for its deadline
            assert isinstance(pm.state_of(o), InFlight)
        clock.now = TIMEOUT + 0.5
        assert pm.expire() == len(pending)
        for o in pending:
            state = pm.state_of(o)
            assert isinstance(state, Waiting) and state.reason is FailReason.TIMEOUT
    timed_out = n if late_batch else len(pending)
    assert pm.stats().timed_out == timed_out
    expected_commit = min(failed | pending, default=n)
    assert pm.commit_point == expected_commit

    if replan:  # the retries go out (attempt 2) before the originals' late outcomes arrive
        retry = pm.plan(n, n)
        assert set(retry) == failed | pending
        assert all(retry.attempt_of(o) == 2 for o in retry)

    # The pending trees complete late (a straggling task's ledger arrives).
    late = dag.add_part()
    for key in sorted((0, o) for o in pending):
        for index in dag.model.unsettled_under(key):
            dag.ack(index, late)
    before = pm.stats()
    (late_result,) = task_results([task], dag.merged(), [FetchReport(0, (), None)])
    pm.apply(late_result.outcomes, generation=late_result.generation)
    after = pm.stats()
    assert after.acked - before.acked == len(pending), "late ACKs after a timeout are applied"
    for o in complete | pending:
        assert pm.state_of(o) is DONE
    for o in failed:  # the late FAIL of attempt 1 changed nothing
        state = pm.state_of(o)
        if replan:
            assert isinstance(state, InFlight) and state.attempt == 2
        else:
            assert isinstance(state, Waiting) and state.attempt == 1
    assert pm.commit_point == min(failed, default=n)

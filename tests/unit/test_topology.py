"""Bolt chains without Kafka or Spark: building topologies, running stages, settling roots.

Records and fetch results are built by hand. `run_chain` plays the part of the Spark backend:
one task (with its own copy of the stage and its own ledger) per upstream partition or
grouping bucket, tuples pickled on their way between stages and routed by the next stage's
grouping, ledgers merged at the end and handed to `task_results`.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from kspout.acker import Acker, RootState
from kspout.bolts import (
    BasicBolt,
    BasicCollector,
    Bolt,
    Collector,
    FunctionBolt,
    RootKey,
    TaskContext,
    Tuple,
    root_tuple,
)
from kspout.columnar import ColumnarBolt, ColumnarOutput
from kspout.contract import PartitionTask, TaskResult
from kspout.errors import ChainError, KafkaAccessDenied, KspoutError
from kspout.executor.task import CUT_SHORT
from kspout.executor.topology import (
    ChainItem,
    FetchReport,
    Stage,
    StageFailed,
    StageRunner,
    Topology,
    root_tuples,
    run_guarded,
    run_later_stage,
    runner_for,
    task_results,
)
from kspout.groupings import Fields, Global, Grouping, Shuffle, stable_hash
from kspout.kafka import FetchResult, Record
from kspout.outcomes import FailReason, Outcome, OutcomeKind, describe_error
from kspout.partition_manager import Plan, Span

ACK, FAIL, GONE = OutcomeKind.ACK, OutcomeKind.FAIL, OutcomeKind.GONE
EXC = FailReason.EXCEPTION


# -- helpers -------------------------------------------------------------------------------------


def record(partition: int, offset: int, value: bytes | None = b"v") -> Record:
    return Record("t", partition, offset, None, value, -1, ())


def sentences(partition: int, texts: Sequence[str], start: int = 0) -> FetchResult:
    return FetchResult([record(partition, start + i, t.encode()) for i, t in enumerate(texts)], [])


def task(partition: int, *spans: Span, generation: int = 0) -> PartitionTask:
    return PartitionTask("t", partition, Plan(spans, generation))


def roundtrip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj))


@dataclass
class Run:
    """What `run_chain` did: each stage's per-task bolt copies, every ledger, the reports."""

    stages: list[list[Stage]] = field(default_factory=list)
    ackers: list[Acker[RootKey]] = field(default_factory=list)
    reports: list[FetchReport] = field(default_factory=list)
    routed: list[list[list[Tuple]]] = field(default_factory=list)  # per stage >= 1, per task

    def merged(self) -> Acker[RootKey]:
        total: Acker[RootKey] = Acker()
        for acker in reversed(self.ackers):  # merge order must not matter
            total.merge(acker)
        return total

    def results(self, tasks: Sequence[PartitionTask]) -> list[TaskResult]:
        return task_results(tasks, self.merged(), self.reports)


def run_chain(
    topology: Topology, fetches: dict[int, FetchResult], width: int = 3, *, batch: int = 0
) -> Run:
    run = Run()
    n = len(topology.stages)

    def route(runner: StageRunner, stage: int, buckets: list[list[Tuple]]) -> None:
        if stage + 1 >= n:
            assert runner.output == [], "the last stage's emits go nowhere"
            return
        grouping = copy.deepcopy(topology.stages[stage + 1].grouping)  # each task's own copy
        assert isinstance(grouping, Grouping)
        for t in runner.output:
            buckets[grouping.route(t, width)].append(roundtrip(t))

    buckets: list[list[Tuple]] = [[] for _ in range(width)]
    copies: list[Stage] = []
    for index, (partition, fetched) in enumerate(sorted(fetches.items())):
        stage = copy.deepcopy(topology.stages[0])
        copies.append(stage)
        acker: Acker[RootKey] = Acker()
        runner = StageRunner(stage, acker, TaskContext("t", 0, index, batch), last=n == 1)
        try:
            runner.run(root_tuples(fetched, acker))
        finally:
            runner.close()
        route(runner, 0, buckets)
        run.ackers.append(acker)
        run.reports.append(FetchReport.of(partition, fetched))
    run.stages.append(copies)
    for s in range(1, n):
        inputs, buckets = buckets, [[] for _ in range(width)]
        run.routed.append(inputs)
        copies = []
        for index, tuples in enumerate(inputs):
            stage = copy.deepcopy(topology.stages[s])
            copies.append(stage)
            acker = Acker()
            runner = StageRunner(stage, acker, TaskContext("t", s, index, batch), last=s == n - 1)
            try:
                runner.run(list(tuples))
            finally:
                runner.close()
            route(runner, s, buckets)
            run.ackers.append(acker)
        run.stages.append(copies)
    return run


# -- bolts ---------------------------------------------------------------------------------------


class Split(BasicBolt):
    outputs = ("word",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        value = tuple_.record.value
        assert value is not None
        for word in value.decode().split():
            collector.emit((word,))


class Count(BasicBolt):
    outputs = ("word", "count")

    def __init__(self, poison: str | None = None) -> None:
        self.poison = poison
        self.counts: Counter[str] = Counter()
        self.contexts: list[TaskContext] = []
        self.cleaned = False

    def prepare(self, context: TaskContext) -> None:
        self.contexts.append(context)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        word = tuple_["word"]
        if word == self.poison:
            raise ValueError(f"poison word {word!r}\nsecond line")
        self.counts[word] += 1
        collector.emit((word, self.counts[word]))

    def cleanup(self) -> None:
        self.cleaned = True


class ForgetWord(Bolt):
    """A rich bolt that forgets to ack the tuples holding one word (acks the rest)."""

    outputs = ("word",)

    def __init__(self, forget: str) -> None:
        self.forget = forget

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        collector.emit(tuple_, tuple_.values)
        if tuple_["word"] != self.forget:
            collector.ack(tuple_)


class Relay(BasicBolt):
    outputs = ("n",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        collector.emit((tuple_.record.offset,))


class Join(Bolt):
    """Pairs up its inputs: emits one tuple anchored to both, then acks both."""

    outputs = ("pair",)

    def __init__(self) -> None:
        self.held: list[Tuple] = []
        self.joined: list[Tuple] = []

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        self.held.append(tuple_)
        if len(self.held) == 2:
            a, b = self.held
            collector.emit([a, b], ((a["n"], b["n"]),))
            collector.ack(a)
            collector.ack(b)
            self.held.clear()


class Sink(Bolt):
    """Holds, acks or fails what it receives, per `mode`."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.held: list[tuple[Tuple, Collector]] = []

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        if self.mode == "ack":
            collector.ack(tuple_)
        elif self.mode == "fail":
            collector.fail(tuple_, "sink refused it")
        else:
            self.held.append((tuple_, collector))


class Detach(Bolt):
    """Emits a copy of its input unanchored (or anchored), then acks the input."""

    outputs = ("n",)

    def __init__(self, anchored: bool) -> None:
        self.anchored = anchored

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        collector.emit(tuple_ if self.anchored else None, (tuple_.record.offset,))
        collector.ack(tuple_)


class Explode(BasicBolt):
    def __init__(self) -> None:
        self.calls = 0

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        self.calls += 1
        raise RuntimeError("downstream broke")


class Chatty(BasicBolt):
    """Emits three tuples per input (into nowhere, when it is the chain's last bolt)."""

    outputs = ("n",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        for i in range(3):
            collector.emit((i,))


def noop(x: object) -> None:
    return None


# -- Topology.of --------------------------------------------------------------------------------


def test_an_empty_chain_is_refused() -> None:
    with pytest.raises(ChainError, match="chain is empty"):
        Topology.of([])


def test_a_chain_cannot_start_with_a_grouping() -> None:
    with pytest.raises(ChainError, match=r"cannot start: Shuffle\(\) at position 0"):
        Topology.of([Shuffle(), noop])


def test_two_groupings_in_a_row_are_refused() -> None:
    with pytest.raises(
        ChainError, match=r"cannot follow another grouping: Global\(\) at position 2"
    ):
        Topology.of([noop, Shuffle(), Global(), noop])


def test_a_trailing_grouping_is_refused() -> None:
    with pytest.raises(ChainError, match=r"ends with a grouping \(Shuffle\(\)\): add a bolt after"):
        Topology.of([Split(), Shuffle()])


def test_fields_must_name_a_declared_output() -> None:
    with pytest.raises(ChainError) as info:
        Topology.of([Split(), Fields("words"), Count()])
    message = str(info.value)
    assert "Fields('words')" in message and "['words']" in message
    assert "('word',)" in message and "outputs = (...)" in message
    # A function declares no outputs, so nothing can be grouped by field after it.
    with pytest.raises(ChainError, match=r"outputs \(\)"):
        Topology.of([noop, Fields("word"), Count()])
    # The check looks at the last bolt of the previous stage, not the first.
    with pytest.raises(ChainError, match="'word'"):
        Topology.of([Split(), Relay(), Fields("word"), Count()])


def test_a_declared_field_in_a_later_stage_is_accepted() -> None:
    topology = Topology.of([Split(), Fields("word"), Count(), Fields("word", "count"), noop])
    assert [type(s.grouping) for s in topology.stages] == [type(None), Fields, Fields]


def test_anything_else_in_the_chain_is_refused_with_its_position() -> None:
    with pytest.raises(ChainError, match="chain item 1 is 42: expected a Bolt"):
        Topology.of([noop, 42])  # type: ignore[list-item]
    assert issubclass(ChainError, KspoutError) and issubclass(ChainError, ValueError)


def test_a_bolt_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(ChainError):
        Topology.of([Split, Shuffle(), Count()])  # type: ignore[list-item]


def test_groupings_cut_the_chain_into_stages() -> None:
    shuffle, fields = Shuffle(), Fields("word")
    topology = Topology.of([noop, Split(), shuffle, Split(), fields, Count(), noop])
    assert [len(s.bolts) for s in topology.stages] == [2, 1, 2]
    assert [s.grouping for s in topology.stages] == [None, shuffle, fields]


def test_functions_become_function_bolts_on_the_record_first_then_on_tuples() -> None:
    def first(r: Record) -> None:
        return None

    def later(t: Tuple) -> None:
        return None

    topology = Topology.of([first, later, Shuffle(), later])
    bolts = [b for s in topology.stages for b in s.bolts]
    assert all(type(b) is FunctionBolt for b in bolts)
    assert [b.on_record for b in bolts if isinstance(b, FunctionBolt)] == [True, False, False]
    assert [b.function for b in bolts if isinstance(b, FunctionBolt)] == [first, later, later]


def test_a_later_function_receives_the_tuple() -> None:
    seen: list[object] = []
    topology = Topology.of([Split(), seen.append])
    acker: Acker[RootKey] = Acker()
    runner = StageRunner(topology.stages[0], acker, TaskContext("t", 0, 0, 0), last=True)
    runner.run(root_tuples(sentences(0, ["a b"]), acker))
    assert [type(x) for x in seen] == [Tuple, Tuple]
    assert [x["word"] for x in seen if isinstance(x, Tuple)] == ["a", "b"]
    assert acker.state((0, 0)) is RootState.COMPLETE


def test_the_handler_fast_path_is_only_for_a_single_function() -> None:
    assert Topology.of(noop).handler is noop
    assert Topology.of([noop]).handler is noop
    assert Topology.of([noop, noop]).handler is None
    assert Topology.of([noop, Shuffle(), noop]).handler is None
    assert Topology.of(Split()).handler is None
    assert Topology.of([FunctionBolt(noop, on_record=False)]).handler is None

    class Sub(FunctionBolt):
        pass

    assert Topology.of([Sub(noop)]).handler is None


# -- running stages -----------------------------------------------------------------------------

WORD_COUNT = [
    ["the quick brown fox", "jumps over the lazy dog", "the end"],
    ["a fox and a dog", "quick quick quick"],
]


def word_count_fetches() -> dict[int, FetchResult]:
    return {p: sentences(p, texts) for p, texts in enumerate(WORD_COUNT)}


def test_a_word_count_across_a_fields_grouping_acks_every_root_and_counts_each_word_once() -> None:
    topology = Topology.of([Split(), Fields("word"), Count()])
    run = run_chain(topology, word_count_fetches(), width=3)
    results = run.results([task(0, Span(0, 3, 1)), task(1, Span(0, 2, 1))])
    assert [r.outcomes for r in results] == [
        [Outcome(0, ACK, 1, count=3)],
        [Outcome(0, ACK, 1, count=2)],
    ]
    counters = [s.bolts[0] for s in run.stages[1]]
    assert all(isinstance(c, Count) for c in counters)
    per_task = [c.counts for c in counters if isinstance(c, Count)]
    everything = Counter(w for texts in WORD_COUNT for t in texts for w in t.split())
    assert sum(per_task, Counter()) == everything
    for word in everything:  # a fields grouping: every tuple of a word in one task
        assert sum(1 for counts in per_task if word in counts) == 1
    assert sum(1 for counts in per_task if counts) >= 2, "all words in one task: no spread"
    for index, c in enumerate(counters):
        assert isinstance(c, Count) and c.cleaned
        assert c.contexts == [TaskContext("t", 1, index, 0)]


@pytest.mark.parametrize("grouped", [True, False], ids=["first-bolt-of-stage", "later-bolt"])
def test_a_bolt_raising_on_one_word_fails_exactly_that_sentence(grouped: bool) -> None:
    chain: list[ChainItem] = [Split(), Fields("word"), Count(poison="lazy")]
    topology = Topology.of(chain if grouped else [Split(), Count(poison="lazy")])
    run = run_chain(topology, word_count_fetches(), width=3)
    results = run.results([task(0, Span(0, 3, 1)), task(1, Span(0, 2, 1))])
    error = "ValueError: poison word 'lazy'"
    assert [r.outcomes for r in results] == [
        [Outcome(0, ACK, 1), Outcome(1, FAIL, 1, EXC, error), Outcome(2, ACK, 1)],
        [Outcome(0, ACK, 1, count=2)],
    ]


def test_an_exception_in_the_first_bolt_fails_its_record_with_the_error_text() -> None:
    def picky(r: Record) -> None:
        if r.offset == 1:
            raise KeyError("id")

    topology = Topology.of([picky, Shuffle(), noop])
    run = run_chain(topology, {0: sentences(0, ["x", "y", "z"])})
    (result,) = run.results([task(0, Span(0, 3, 1))])
    assert result.outcomes == [
        Outcome(0, ACK, 1),
        Outcome(1, FAIL, 1, EXC, "KeyError: 'id'"),
        Outcome(2, ACK, 1),
    ]


def test_a_rich_bolt_that_forgets_to_ack_leaves_its_root_pending() -> None:
    topology = Topology.of([Split(), Shuffle(), ForgetWord("lazy"), Count()])
    run = run_chain(topology, word_count_fetches(), width=2)
    merged = run.merged()
    assert merged.state((0, 1)) is RootState.PENDING
    results = run.results([task(0, Span(0, 3, 1)), task(1, Span(0, 2, 1))])
    assert [r.outcomes for r in results] == [
        [Outcome(0, ACK, 1), Outcome(2, ACK, 1)],  # nothing for offset 1: left to time out
        [Outcome(0, ACK, 1, count=2)],
    ]


def test_emitting_values_that_do_not_match_the_outputs_fails_the_input() -> None:
    class Sloppy(BasicBolt):
        outputs = ("word", "count")

        def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
            collector.emit(("only one",))

    run = run_chain(Topology.of([Sloppy(), Shuffle(), noop]), {0: sentences(0, ["x"])})
    (result,) = run.results([task(0, Span(0, 1, 1))])
    assert result.outcomes == [
        Outcome(0, FAIL, 1, EXC, "ValueError: emitted 1 values for fields ('word', 'count')")
    ]


def join_run(mode: str) -> tuple[Run, Sink, Join]:
    topology = Topology.of([Relay(), Global(), Join(), Sink(mode)])
    run = run_chain(topology, {0: sentences(0, ["x"]), 1: sentences(1, ["y"])}, width=2)
    join_stage = run.stages[1][0]  # Global: everything reached task 0
    assert run.routed[0][1] == []
    join, sink = join_stage.bolts
    assert isinstance(join, Join) and isinstance(sink, Sink)
    return run, sink, join


JOIN_TASKS = [task(0, Span(0, 1, 1)), task(1, Span(0, 1, 1))]


def test_a_tuple_joining_two_roots_completes_both_only_when_it_is_acked() -> None:
    run, sink, join = join_run("hold")
    assert join.held == []
    ((joined, collector),) = sink.held
    assert joined.roots.keys() == {(0, 0), (1, 0)}
    assert [r.outcomes for r in run.results(JOIN_TASKS)] == [[], []], "joined tuple not acked"
    collector.ack(joined)
    assert [r.outcomes for r in run.results(JOIN_TASKS)] == [
        [Outcome(0, ACK, 1)],
        [Outcome(0, ACK, 1)],
    ]


def test_failing_a_tuple_joining_two_roots_fails_both() -> None:
    run, _, _ = join_run("fail")
    assert [r.outcomes for r in run.results(JOIN_TASKS)] == [
        [Outcome(0, FAIL, 1, EXC, "sink refused it")],
        [Outcome(0, FAIL, 1, EXC, "sink refused it")],
    ]


def test_an_acked_join_acks_both_roots() -> None:
    run, _, _ = join_run("ack")
    assert [r.outcomes for r in run.results(JOIN_TASKS)] == [
        [Outcome(0, ACK, 1)],
        [Outcome(0, ACK, 1)],
    ]


def test_an_unanchored_emit_leaves_the_tree() -> None:
    run = run_chain(
        Topology.of([Detach(anchored=False), Shuffle(), Explode()]), {0: sentences(0, ["x", "y"])}
    )
    explosions = sum(s.bolts[0].calls for s in run.stages[1] if isinstance(s.bolts[0], Explode))
    assert explosions == 2, "the detached tuples did run downstream"
    for inputs in run.routed[0]:
        assert all(t.roots == {} for t in inputs)
    (result,) = run.results([task(0, Span(0, 2, 1))])
    assert result.outcomes == [Outcome(0, ACK, 1, count=2)]


def test_the_same_emit_anchored_does_carry_the_downstream_failure() -> None:
    run = run_chain(
        Topology.of([Detach(anchored=True), Shuffle(), Explode()]), {0: sentences(0, ["x"])}
    )
    (result,) = run.results([task(0, Span(0, 1, 1))])
    assert result.outcomes == [Outcome(0, FAIL, 1, EXC, "RuntimeError: downstream broke")]


def test_emits_of_the_last_bolt_go_nowhere_and_keep_no_root_pending() -> None:
    chains: list[list[ChainItem]] = [
        [Chatty()],
        [Split(), Shuffle(), Chatty()],
        [Split(), Chatty()],
    ]
    for chain in chains:
        run = run_chain(Topology.of(chain), {0: sentences(0, ["a b", "c"])})
        assert len(run.merged()) == 2
        (result,) = run.results([task(0, Span(0, 2, 1))])
        assert result.outcomes == [Outcome(0, ACK, 1, count=2)], chain


def test_a_stage_batches_its_first_bolt_then_runs_the_rest_depth_first() -> None:
    log: list[str] = []

    class Tag(BasicBolt):
        outputs = ("n",)

        def prepare(self, context: TaskContext) -> None:
            log.append(f"prepare {context.stage}/{context.task}/{context.batch}")

        def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
            log.append(f"tag {tuple_.record.offset}")
            collector.emit((tuple_.record.offset,))

        def cleanup(self) -> None:
            log.append("cleanup")

    class Mid(BasicBolt):
        outputs = ("word",)

        def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
            log.append(f"mid {tuple_['n']}")
            collector.emit((f"{tuple_['n']}a",))
            collector.emit((f"{tuple_['n']}b",))

    def sink(t: Tuple) -> None:
        log.append(f"sink {t['word']}")

    acker: Acker[RootKey] = Acker()
    stage = Topology.of([Tag(), Mid(), sink]).stages[0]
    runner = StageRunner(stage, acker, TaskContext("t", 0, 4, 9), last=True)
    assert log == ["prepare 0/4/9"]
    runner.run(root_tuples(sentences(0, ["x", "y"]), acker))
    runner.close()
    assert log == [
        "prepare 0/4/9",
        *["tag 0", "tag 1"],  # the first bolt takes the task's whole input at once
        *["mid 0", "sink 0a", "sink 0b", "mid 1", "sink 1a", "sink 1b"],  # then depth first
        "cleanup",
    ]
    assert [acker.state((0, o)) for o in (0, 1)] == [RootState.COMPLETE] * 2


class Batcher(Bolt):
    """Takes each task's input in one call, and acks it all."""

    outputs = ("word",)

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        self.batches.append([t["word"] for t in tuples])
        for t in tuples:
            collector.ack(t)


def test_the_first_bolt_of_each_stage_sees_its_task_input_in_one_batch() -> None:
    run = run_chain(Topology.of([Split(), Fields("word"), Batcher()]), word_count_fetches(), 2)
    for inputs, stage in zip(run.routed[0], run.stages[1], strict=True):
        bolt = stage.bolts[0]
        assert isinstance(bolt, Batcher)
        assert bolt.batches == [[t["word"] for t in inputs]]
    results = run.results([task(0, Span(0, 3, 1)), task(1, Span(0, 2, 1))])
    assert [r.outcomes for r in results] == [
        [Outcome(0, ACK, 1, count=3)],
        [Outcome(0, ACK, 1, count=2)],
    ]


class Verdicts(Bolt):
    """The dedup bolt's verdicts by offset: duplicate, deferred, invalid, or pass it on."""

    outputs = ("n",)

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        offset = tuple_.record.offset
        if offset == 0:
            collector.duplicate(tuple_)
        elif offset == 1:
            collector.defer(tuple_)
        elif offset == 2:
            collector.invalid(tuple_, "no id")
        else:
            collector.emit(tuple_, (offset,))
            collector.ack(tuple_)


def test_dedup_verdicts_on_roots_become_their_outcomes() -> None:
    run = run_chain(Topology.of([Verdicts(), Shuffle(), noop]), {0: sentences(0, ["m"] * 4)})
    (result,) = run.results([task(0, Span(0, 4, 3))])
    assert result.outcomes == [
        Outcome(0, OutcomeKind.DUPLICATE, 3),
        Outcome(1, OutcomeKind.DEFERRED, 3),
        Outcome(2, FAIL, 3, FailReason.INVALID, "no id"),
        Outcome(3, ACK, 3),
    ]


def test_run_stage_feeds_routed_tuples_into_a_later_stage_and_collects_its_output() -> None:
    acker: Acker[RootKey] = Acker()
    first = StageRunner(Stage((Split(),), None), acker, TaskContext("t", 0, 0, 0), last=False)
    first.run(root_tuples(sentences(0, ["a b"]), acker))
    assert [t["word"] for t in first.output] == ["a", "b"]
    second = StageRunner(Stage((Count(),), Shuffle()), acker, TaskContext("t", 1, 0, 0), last=False)
    second.run([roundtrip(t) for t in first.output])
    assert [t.values for t in second.output] == [("a", 1), ("b", 1)]
    assert acker.state((0, 0)) is RootState.PENDING  # the stage's output is not acked yet
    for t in second.output:
        Collector(acker, (), None).ack(t)
    assert acker.state((0, 0)) is RootState.COMPLETE


class CountWithoutItsStore(Count):
    def prepare(self, context: TaskContext) -> None:
        raise ConnectionError("the counts store is down")


def test_a_later_stage_whose_prepare_raises_releases_the_roots_of_its_input() -> None:
    """Not its records' fault: their roots come back RELEASED (offered again without spending
    an attempt), not pending until they time out."""
    acker: Acker[RootKey] = Acker()
    first = StageRunner(Stage((Split(),), None), acker, TaskContext("t", 0, 0, 0), last=False)
    first.run(root_tuples(sentences(0, ["a b", "c"]), acker))
    stage = Stage((CountWithoutItsStore(),), Shuffle())
    output = run_later_stage(
        [roundtrip(t) for t in first.output],
        acker,
        lambda: StageRunner(stage, acker, TaskContext("t", 1, 0, 0), last=True),
    )
    assert not output.rows
    assert [acker.state((0, o)) for o in (0, 1)] == [RootState.RELEASED] * 2


REFUSED = KafkaAccessDenied("User:a", "Write", "out", "k:9093", "t.toml", "not authorized")


def publish_refused(_tuple: Tuple) -> None:
    """A later stage's function whose `KafkaOutput` lost Write on its topic."""
    raise REFUSED


class PublishRefusedColumns(ColumnarBolt):
    """A later columnar stage whose output lost Write on its topic."""

    def process_batch(self, batch: Any, out: ColumnarOutput) -> None:
        raise REFUSED


@pytest.mark.parametrize(
    "refusing", ["row", "columnar", None], ids=["refused", "refused-columnar", "other-error"]
)
def test_a_refusal_in_a_later_stage_releases_its_roots_and_reaches_the_result(
    refusing: str | None,
) -> None:
    """Kafka refusing the principal in a later stage is not the records' fault and no retry
    cures it: their roots are RELEASED (nothing fails, nothing is dead-lettered) and the
    partition's result carries the refusal, across a pickled ledger, as a first stage's
    refusal does, so the run stops. Any other failure of the stage's task is a plain release."""
    acker: Acker[RootKey] = Acker()
    first = StageRunner(Stage((Split(),), None), acker, TaskContext("t", 0, 0, 0), last=False)
    first.run(root_tuples(sentences(0, ["a b", "c"]), acker))
    bolts: dict[str | None, Bolt] = {
        "row": FunctionBolt(publish_refused, on_record=False),
        "columnar": PublishRefusedColumns(),
        None: CountWithoutItsStore(),
    }
    stage = Stage((bolts[refusing],), Shuffle())
    later: Acker[RootKey] = Acker()
    run_later_stage(
        roundtrip(first.chunk),  # as a grouping hands it over
        later,
        lambda: runner_for(stage, later, TaskContext("t", 1, 0, 0), last=True),
    )
    acker.merge(roundtrip(later))
    (result,) = task_results([task(0, Span(0, 2, 1))], acker, [FetchReport(0, (), None)])
    assert {o.kind for o in result.outcomes} == {OutcomeKind.RELEASED}
    if refusing is not None:
        assert isinstance(result.refused, KafkaAccessDenied)
        assert str(result.refused) == str(REFUSED)
        assert result.infra_error == describe_error(REFUSED)
    else:
        assert result.refused is None
        assert result.infra_error == "ConnectionError: the counts store is down"


class FlushesInCleanup(BasicBolt):
    """Keeps its collector and emits once more after the last `process` returned."""

    outputs = ("word",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        self.kept = collector
        collector.emit(("seen",))

    def cleanup(self) -> None:
        self.kept.emit(("late",))


def test_a_basic_bolt_emitting_after_process_returned_fails_its_stage_not_its_root() -> None:
    """The late emit would be anchored to the last input after that input's ids reached the
    ledger: shipped, its root could never complete. The stage fails instead (roots RELEASED)."""
    acker: Acker[RootKey] = Acker()
    stage = Stage((FlushesInCleanup(),), None)
    runner = StageRunner(stage, acker, TaskContext("t", 0, 0, 0), last=False)
    with pytest.raises(StageFailed, match="emits only inside process"):
        run_guarded(root_tuples(sentences(0, ["a", "b"]), acker), lambda: runner)
    assert [t["word"] for t in runner.output] == ["seen", "seen"]


# -- groupings ----------------------------------------------------------------------------------


def word_tuple(word: object) -> Tuple:
    return Tuple((word,), ("word",), {})


WORDS = ["kafka", "storm", "spark", "zookeeper", "redis", "ébène", "", "a b"]
HASHED: list[object] = [*WORDS, b"bytes", 42, -7, 3.5, None, ("kafka", 1), (b"k", ("n", 2))]

_CHILD = """
import json, sys
from kspout.bolts import Tuple
from kspout.groupings import Fields, stable_hash
values = eval(sys.stdin.read())
print(json.dumps({
    "hash": hash("kafka"),
    "stable": [stable_hash(v) for v in values],
    "routes": [Fields("word").route(Tuple((w,), ("word",), {}), 7) for w in values],
}))
"""


def in_child(seed: str, values: Sequence[object]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=repr(list(values)),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result = json.loads(done.stdout)
    assert isinstance(result, dict)
    return result


def test_fields_routes_equal_values_to_the_same_task_in_every_process() -> None:
    here = {
        "stable": [stable_hash(v) for v in HASHED],
        "routes": [Fields("word").route(word_tuple(w), 7) for w in HASHED],
    }
    children = [in_child(seed, HASHED) for seed in ("1", "2")]
    assert children[0]["hash"] != children[1]["hash"], "the seeds do salt hash()"
    for child in children:
        assert child["stable"] == here["stable"]
        assert child["routes"] == here["routes"]
    assert len(set(here["routes"])) > 2, "a constant route would pass trivially"


def test_fields_routes_by_every_named_field_and_ignores_the_others() -> None:
    grouping = Fields("word", "lang")

    def t(word: str, lang: str, n: int) -> Tuple:
        return Tuple((word, lang, n), ("word", "lang", "n"), {})

    for word in WORDS:
        assert grouping.route(t(word, "en", 1), 16) == grouping.route(t(word, "en", 99), 16)
    assert {grouping.route(t(w, lang, 0), 16) for w in WORDS for lang in ("en", "fr")} != {0}
    # The second field counts too: some word goes elsewhere in another language.
    assert any(
        grouping.route(t(w, "en", 0), 16) != grouping.route(t(w, "fr", 0), 16) for w in WORDS
    )
    assert all(0 <= grouping.route(t(w, "fr", 0), 5) < 5 for w in WORDS)
    with pytest.raises(ValueError, match="at least one field"):
        Fields()


def test_fields_routes_equal_set_values_alike_in_every_process() -> None:
    values = [frozenset({"apple", "kafka", "storm", "spark"})]
    children = [in_child(seed, values) for seed in ("1", "2", "3")]
    assert len({tuple(c["stable"]) for c in children}) == 1


@pytest.mark.parametrize(
    ("a", "b"),
    [({"id": 1, "kind": "x"}, {"kind": "x", "id": 1}), (1, 1.0)],
    ids=["dict-order", "int-float"],
)
def test_fields_routes_equal_values_of_different_repr_to_the_same_task(
    a: object, b: object
) -> None:
    assert a == b
    grouping = Fields("word")
    assert grouping.route(word_tuple(a), 1 << 20) == grouping.route(word_tuple(b), 1 << 20)


def test_shuffle_spreads_evenly() -> None:
    shuffle = Shuffle()
    for tasks in (1, 3, 4, 7):
        routes = Counter(shuffle.route(word_tuple(i), tasks) for i in range(tasks * 25))
        assert sorted(routes) == list(range(tasks))
        assert set(routes.values()) == {25}


def test_shuffle_spreads_evenly_across_independent_upstream_copies() -> None:
    shipped = pickle.dumps(Shuffle())
    routes = Counter(pickle.loads(shipped).route(word_tuple(i), 4) for i in range(40))
    assert max(routes.values()) <= 20, routes


def test_global_routes_everything_to_task_zero() -> None:
    grouping = Global()
    assert {grouping.route(word_tuple(w), n) for w in WORDS for n in (1, 2, 9)} == {0}
    run = run_chain(Topology.of([Split(), Global(), Count()]), word_count_fetches(), width=4)
    words = sum(len(t.split()) for texts in WORD_COUNT for t in texts)
    assert [len(inputs) for inputs in run.routed[0]] == [words, 0, 0, 0]


# -- task_results --------------------------------------------------------------------------------


def test_gone_ranges_and_out_of_range_from_fetch_reports_appear_in_the_results() -> None:
    fetched = FetchResult(
        [record(0, 0, b"a"), record(0, 1, b"b"), record(0, 4, b"c")], [(2, 4)], (0, 5)
    )
    run = run_chain(Topology.of([Split(), Shuffle(), noop]), {0: fetched, 1: sentences(1, [])})
    results = run.results([task(0, Span(0, 10, 1)), task(1, Span(0, 3, 2)), task(2, Span(0, 1, 1))])
    assert results[0].outcomes == [
        Outcome(0, ACK, 1, count=2),
        Outcome(2, GONE, None, count=2),
        Outcome(4, ACK, 1),
        Outcome(5, OutcomeKind.RELEASED, 1, error=CUT_SHORT, count=5),  # never fetched
    ]
    assert results[0].out_of_range == (0, 5)
    assert (results[1].outcomes, results[1].out_of_range) == ([], None)
    assert (results[2].outcomes, results[2].out_of_range) == ([], None)
    assert [(r.topic, r.partition) for r in results] == [("t", 0), ("t", 1), ("t", 2)]


def test_missing_ranges_of_several_reports_for_one_partition_accumulate() -> None:
    acker: Acker[RootKey] = Acker()
    root_tuple(record(0, 5), acker)  # pending: no outcome
    reports = [FetchReport(0, ((0, 2),), None), FetchReport(0, ((3, 5), (6, 8)), (3, 9), reached=8)]
    (result,) = task_results([task(0, Span(0, 8, 1))], acker, reports)
    assert result.outcomes == [
        Outcome(0, GONE, count=2),
        Outcome(3, GONE, count=2),
        Outcome(6, GONE, count=2),
    ]
    assert result.out_of_range == (3, 9)


def test_acks_come_back_as_counted_runs_per_attempt_split_by_failures() -> None:
    fetched = sentences(0, ["ok"] * 5 + ["ok", "bad", "ok", "ok", "ok"])

    def check(r: Record) -> None:
        if r.value == b"bad":
            raise ValueError("bad")

    run = run_chain(Topology.of([check, Shuffle(), noop]), {0: fetched})
    (result,) = run.results([task(0, Span(0, 5, 2), Span(5, 10, 1), generation=4)])
    assert result.generation == 4
    assert result.outcomes == [
        Outcome(0, ACK, 2, count=5),
        Outcome(5, ACK, 1),
        Outcome(6, FAIL, 1, EXC, "ValueError: bad"),
        Outcome(7, ACK, 1, count=3),
    ]


def test_roots_of_partitions_not_in_the_tasks_are_left_out() -> None:
    run = run_chain(Topology.of([Split(), Shuffle(), noop]), word_count_fetches())
    results = run.results([task(1, Span(0, 2, 1))])
    assert [(r.partition, r.outcomes) for r in results] == [(1, [Outcome(0, ACK, 1, count=2)])]


# -- tuples ---------------------------------------------------------------------------------------


def test_tuples_pickle_round_trip_with_their_roots() -> None:
    acker: Acker[RootKey] = Acker()
    out: list[Tuple] = []
    collector = Collector(acker, ("word", "n"), out)
    a = root_tuple(record(0, 3, b"x"), acker)
    b = root_tuple(record(1, 8, b"y"), acker)
    collector.emit([a, b], ("w", 1))
    (child,) = out
    for original in (a, child):
        copy = roundtrip(original)
        assert type(copy) is Tuple and copy is not original
        assert (copy.values, copy.fields, copy.roots) == (
            original.values,
            original.fields,
            original.roots,
        )
    assert roundtrip(a).record == record(0, 3, b"x")
    assert roundtrip(child)["n"] == 1
    # The unpickled copies carry the ids that settle the trees, in another task's ledger.
    other: Acker[RootKey] = Acker()
    for t in (a, b, child):
        Collector(other, (), None).ack(roundtrip(t))
    acker.merge(other)
    assert [acker.state(r) for r in ((0, 3), (1, 8))] == [RootState.COMPLETE] * 2


def test_tuple_fields_by_name_and_position() -> None:
    t = Tuple(["w", 2], ("word", "count"), {})
    assert (t["word"], t["count"], t[0], t[1]) == ("w", 2, "w", 2)
    assert t.values == ("w", 2)
    with pytest.raises(KeyError, match="no field 'lang'"):
        t["lang"]
    assert repr(t) == "Tuple(word='w', count=2)"


class EmitOffset(BasicBolt):
    outputs = ("x",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        collector.emit((tuple_.record.offset,))


def test_a_basic_bolt_keeps_no_task_state_so_it_pickles_as_built() -> None:
    """Spark ships the bolt object with every job: one that ran in-process before (a local
    run, a warm-up) must not carry that run's collector, ledger or tuples along."""
    bolt = EmitOffset()
    built = pickle.dumps(bolt)
    acker: Acker[RootKey] = Acker()
    runner = StageRunner(
        Topology.of([bolt]).stages[0], acker, TaskContext("t", 0, 0, 0), last=False
    )
    runner.run(root_tuples(FetchResult([record(0, o) for o in range(500)], []), acker))
    runner.close()
    assert len(runner.output) == 500
    assert pickle.dumps(bolt) == built


# -- the dedup bolt only at the start of the chain -----------------------------------------------


def _dedup_bolt() -> Bolt:
    from dedup import IdempotencyBolt
    from kspout.config import parse_config

    config = parse_config({"topic": "t", "spout_id": "s"})
    return IdempotencyBolt(lambda record, effects: None, config)


@pytest.mark.parametrize(
    ("chain", "position"),
    [
        (lambda bolt: [Split(), bolt], 1),
        (lambda bolt: [Split(), Shuffle(), bolt], 2),
        (lambda bolt: [lambda record: None, bolt], 1),
        (lambda bolt: [Split(), Fields("word"), Relay(), Global(), bolt], 4),
    ],
)
def test_the_dedup_bolt_anywhere_but_first_is_refused(chain: Any, position: int) -> None:
    """After a fan-out, sibling tuples share their root's id: the first would lease it and the
    rest be found DONE (one effect of several applied, the root acked as DUPLICATE)."""
    with pytest.raises(ChainError) as caught:
        Topology.of(chain(_dedup_bolt()))
    message = str(caught.value)
    assert f"IdempotencyBolt at position {position} must be the chain's only item" in message
    assert "same id" in message and "acked as duplicates" in message


def test_the_dedup_bolt_alone_is_accepted() -> None:
    bolt = _dedup_bolt()
    for spec in (bolt, [bolt]):
        topology = Topology.of(spec)
        assert topology.stages == (Stage((bolt,), None),)


def test_must_be_first_is_a_bolt_attribute_the_chain_checks_without_knowing_dedup() -> None:
    """kspout never imports dedup: any bolt may ask to be first."""

    class Gate(BasicBolt):
        must_be_first = True

        def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
            collector.emit(tuple_.record)

    assert len(Topology.of([Gate(), Split()]).stages[0].bolts) == 2
    with pytest.raises(ChainError, match="Gate at position 1 must be the chain's first item"):
        Topology.of([Split(), Gate()])
    assert not Bolt.must_be_first and not Split.must_be_first


def test_the_topology_module_imports_nothing_from_dedup() -> None:
    code = (
        "import sys, kspout.executor.topology, kspout.spout; "
        "print(sorted(m for m in sys.modules if m == 'dedup' or m.startswith('dedup.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""Columnar bolts: where the chain accepts them, what a batch holds, and what an answer means."""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
import pytest

from kspout import BasicBolt, BasicCollector, ColumnarBolt, ColumnarOutput, Fields, Shuffle, Tuple
from kspout.acker import Acker, RootState
from kspout.bolts import Chunk, TaskContext
from kspout.channel.beacon import thread_beacon
from kspout.columnar import RECORD_COLUMNS, ArrowChunk
from kspout.errors import ChainError
from kspout.executor.topology import Topology, first_input, run_guarded, runner_for
from kspout.groupings import stable_hash
from kspout.kafka import FetchResult, Record
from kspout.kafka.records import RecordColumns
from kspout_demo.word_count import CountWords, SplitWords, columnar_word_count


class Pass(BasicBolt):
    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        collector.emit((tuple_.record.value,))


class Answer(ColumnarBolt):
    """Runs `answer(batch, out)`, keeping the batch it saw."""

    outputs = ("word",)

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        self.seen = batch
        self.answer(batch, out)


def records(*values: bytes) -> FetchResult:
    return FetchResult([Record("t", 3, 10 + i, b"k", v, 7, ()) for i, v in enumerate(values)], [])


def run_first(bolt: ColumnarBolt, fetched: FetchResult, *, last: bool = False) -> tuple[Any, Any]:
    """Stage 0 over `fetched`: (the ledger, what the stage emitted)."""
    acker: Acker[tuple[int, int]] = Acker()
    topology = Topology.of(bolt)
    roots = first_input(topology, fetched, acker)
    context = TaskContext("t", 0, 0, 0)
    runner = run_guarded(roots, lambda: runner_for(topology.stages[0], acker, context, last=last))
    return acker, runner.chunk


@pytest.mark.parametrize(
    "chain",
    [
        lambda: [Pass(), SplitWords()],
        lambda: [SplitWords(), Pass()],
        lambda: [SplitWords(), Fields("word"), CountWords(), Pass()],
    ],
)
def test_a_columnar_bolt_sharing_a_stage_is_refused_with_what_to_do(chain: Any) -> None:
    with pytest.raises(ChainError) as caught:
        Topology.of(chain())
    message = str(caught.value)
    assert "is a ColumnarBolt and shares a stage with" in message
    assert "Put a grouping (Shuffle() when any task will do)" in message


def test_row_and_columnar_stages_mix_across_groupings() -> None:
    topology = Topology.of([Pass(), Shuffle(), SplitWords(), Fields("word"), CountWords()])
    assert [len(stage.bolts) for stage in topology.stages] == [1, 1, 1]


def test_the_dedup_bolt_after_a_columnar_bolt_is_refused() -> None:
    from dedup import IdempotencyBolt
    from kspout.config import parse_config

    bolt = IdempotencyBolt(
        lambda record, effects: None, parse_config({"topic": "t", "spout_id": "s"})
    )
    with pytest.raises(ChainError, match="IdempotencyBolt at position 2 must be the chain's only"):
        Topology.of([SplitWords(), Shuffle(), bolt])


def test_the_first_stage_sees_the_records_as_columns() -> None:
    bolt = Answer(lambda batch, out: None)
    run_first(bolt, records(b"a b", b"c"))
    assert bolt.seen.schema.names == [name for name, _ in RECORD_COLUMNS]
    assert bolt.seen.to_pydict() == {
        "partition": [3, 3],
        "offset": [10, 11],
        "key": [b"k", b"k"],
        "value": [b"a b", b"c"],
        "timestamp": [7, 7],
    }


def test_rows_not_failed_are_acked_and_emits_anchor_to_their_row() -> None:
    def answer(batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.emit([0, 0, 2], {"word": ["x", "y", "z"]})
        out.fail([1], "no")

    acker, emitted = run_first(Answer(answer), records(b"a", b"b", b"c", b"d"))
    assert acker.state((3, 11)) is RootState.FAILED
    assert acker.state((3, 13)) is RootState.COMPLETE  # neither failed nor emitted: acked
    assert acker.state((3, 10)) is acker.state((3, 12)) is RootState.PENDING  # words unacked
    assert [(t["word"], t.roots.keys()) for t in emitted] == [
        ("x", {(3, 10)}),
        ("y", {(3, 10)}),
        ("z", {(3, 12)}),
    ]
    ledger = Acker[tuple[int, int]]()
    for tuple_ in emitted:  # the next stage acks the words: their roots complete
        for root, id_ in tuple_.roots.items():
            ledger.xor(root, id_)
    acker.merge(ledger)
    assert acker.state((3, 10)) is acker.state((3, 12)) is RootState.COMPLETE


def test_a_mask_fails_rows_with_a_reason_each() -> None:
    def answer(batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.fail(pc.equal(batch.column("value"), b"bad"), "bad value")

    acker, _ = run_first(Answer(answer), records(b"bad", b"ok", b"bad"))
    _, marked = acker.settled()
    assert sorted(marked) == [
        ((3, 10), RootState.FAILED, "bad value"),
        ((3, 12), RootState.FAILED, "bad value"),
    ]


def test_each_failed_row_may_have_its_own_reason() -> None:
    def answer(batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.fail([2, 0], pa.array(["two", "zero"]))
        out.fail([0], "a second reason is not kept")

    acker, _ = run_first(Answer(answer), records(b"a", b"b", b"c"))
    _, marked = acker.settled()
    assert sorted(marked) == [
        ((3, 10), RootState.FAILED, "zero"),
        ((3, 12), RootState.FAILED, "two"),
    ]


def test_an_exception_fails_every_row_with_what_was_raised() -> None:
    def answer(batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.emit([0], {"word": ["x"]})
        raise RuntimeError("the batch is broken")

    acker, emitted = run_first(Answer(answer), records(b"a", b"b"))
    assert len(emitted) == 1  # like a BasicBolt's emits before it raised, they travel on
    _, marked = acker.settled()
    assert [state for _, state, _ in marked] == [RootState.FAILED] * 2
    assert all("RuntimeError('the batch is broken')" in str(error) for _, _, error in marked)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (lambda b, out: out.emit([0], {"other": ["x"]}), "emit exactly those columns"),
        (lambda b, out: out.emit([0, 1], {"word": ["x"]}), "2 anchor rows for 1 emitted rows"),
        (lambda b, out: out.emit([5], {"word": ["x"]}), "outside the batch's 2 rows"),
        (lambda b, out: out.fail(pa.array([True]), "x"), "a mask of 1 rows for a batch of 2"),
    ],
)
def test_a_malformed_answer_fails_the_batch_saying_what_is_wrong(answer: Any, error: str) -> None:
    acker, _ = run_first(Answer(answer), records(b"a", b"b"))
    _, marked = acker.settled()
    assert len(marked) == 2 and all(error in str(note) for _, _, note in marked)


def test_the_last_stage_emits_nowhere_and_leaves_no_ids_behind() -> None:
    acker, emitted = run_first(
        Answer(lambda b, out: out.emit([0], {"word": ["x"]})), records(b"a"), last=True
    )
    assert len(emitted) == 0 and acker.state((3, 10)) is RootState.COMPLETE


def test_working_on_names_the_row_for_the_per_message_timeout() -> None:
    seen = []

    def answer(batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.working_on(1)
        seen.append(thread_beacon().current.roots)
        out.working_on(None)
        seen.append(thread_beacon().current)

    run_first(Answer(answer), records(b"a", b"b"))
    assert seen[0].keys() == {(3, 11)} and seen[1] is None


def test_fields_routes_a_column_as_it_routes_tuples() -> None:
    words = ["storm", "spark", "kafka", None, "storm", "bolt"]
    rows = [((w,), (0, i), i + 1) for i, w in enumerate(words)]
    chunk = Chunk(("word",), rows)
    by_rows = Fields("word").split(chunk, 3)
    by_columns = Fields("word").split(ArrowChunk.of(chunk), 3)
    assert [p.rows for p in by_rows] == [p.rows().rows for p in by_columns]  # type: ignore[union-attr]
    assert all(stable_hash((row[0][0],)) % 3 == i for i, p in enumerate(by_rows) for row in p.rows)  # type: ignore[union-attr]


def test_the_columnar_word_count_splits_like_str_split_and_counts() -> None:
    fetched = records(b"  the cow  jumped", b"", b"the moon")
    split = SplitWords()
    _, emitted = run_first(split, fetched)
    assert [t["word"] for t in emitted] == ["the", "cow", "jumped", "the", "moon"]
    count = CountWords()
    count.prepare(TaskContext("t", 1, 0, 0))
    count.process_batch(emitted.batch, ColumnarOutput((), emitted))
    assert count.counts == {"the": 2, "cow": 1, "jumped": 1, "moon": 1}
    note = SplitWords("note")
    _, emitted = run_first(note, records(b'{"id":1,"note":"a day"}', b"{}"))
    assert [t["word"] for t in emitted] == ["a", "day"]
    assert len(Topology.of(columnar_word_count()).stages) == 2


class Attempts:
    """Redis's INCR for the demo's attempt counters (a pure-logic test of the bolt's columns)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def incr(self, key: str) -> int:
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]


def test_the_demos_columnar_split_strikes_the_faults_of_the_row_split() -> None:
    import json

    from kspout_demo.jobs import ColumnarCountWord, ColumnarSplitSentence

    kinds = ["none", "flaky", "late", "poison", "late"]
    values = [
        json.dumps({"id": n, "text": f"w{n} x y", "inject": k}, separators=(",", ":")).encode()
        for n, k in enumerate(kinds)
    ]
    attempts = Attempts()

    class Split(ColumnarSplitSentence):
        def prepare(self, context: TaskContext) -> None:
            self.redis = attempts  # type: ignore[assignment]

    split = Split("redis://unused", "job", 0.0)
    acker, emitted = run_first(split, records(*values))
    failed = {root: str(note) for root, _, note in acker.settled()[1]}
    assert failed == {
        (3, 11): "injected failure of message 1, first attempt",
        (3, 13): "poison message 3",
    }
    rows = [(t["word"], t["fail"], next(iter(t.roots))) for t in emitted]
    assert rows == [
        ("w0", False, (3, 10)), ("x", False, (3, 10)), ("y", False, (3, 10)),
        ("w2", False, (3, 12)), ("x", False, (3, 12)), ("y", True, (3, 12)),
        ("w4", False, (3, 14)), ("x", False, (3, 14)), ("y", True, (3, 14)),
    ]  # fmt: skip
    count = ColumnarCountWord("redis://unused", "job:counts")
    count.prepare(TaskContext("t", 1, 0, 0))
    out = ColumnarOutput((), emitted)
    count.process_batch(emitted.batch, out)
    assert sorted(out.failed) == [5, 8]
    assert count.counts == {"w0": 1, "w2": 1, "w4": 1, "x": 3, "y": 1}
    _, again = run_first(split, records(*values))  # the second attempt: only poison fails
    assert len(again) == 12 and not any(t["fail"] for t in again)


def test_fetched_columns_make_the_same_first_stage_input_as_records() -> None:
    fetched = records(b"a b", b"", b"c")
    columns = RecordColumns(
        3,
        [r.offset for r in fetched.records],
        [r.key for r in fetched.records],
        [r.value for r in fetched.records],
        [r.timestamp for r in fetched.records],
    )
    acker: Acker[tuple[int, int]] = Acker()
    topology = Topology.of(SplitWords())
    from_records = first_input(topology, fetched, acker)
    from_columns = first_input(topology, FetchResult([], [], columns=columns), acker)
    assert isinstance(from_records, ArrowChunk) and isinstance(from_columns, ArrowChunk)
    assert from_columns.batch.equals(from_records.batch)
    assert from_columns.partitions.tolist() == from_records.partitions.tolist() == [3, 3, 3]
    assert from_columns.offsets.tolist() == from_records.offsets.tolist() == [10, 11, 12]
    assert from_columns.ids.tolist() == [0, 0, 0] and not acker.values
    assert FetchResult([], [], columns=columns).reached(0) == 13

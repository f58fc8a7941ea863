"""Property tests: columnar bolts against row bolts and a model, root by root.

Each record is a sentence. A split stage emits one `(word,)` tuple per word, then fails the
record if the sentence starts with "!" (after emitting: its words travel on); a `Fields("word")`
grouping routes the words to 1-3 count tasks, which fail the word "bad" and, in a row count
bolt, leave the word "hold" unacked. The same job runs four ways, row and columnar bolts in
every mix, each stage's ledger shipped in columns (`Ledger`) and merged in a random order as
on Spark; all four must give every root the outcome the model says:

* FAIL (EXCEPTION) iff the split failed it or one of its words failed,
* else no outcome yet (pending: it times out in its PartitionManager) iff a word is held,
* else ACK,

and the grouping must send every word to the same task whichever kind of bolt emitted it.
A second property runs the columnar job through a real `PartitionManager` attempt after
attempt: flaky sentences succeed on their retry, poison ones end dead-lettered after
`max_retries`, every other one is acked at its first attempt, and the commit point ends at
the high watermark.
"""

from __future__ import annotations

import pickle
from collections import Counter
from collections.abc import Sequence

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from kspout.acker import Acker, RootState
from kspout.bolts import BasicBolt, BasicCollector, Bolt, Chunk, Collector, TaskContext, Tuple
from kspout.columnar import ArrowChunk, ColumnarBolt, ColumnarOutput
from kspout.contract import PartitionTask, TaskResult
from kspout.executor.topology import (
    ChainItem,
    FetchReport,
    Topology,
    columnar_first,
    first_input,
    root_tuples,
    run_guarded,
    run_later_stage,
    runner_for,
    task_results,
)
from kspout.groupings import Fields
from kspout.kafka import FetchResult, Record
from kspout.kafka.records import RecordColumns
from kspout.outcomes import FailReason, OutcomeKind
from kspout.partition_manager import DONE, PartitionManager, Plan
from kspout.policy import Backoff, PartitionPolicy
from kspout.spark.worker import Ledger

WORDS = ("storm", "spark", "kafka", "bad", "hold")


class RowSplit(BasicBolt):
    outputs = ("word",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        text = (tuple_.record.value or b"").decode()
        for word in text.lstrip("!").split():
            collector.emit((word,))
        if text.startswith("!"):
            raise ValueError("split failed")


class ColumnarSplit(ColumnarBolt):
    outputs = ("word",)

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        text = batch.column("value").cast(pa.string())
        rows, words = split_words(pc.utf8_ltrim(text, "!"))
        out.emit(rows, {"word": words})
        out.fail(pc.starts_with(text, "!"), "split failed")


def split_words(text: pa.Array) -> tuple[pa.Array, pa.Array]:
    """Each word of `text` (as `str.split` finds them) and the row it came from."""
    split = pc.utf8_split_whitespace(text)
    words, rows = pc.list_flatten(split), pc.list_parent_indices(split)
    kept = pc.not_equal(words, "")
    return rows.filter(kept), words.filter(kept)


class RowCount(Bolt):
    """Fails "bad", leaves "hold" unacked, acks the rest."""

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        if tuple_["word"] == "bad":
            collector.fail(tuple_, "bad word")
        elif tuple_["word"] != "hold":
            collector.ack(tuple_)


class ColumnarCount(ColumnarBolt):
    """Fails "bad" (a columnar bolt acks every row it does not fail)."""

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        out.fail(pc.equal(batch.column("word"), "bad"), "bad word")


def chain(split: Bolt, count: Bolt) -> list[ChainItem]:
    return [split, Fields("word"), count]


def columns_of(records: list[Record]) -> RecordColumns:
    """`records` (of partition 0) as `PartitionFetcher.fetch_columns` reads them."""
    return RecordColumns(
        0,
        [r.offset for r in records],
        [r.key for r in records],
        [r.value for r in records],
        [r.timestamp for r in records],
    )


def run_job(
    job: Sequence[ChainItem],
    records: list[Record],
    tasks: int,
    order: Sequence[int],
    plan: Plan | None = None,
    root_rows: bool = False,
) -> tuple[TaskResult, list[Counter[str]]]:
    """The job over `records` as the Spark backend runs it: stage 0 in one task, its output
    routed to `tasks` count tasks (pickled in between), every ledger shipped in columns and
    folded in `order`. Returns the result and the words each count task received. With
    `root_rows`, stage 0 gets root tuples whatever its bolt (as the in-process executor)."""
    topology = Topology.of(job)
    first = Acker[tuple[int, int]]()
    fetched = FetchResult(records, [])
    if columnar_first(topology) and not root_rows:  # as the Spark backend fetches them
        fetched = FetchResult([], [], columns=columns_of(records))
    roots = root_tuples(fetched, first) if root_rows else first_input(topology, fetched, first)
    context = TaskContext("t", 0, 0, 0)
    runner = run_guarded(roots, lambda: runner_for(topology.stages[0], first, context, last=False))
    grouping = topology.stages[1].grouping
    assert grouping is not None
    ledgers = [first]
    received: list[Counter[str]] = []
    for index, part in enumerate(grouping.split(runner.chunk, tasks)):
        shipped = pickle.loads(pickle.dumps(part))
        words = shipped.rows() if isinstance(shipped, ArrowChunk) else shipped
        received.append(Counter(t["word"] for t in words))
        acker = Acker[tuple[int, int]]()
        later = TaskContext("t", 1, index, 0)
        run_later_stage(
            shipped, acker, lambda a=acker, c=later: runner_for(topology.stages[1], a, c, last=True)
        )
        ledgers.append(acker)
    shipped_ledgers = [
        pickle.loads(pickle.dumps(part))
        for index in order
        for part in Ledger.cut(ledgers[index]).values()
    ]
    merged = Ledger.merge(shipped_ledgers)
    whole = Acker[tuple[int, int]]()
    whole.values.update(
        ((0, o), v) for o, v in zip(merged.offsets.tolist(), merged.values.tolist(), strict=True)
    )
    for offset, mark, error in merged.marked.marked():
        whole.mark((0, offset), mark, error)
    plan = plan or PartitionManager(PartitionPolicy(), 0).plan(len(records), len(records))
    (result,) = task_results([PartitionTask("t", 0, plan)], whole, [FetchReport(0, (), None)])
    return result, received


def expected(sentence: str) -> RootState:
    words = sentence.lstrip("!").split()
    if sentence.startswith("!") or "bad" in words:
        return RootState.FAILED
    return RootState.PENDING if "hold" in words else RootState.COMPLETE


def outcomes(result: TaskResult) -> dict[int, RootState]:
    states: dict[int, RootState] = {}
    for o in result.outcomes:
        if o.kind is OutcomeKind.ACK:
            states.update(dict.fromkeys(range(o.offset, o.offset + o.count), RootState.COMPLETE))
        else:
            assert o.kind is OutcomeKind.FAIL and o.reason is FailReason.EXCEPTION, o
            assert "split failed" in str(o.error) or "bad word" in str(o.error), o.error
            states[o.offset] = RootState.FAILED
    return states


def record(offset: int, sentence: str) -> Record:
    return Record("t", 0, offset, None, sentence.encode(), 0, ())


sentences = st.builds(
    lambda bang, words: ("!" if bang else "") + " ".join(words),
    st.booleans(),
    st.lists(st.sampled_from(WORDS), max_size=4),
)


@settings(max_examples=150, deadline=None)
@given(
    batch=st.lists(sentences, min_size=1, max_size=12),
    tasks=st.integers(1, 3),
    data=st.data(),
)
def test_columnar_row_and_mixed_chains_settle_every_root_as_the_model_says(
    batch: list[str], tasks: int, data: st.DataObject
) -> None:
    records = [record(o, s) for o, s in enumerate(batch)]
    order = data.draw(st.permutations(range(tasks + 1)), label="merge order")
    root_rows = data.draw(st.booleans(), label="root tuples into a columnar first stage")
    model = {o: expected(s) for o, s in enumerate(batch)}
    settled = {o: state for o, state in model.items() if state is not RootState.PENDING}
    jobs = {
        "row": chain(RowSplit(), RowCount()),
        "columnar split, row count": chain(ColumnarSplit(), RowCount()),
    }
    routes = {}
    for name, job in jobs.items():
        result, routes[name] = run_job(job, records, tasks, order, root_rows=root_rows)
        assert outcomes(result) == settled, name
    unheld = [record(o, s.replace("hold", "storm")) for o, s in enumerate(batch)]
    model = {o: expected(s.replace("hold", "storm")) for o, s in enumerate(batch)}
    for name, job in {
        "columnar": chain(ColumnarSplit(), ColumnarCount()),
        "row split, columnar count": chain(RowSplit(), ColumnarCount()),
        "row, no word held": chain(RowSplit(), RowCount()),
    }.items():
        result, routes[name] = run_job(job, unheld, tasks, order, root_rows=root_rows)
        assert outcomes(result) == model, name
    assert routes["row"] == routes["columnar split, row count"], "same words, same tasks"
    assert routes["row, no word held"] == routes["columnar"] == routes["row split, columnar count"]


def test_a_row_with_several_roots_reaches_a_columnar_bolt_and_settles_both_roots() -> None:
    """A rich row bolt anchors one tuple to two roots; the columnar bolt after it acks it
    (both roots complete) or fails it (both fail)."""

    class Join(Bolt):
        outputs = ("word",)

        def prepare(self, context: TaskContext) -> None:
            self.pending: list[Tuple] = []

        def execute(self, tuple_: Tuple, collector: Collector) -> None:
            self.pending.append(tuple_)
            if len(self.pending) == 2:
                word = "bad" if b"bad" in (self.pending[0].record.value or b"") else "ok"
                collector.emit(self.pending, (word,))
                for joined in self.pending:
                    collector.ack(joined)
                self.pending = []

    records = [record(0, "bad"), record(1, "x"), record(2, "y"), record(3, "z")]
    result, _ = run_job([Join(), Fields("word"), ColumnarCount()], records, 2, [0, 1, 2])
    states = outcomes(result)
    assert states == {
        0: RootState.FAILED,
        1: RootState.FAILED,
        2: RootState.COMPLETE,
        3: RootState.COMPLETE,
    }


def test_an_arrow_chunk_reads_as_the_tuples_it_holds_and_pickles_without_them() -> None:
    rows = [(("a", 1), (0, 5), 11), (("b", 2), {(0, 6): 3, (1, 2): 4}, 0), (("c", 3), None, 0)]
    chunk = ArrowChunk.of(Chunk(("word", "n"), list(rows)))
    assert [(t.values, t.roots) for t in chunk] == [
        (("a", 1), {(0, 5): 11}),
        (("b", 2), {(0, 6): 3, (1, 2): 4}),
        (("c", 3), {}),
    ]
    back = pickle.loads(pickle.dumps(chunk))
    assert back.rows().rows == rows
    assert back.take(pa.array([2, 0]).to_numpy()).rows().rows == [rows[2], rows[0]]


POLICY = PartitionPolicy(max_retries=2, backoff=Backoff(0.0, 1.0, 0.0), message_timeout=30.0)


class Flaky(ColumnarBolt):
    """Fails a "flaky" sentence on its first attempt and a "poison" one always."""

    outputs = ("word",)

    def prepare(self, context: TaskContext) -> None:
        self.seen: set[int] = getattr(self, "seen", set())

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        text = batch.column("value").cast(pa.string()).to_pylist()
        offsets = batch.column("offset").to_pylist()
        failing = []
        for row, (sentence, offset) in enumerate(zip(text, offsets, strict=True)):
            if sentence == "poison" or (sentence == "flaky" and offset not in self.seen):
                failing.append(row)
            self.seen.add(offset)
        rows, words = split_words(batch.column("value").cast(pa.string()))
        out.emit(rows, {"word": words})
        out.fail(failing, "injected")


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(st.sampled_from(["storm spark", "flaky", "poison", ""]), max_size=10))
def test_the_partition_manager_retries_and_dead_letters_columnar_failures(batch: list[str]) -> None:
    split = Flaky()
    pm = PartitionManager(POLICY, 0, lambda: 0.0, topic="t", partition=0)
    records = [record(o, s) for o, s in enumerate(batch)]
    attempts: Counter[int] = Counter()
    for _ in range(POLICY.max_retries + 2):
        plan = pm.plan(len(batch), len(batch))
        if not list(plan):
            break
        attempts.update(plan)
        planned = [records[o] for o in plan]
        job = [split, Fields("word"), ColumnarCount()]
        result, _ = run_job(job, planned, 2, [0, 1, 2], plan)
        pm.apply(result.outcomes, generation=plan.generation)
        tickets = pm.take_dead_letters()
        assert all(batch[t.offset] == "poison" and t.error == "injected" for t in tickets)
        pm.dead_lettered(t.offset for t in tickets)
    for offset, sentence in enumerate(batch):
        assert pm.state_of(offset) is DONE
        retries = POLICY.max_retries if sentence == "poison" else sentence == "flaky"
        assert attempts[offset] == 1 + retries, (offset, sentence)
    stats = pm.stats()
    assert stats.dead_lettered == batch.count("poison")
    assert stats.acked == len(batch) - batch.count("poison")
    assert pm.commit_point == len(batch)

"""How tuples travel between stages: chunks of rows, groupings that split whole chunks, ledgers
in columns, and the batch paths of the bolt API, against their per-tuple definitions."""

from __future__ import annotations

import gc
import pickle
from collections import Counter

import pytest

from kspout.acker import Acker, Mark, RootState, new_tuple_ids
from kspout.bolts import (
    BasicBolt,
    BasicCollector,
    Chunk,
    Collector,
    RootKey,
    Tuple,
    make_tuple,
)
from kspout.executor.topology import root_tuples
from kspout.gc_pause import cyclic_gc_paused_until_built
from kspout.groupings import Fields, Global, Grouping, Shuffle
from kspout.kafka import FetchResult, Record
from kspout.spark.worker import Ledger


def record(partition: int, offset: int, value: bytes = b"a b") -> Record:
    return Record("t", partition, offset, None, value, -1, ())


def chunk_of(values: list[object], fields: tuple[str, ...] = ("word",)) -> Chunk:
    rows = [((v,), (i % 3, i), 1000 + i) for i, v in enumerate(values)]
    return Chunk(fields, rows)  # type: ignore[arg-type]


def test_a_chunk_pickles_in_columns_and_comes_back_equal() -> None:
    shared = (0, 7)
    rows = [
        (("a", 1), shared, 5),
        (("b", 2), shared, 2**64 - 1),
        (("c", 3), {(0, 7): 3, (1, 2): 4}, 0),
        (("d", 4), None, 0),
    ]
    chunk = Chunk(("word", "n"), rows)  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(chunk))
    assert copy == chunk
    assert copy.rows[0][1] is copy.rows[1][1], "a root shared by rows is pickled once"
    assert pickle.loads(pickle.dumps(Chunk(("x",)))) == Chunk(("x",))
    unnamed = Chunk((), [((1, 2, 3), None, 0), ((), (0, 1), 9)])
    assert pickle.loads(pickle.dumps(unnamed)) == unnamed


def test_a_chunk_reads_as_a_sequence_of_tuples() -> None:
    chunk = chunk_of(["x", "y", "z"])
    tuples = list(chunk)
    assert [t["word"] for t in tuples] == ["x", "y", "z"]
    assert tuples[1].roots == {(1, 1): 1001}
    assert len(chunk) == 3 and chunk[2].values == ("z",)
    assert [t.values for t in chunk[1:]] == [("y",), ("z",)]


@pytest.mark.parametrize("grouping", [Fields("word"), Global()], ids=repr)
def test_split_sends_each_row_where_route_sends_its_tuple(grouping: Grouping) -> None:
    values: list[object] = ["kafka", "storm", b"bytes", 42, 1.0, 1, True, None, ("t", 1)]
    chunk = chunk_of(values * 3)
    parts = grouping.split(chunk, 5)
    assert len(parts) == 5
    for task, part in enumerate(parts):
        assert all(grouping.route(t, 5) == task for t in part)
    assert Counter(r[2] for p in parts for r in p.rows) == Counter(r[2] for r in chunk.rows)


def test_an_empty_chunk_splits_into_empty_chunks_whatever_its_fields() -> None:
    for grouping in (Fields("word"), Shuffle(), Global()):
        assert grouping.split(Chunk(()), 3) == [Chunk(())] * 3


def test_fields_split_by_several_fields_matches_route() -> None:
    rows = [((w, lang, i), (0, i), i + 1) for i, (w, lang) in enumerate([("a", "en"), ("a", "fr")])]
    chunk = Chunk(("word", "lang", "n"), rows * 5)  # type: ignore[arg-type]
    grouping = Fields("word", "lang")
    for task, part in enumerate(grouping.split(chunk, 7)):
        assert all(grouping.route(t, 7) == task for t in part)


def test_shuffle_split_is_round_robin_across_chunks_and_single_routes() -> None:
    shuffle = Shuffle()
    counts: Counter[int] = Counter()
    for size in (5, 1, 7, 3):
        for task, part in enumerate(shuffle.split(chunk_of(list(range(size))), 4)):
            counts[task] += len(part)
    counts[shuffle.route(Tuple(("x",), ("word",), {}), 4)] += 1
    assert sorted(counts.values()) == [4, 4, 4, 5]


def test_a_grouping_that_only_routes_splits_through_route() -> None:
    class ByLength(Grouping):
        def route(self, tuple_: Tuple, tasks: int) -> int:
            return len(tuple_["word"]) % tasks

    parts = ByLength().split(chunk_of(["a", "bb", "ccc", "dd"]), 3)
    assert [[r[0][0] for r in p.rows] for p in parts] == [["ccc"], ["a"], ["bb", "dd"]]


def test_ledgers_travel_in_columns_and_fold_by_xor() -> None:
    acker: Acker[RootKey] = Acker()
    acker.xor((0, 5), 2**64 - 1)
    acker.xor((1, 3), 6)
    acker.fail((1, 4), "boom")
    ledgers = [pickle.loads(pickle.dumps(part)) for part in Ledger.cut(acker).values()]
    merged = Ledger.merge(ledgers + ledgers)  # twice: every value cancels out, the mark stays
    assert merged.offsets.tolist() == [3, 4, 5] and merged.values.tolist() == [0, 0, 0]
    assert merged.settled() == ([3, 5], [(4, RootState.FAILED, "boom")])
    assert list(merged.marked.marked()) == [(4, Mark.FAILED, "boom")]
    once = Ledger.merge(ledgers)
    assert once.values.tolist() == [6, 0, 2**64 - 1], "offsets ascending, each once"
    assert once.settled() == ([], [(4, RootState.FAILED, "boom")]), "3 and 5 are pending"


def test_root_tuples_register_every_record_once() -> None:
    acker: Acker[RootKey] = Acker()
    roots = root_tuples(FetchResult([record(2, 10), record(2, 11)], []), acker)
    assert [t.record.offset for t in roots] == [10, 11]
    assert acker.values == {(2, 10): roots.rows[0][2], (2, 11): roots.rows[1][2]}
    again = root_tuples(FetchResult([record(2, 10)], []), acker)  # a ledger holding the root
    assert acker.values[(2, 10)] == roots.rows[0][2] ^ again.rows[0][2]
    twice: Acker[RootKey] = Acker()
    twice.xor_each([(0, 1), (0, 1)], [3, 5])
    assert twice.values == {(0, 1): 6}, "a root given twice folds both ids"


def test_new_tuple_ids_are_nonzero_64_bit() -> None:
    ids = new_tuple_ids(5000)
    assert len(set(ids)) == 5000 and all(0 < i < 2**64 for i in ids)


class Split(BasicBolt):
    outputs = ("word",)

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        words = (tuple_.record.value or b"").split()
        if b"boom" in words:
            collector.emit((words[0],))
            raise ValueError("boom")
        for word in words:
            collector.emit((word,))


@pytest.mark.parametrize("batch", [True, False], ids=["execute_batch", "execute"])
def test_a_basic_bolt_settles_alike_in_a_batch_and_one_by_one(batch: bool) -> None:
    acker: Acker[RootKey] = Acker()
    roots = root_tuples(FetchResult([record(0, 0), record(0, 1, b"x boom")], []), acker)
    out = Chunk(("word",))
    collector = Collector(acker, ("word",), out)
    bolt = Split()
    if batch:
        bolt.execute_batch(roots, collector)
    else:
        for root in roots:
            try:
                bolt.execute(root, collector)
            except ValueError as exc:
                collector.fail(root, exc)
    assert [t["word"] for t in out] == [b"a", b"b", b"x"]
    assert acker.state((0, 0)) is RootState.PENDING, "its two words are not acked yet"
    assert acker.state((0, 1)) is RootState.FAILED
    for word in out:
        collector.ack(word)
    assert acker.state((0, 0)) is RootState.COMPLETE
    assert acker.values[(0, 1)] == roots.rows[1][2], "the failed input itself stays unacked"


def test_a_tuple_with_several_roots_keeps_them_all() -> None:
    joined = Tuple(("j",), ("word",), {(0, 1): 3, (1, 2): 4})
    assert joined.roots == {(0, 1): 3, (1, 2): 4}
    copy = pickle.loads(pickle.dumps(joined))
    assert (copy.values, copy.roots) == (("j",), {(0, 1): 3, (1, 2): 4})
    assert make_tuple(("w",), ("word",), None, 0).roots == {}


def test_objects_built_before_built_are_frozen_until_the_block_ends() -> None:
    enabled = gc.isenabled()
    with cyclic_gc_paused_until_built() as built:
        assert not gc.isenabled()
        kept = [object() for _ in range(10)]
        built()
        assert gc.isenabled() == enabled
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0 and gc.isenabled() == enabled


def test_what_user_code_froze_stays_frozen_after_a_task_block() -> None:
    enabled = gc.isenabled()
    model = [[] for _ in range(10)]  # tracked objects a handler module keeps
    gc.freeze()  # as a handler module that loads a large model may do
    try:
        with cyclic_gc_paused_until_built() as built:
            assert not gc.isenabled()
            built()
            assert gc.isenabled() == enabled
        # Frozen objects sit in no generation of the collector, so `get_objects` lists only
        # thawed ones. (Not the freeze count: frozen objects that other threads free lower it.)
        thawed = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in thawed for o in model), "the block thawed what user code froze"
    finally:
        gc.unfreeze()

"""Storm's word count as columnar bolts: split a batch's sentences into words, count them.

`SplitWords` and `CountWords` are `kspout.ColumnarBolt`s: each takes its task's whole input as
Arrow columns and works on them with `pyarrow.compute`, with no Python object per message or
word. They are the chain `columnar_word_count()` builds, `[SplitWords(), Fields("word"),
CountWords()]`; the demo (`kspout_demo.jobs`), the example (`examples/word_count.py`) and the
benchmarks use them from here.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from kspout.bolts import TaskContext
from kspout.columnar import ColumnarBolt, ColumnarOutput
from kspout.executor.topology import ChainItem
from kspout.groupings import Fields


class SplitWords(ColumnarBolt):
    """Each record's text -> one `(word,)` row per word, anchored to the record's row.

    The text is the record's value, or with `json_field` that string field of the JSON value
    (written `"name":"text"`, with no escaped quote inside; a value without it has no words).
    Words are split on ASCII whitespace, as `str.split()` splits them.
    """

    outputs: tuple[str, ...] = ("word",)

    def __init__(self, json_field: str | None = None) -> None:
        self.json_field = json_field

    def text(self, batch: pa.RecordBatch) -> pa.Array:
        """Each record's text: its value, or its JSON string field `json_field`."""
        values = batch.column("value")
        if self.json_field is None:
            return values
        key = f'"{self.json_field}":"'
        suffix = pa.scalar((key + '"').encode(), pa.binary())
        values = pc.binary_join_element_wise(values, suffix, b"")  # now each value has the key
        after = pc.list_element(pc.split_pattern(values, key, max_splits=1), 1)
        return pc.list_element(pc.split_pattern(after, '"', max_splits=1), 0)

    def words(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """Every word of the batch, and the input row each came from."""
        split = pc.ascii_split_whitespace(self.text(batch).cast(pa.string()))
        words, rows = pc.list_flatten(split), pc.list_parent_indices(split)
        kept = pc.not_equal(words, "")  # runs of whitespace split into empty strings too
        return words.filter(kept), rows.filter(kept)

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        words, rows = self.words(batch)
        out.emit(rows, {"word": words})


class CountWords(ColumnarBolt):
    """A running count per word, kept by the task in `counts` (every row is acked)."""

    def prepare(self, context: TaskContext) -> None:
        self.counts: Counter[str] = Counter()

    def process_batch(self, batch: pa.RecordBatch, out: ColumnarOutput) -> None:
        self.counts.update(count_words(batch.column("word")))


def count_words(words: pa.Array) -> dict[str, int]:
    """How often each word occurs in `words` (one pass in Arrow)."""
    counted = pc.value_counts(words)
    return dict(
        zip(
            counted.field("values").to_pylist(),
            counted.field("counts").to_pylist(),
            strict=True,
        )
    )


def columnar_word_count(json_field: str | None = None) -> list[ChainItem]:
    """Storm's word count topology in columns: split, group by word, count."""
    return [SplitWords(json_field), Fields("word"), CountWords()]

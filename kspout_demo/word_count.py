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

    The text is the record's value, or with `pattern` the named group `text` of that regular
    expression (RE2 syntax) matched against the value, e.g. `'"note":"(?P<text>[^"]*)"'` for a
    JSON field; a value it does not match has no words.
    """

    outputs = ("word",)

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = pattern

    def words(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """Every word of the batch, and the input row each came from."""
        text = batch.column("value")
        if self.pattern is not None:
            text = pc.struct_field(pc.extract_regex(text, self.pattern), "text")
        split = pc.utf8_split_whitespace(text.cast(pa.string()))
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


def columnar_word_count(pattern: str | None = None) -> list[ChainItem]:
    """Storm's word count topology in columns: split, group by word, count."""
    return [SplitWords(pattern), Fields("word"), CountWords()]

"""The bolt API, in Storm's spirit: tuples, collectors and bolts (groupings: `groupings.py`).

A job is a chain: bolts, optionally separated by groupings. Each Kafka record enters the chain
as a root tuple with one field, `record`. A bolt's `execute(tuple, collector)` may emit new
tuples anchored to one or more inputs (`collector.emit(anchors, values)`), and must ack or fail
each input; a `BasicBolt` anchors its emits to the input and acks it when `execute` returns.
An exception fails the input with EXCEPTION. An unanchored emit (`anchors=None`) leaves the
tree: its fate no longer affects the root. Emits of the last bolt go nowhere, as in Storm when a
stream has no subscribers.

A grouping between two bolts says which task of the next bolt receives a tuple: `Shuffle()`
(any), `Fields(names)` (equal values of those fields go to the same task, so a counting bolt
sees every tuple of its key), `Global()` (one task sees everything). On Spark each grouping is
a repartition. Consecutive bolts with no grouping between them run in the same task.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any, overload

from kspout.acker import Acker, Mark, Note, new_tuple_id, random_bits
from kspout.channel.beacon import thread_beacon
from kspout.errors import KafkaRefused
from kspout.gc_pause import cyclic_gc_paused
from kspout.kafka import Record
from kspout.outcomes import FailureCatalog

RootKey = tuple[int, int]  # (partition, offset) of the root record
Values = Sequence[Any]
# The roots a tuple descends from: one root's key (the common case: the tuple's id in that
# root's tree is kept beside it, no dict), a dict of root -> id for several, None for none.
Anchor = RootKey | dict[RootKey, int] | None
# A tuple as it travels between stages: (values, anchor, id); the fields go once per chunk.
Row = tuple[tuple[Any, ...], Anchor, int]


class Tuple:
    """Values with field names, and the tuple's ids in the trees of the roots it descends from.

    `roots` maps each root to the id this tuple contributes when acked; a tuple anchored to
    nothing has no roots. Inside, one root is kept as its key and id (most tuples have one).
    """

    __slots__ = ("_anchor", "_id", "fields", "values")

    def __init__(
        self, values: Values, fields: tuple[str, ...], roots: Mapping[RootKey, int]
    ) -> None:
        self.values = values if type(values) is tuple else tuple(values)
        self.fields = fields
        self._anchor, self._id = _anchor_of(dict(roots))

    @property
    def roots(self) -> dict[RootKey, int]:
        """Each root this tuple descends from, with the id it contributes when acked."""
        return dict(_pairs(self._anchor, self._id))

    def __getitem__(self, key: int | str) -> Any:
        """A value by position or by field name."""
        if isinstance(key, str):
            try:
                return self.values[self.fields.index(key)]
            except ValueError:
                raise KeyError(f"no field {key!r}; this tuple has {self.fields}") from None
        return self.values[key]

    @property
    def record(self) -> Record:
        """The Kafka record of a root tuple (the first bolt's input)."""
        value = self.values[0] if self.fields is ROOT_FIELDS else self["record"]
        assert isinstance(value, Record)
        return value

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={v!r}" for f, v in zip(self.fields, self.values, strict=False))
        return f"Tuple({shown})"

    def __reduce__(self) -> tuple[Callable[..., Tuple], tuple[Any, ...]]:
        return (make_tuple, (self.values, self.fields, self._anchor, self._id))


_new = object.__new__


def make_tuple(values: tuple[Any, ...], fields: tuple[str, ...], anchor: Anchor, id_: int) -> Tuple:
    """A `Tuple` from its parts as a `Row` holds them (no checks: for the hot loops)."""
    tuple_: Tuple = _new(Tuple)
    tuple_.values = values
    tuple_.fields = fields
    tuple_._anchor = anchor
    tuple_._id = id_
    return tuple_


def _anchor_of(roots: dict[RootKey, int]) -> tuple[Anchor, int]:
    """The compact form of `roots`: (key, id) for one root, (dict, 0) for several."""
    if not roots:
        return None, 0
    if len(roots) == 1:
        [(root, id_)] = roots.items()
        return root, id_
    return roots, 0


def _pairs(anchor: Anchor, id_: int) -> Iterable[tuple[RootKey, int]]:
    """(root, id) for each root of a tuple with this anchor and id."""
    if anchor is None:
        return ()
    if isinstance(anchor, dict):
        return anchor.items()
    return ((anchor, id_),)


@dataclass(slots=True)
class Chunk(Sequence[Tuple]):
    """Tuples as rows, with their field names: how a stage's input and output are held,
    routed and shipped.

    Between Spark stages, plain lists of tuples and ints pickle in C at once; one `Tuple`
    object per message would go through Python code on both ends. Read as a sequence, a
    chunk makes each `Tuple` as it is read, usually dropped right after: a stage's input is
    not a long-lived object per message for the cycle collector to scan again and again.
    """

    fields: tuple[str, ...]
    rows: list[Row] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Tuple: ...

    @overload
    def __getitem__(self, index: slice) -> Chunk: ...

    def __getitem__(self, index: int | slice) -> Tuple | Chunk:
        if isinstance(index, slice):
            return Chunk(self.fields, self.rows[index])
        values, anchor, id_ = self.rows[index]
        return make_tuple(values, self.fields, anchor, id_)

    def __iter__(self) -> Iterator[Tuple]:
        rows = self.rows
        columns = map(_FIRST, rows), map(_SECOND, rows), map(_THIRD, rows)
        return map(make_tuple, columns[0], repeat(self.fields), columns[1], columns[2])

    def __reduce__(self) -> tuple[Callable[..., Chunk], tuple[Any, ...]]:
        """Pickled in columns: a list per field (values were checked against the fields, when
        declared), the anchors, and the ids as one block of bytes. A tuple object per row
        would cost the pickler about four times as much on each end."""
        rows = self.rows
        values: list[Any] = list(map(_FIRST, rows))
        if self.fields:
            values = [list(map(itemgetter(i), values)) for i in range(len(self.fields))]
        anchors = list(map(_SECOND, rows))
        ids = array("Q", map(_THIRD, rows))
        return (_chunk_of_columns, (self.fields, values, anchors, ids))


_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


def _chunk_of_columns(
    fields: tuple[str, ...], values: list[Any], anchors: list[Anchor], ids: array[int]
) -> Chunk:
    """A `Chunk` back from its pickled columns (see `Chunk.__reduce__`)."""
    rows = zip(zip(*values, strict=True) if fields else values, anchors, ids, strict=True)
    with cyclic_gc_paused():  # a collection per 700 new rows, each over every live object
        return Chunk(fields, list(rows))


ROOT_FIELDS = ("record",)


def root_tuple(record: Record, acker: Acker[RootKey]) -> Tuple:
    """The tuple a record enters the chain as, registered with the acker."""
    key = (record.partition, record.offset)
    tuple_id = new_tuple_id()
    acker.xor(key, tuple_id)
    return make_tuple((record,), ROOT_FIELDS, key, tuple_id)


class Collector:
    """What a bolt emits, acks and fails through; every call updates the ack ledger.

    Emits go to `out`: a list of `Tuple`s, a `Chunk` (rows, for the next stage's grouping),
    or None (the last bolt, whose emits go nowhere).
    """

    __slots__ = (
        "_acker",
        "_basic",
        "_failures",
        "_fields",
        "_ledger",
        "_rows",
        "_tuples",
        "emits",
    )

    def __init__(
        self, acker: Acker[RootKey], fields: tuple[str, ...], out: list[Tuple] | Chunk | None
    ) -> None:
        self._acker = acker
        self._ledger = acker.values
        self._fields = fields
        self._rows = out.rows if isinstance(out, Chunk) else None
        self._tuples = out if isinstance(out, list) else None
        self.emits = out is not None  # False for the last bolt, whose emits go nowhere
        self._basic = BasicCollector(self)
        self._failures = FailureCatalog()

    def basic(self, input_: Tuple) -> BasicCollector:
        """The `BasicCollector` for `input_` (one object per task, re-pointed per input: the
        bolt itself keeps no per-task state, so it pickles as it was built)."""
        basic = self._basic
        basic.point_at(input_)
        return basic

    def emit(self, anchors: Tuple | Sequence[Tuple] | None, values: Values) -> None:
        """Emit `values`, anchored to `anchors` (one tuple, several, or None for unanchored)."""
        if not self.emits:
            return
        values = self.checked(values)
        roots: dict[RootKey, int] = {}
        if anchors is not None:
            ledger = self._ledger
            for anchor in (anchors,) if isinstance(anchors, Tuple) else anchors:
                for root, _ in _pairs(anchor._anchor, anchor._id):
                    edge = new_tuple_id()
                    ledger[root] = ledger.get(root, 0) ^ edge
                    roots[root] = roots.get(root, 0) ^ edge
        self.put(values, *_anchor_of(roots))

    def checked(self, values: Values) -> tuple[Any, ...]:
        """`values` as a tuple, after checking they match the declared fields."""
        if type(values) is not tuple:
            values = tuple(values)
        if self._fields and len(values) != len(self._fields):
            raise ValueError(f"emitted {len(values)} values for fields {self._fields}")
        return values

    def put(self, values: tuple[Any, ...], anchor: Anchor, id_: int) -> None:
        """Append an emitted tuple, its ids already in the ledger, to the output."""
        rows = self._rows
        if rows is not None:
            rows.append((values, anchor, id_))
        elif self._tuples is not None:
            self._tuples.append(make_tuple(values, self._fields, anchor, id_))

    def ack(self, tuple_: Tuple) -> None:
        """This input is done with."""
        ledger = self._ledger
        for root, tuple_id in _pairs(tuple_._anchor, tuple_._id):
            ledger[root] = ledger.get(root, 0) ^ tuple_id

    def fail(self, tuple_: Tuple, error: str | BaseException = "failed by the bolt") -> None:
        """This input failed: its roots fail at once with EXCEPTION (with what was raised, its
        place and traceback, when `error` is an exception)."""
        note = error if isinstance(error, str) else self._failures.of(error)
        self._mark(tuple_, Mark.FAILED, note)

    def duplicate(self, tuple_: Tuple) -> None:
        """Ack a root tuple whose message was processed before (the dedup bolt's DUPLICATE)."""
        self._mark(tuple_, Mark.DUPLICATE)
        self.ack(tuple_)

    def defer(self, tuple_: Tuple) -> None:
        """Give a root back to be offered again later without spending an attempt (the dedup
        bolt's DEFERRED: the message is in flight elsewhere)."""
        self._mark(tuple_, Mark.DEFERRED)
        self.ack(tuple_)

    def release(self, tuple_: Tuple, error: str | KafkaRefused) -> None:
        """The task handling this tuple failed outside per-message code: its roots are
        offered again without spending an attempt (a refusal, Kafka refusing the principal,
        also stops the run)."""
        self._mark(tuple_, Mark.RELEASED, error)

    def invalid(self, tuple_: Tuple, reason: str) -> None:
        """The root's message cannot be processed (no id, undecodable): dead-letter it now."""
        self._mark(tuple_, Mark.INVALID, reason)
        self.ack(tuple_)

    def _mark(self, tuple_: Tuple, mark: Mark, error: Note | None = None) -> None:
        for root, _ in _pairs(tuple_._anchor, tuple_._id):
            self._acker.mark(root, mark, error)


class BasicCollector:
    """A `BasicBolt`'s collector: emits are anchored to the current input.

    When the input has one root (the common case), the ids of the tuples emitted from it are
    folded into one running XOR, `edges`, that reaches the ledger once, with the input's ack.
    """

    __slots__ = ("_collector", "_input", "_root", "_rows", "_width", "edges")

    def __init__(self, collector: Collector) -> None:
        self._collector = collector
        self._rows = collector._rows  # the next stage's chunk, when the emits go there
        self._width = len(collector._fields)
        self._input: Tuple | None = None
        self._root: RootKey | None = None  # the input's root when it has exactly one
        self.edges = 0  # XOR of the ids emitted under `_root` since `point_at`

    def point_at(self, input_: Tuple) -> RootKey | None:
        """Anchor the emits from now on to `input_`; returns its root when it has one only."""
        anchor = input_._anchor
        root = anchor if type(anchor) is tuple else None
        self._input, self._root, self.edges = input_, root, 0
        return root

    def emit(self, values: Values) -> None:
        """Emit `values` anchored to the tuple being executed."""
        collector, root = self._collector, self._root
        if root is None or not collector.emits:  # several roots or none, or emits go nowhere
            if self._input is None:
                raise RuntimeError(
                    "a BasicBolt emits only inside process(): its emits are anchored to the "
                    "input being processed (emit from execute() of a Bolt to anchor freely)"
                )
            collector.emit(self._input, values)
            return
        if type(values) is not tuple or len(values) != self._width:
            values = collector.checked(values)
        edge = random_bits(64) or 1  # new_tuple_id()
        self.edges ^= edge
        rows = self._rows
        if rows is not None:  # collector.put, inline
            rows.append((values, root, edge))
        else:
            collector.put(values, root, edge)

    def detach(self) -> None:
        """No input is being processed: an emit now is refused (it would be anchored to the
        last input after that input's ids reached the ledger, and its root never complete)."""
        self._input = self._root = None

    def settle(self, *, ack: bool) -> None:
        """Fold the emitted ids into the ledger, with the input's own id when `ack`."""
        input_, root = self._input, self._root
        assert input_ is not None
        self.detach()
        if root is None:
            if ack:
                self._collector.ack(input_)
            return
        ledger = self._collector._ledger
        ledger[root] = ledger.get(root, 0) ^ self.edges ^ (input_._id if ack else 0)
        self.edges = 0


@dataclass(frozen=True, slots=True)
class TaskContext:
    """Where a bolt instance runs: handed to `prepare`."""

    topic: str
    stage: int  # index of the bolt's stage in the chain (stages are split by groupings)
    task: int  # index of the Spark partition (or 0 in-process)
    batch: int  # the micro-batch number


class Bolt:
    """Storm's rich bolt: `execute` must ack or fail every input itself.

    `outputs` names the fields of emitted tuples (what `Fields` groupings refer to). `prepare`
    runs once per task before the first tuple; open connections there (they do not travel
    from the driver).
    """

    outputs: tuple[str, ...] = ()
    terminal = False  # True for a bolt that never emits: no bolt may follow it in a chain
    # True for a bolt that tells messages apart by their root's id (the dedup bolt): it must
    # be the chain's first bolt, where each input tuple is one message
    must_be_first = False

    def prepare(self, context: TaskContext) -> None:
        """Called once per task before the first `execute`."""

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        raise NotImplementedError

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        """Execute a task's whole input at once (the first bolt of each stage is called so).

        The default runs `execute` per tuple, failing the tuple whose `execute` raised, unless
        what it raised is `KafkaRefused` (a right the principal lost, a changed password: not
        the message's fault, and no retry cures it): that fails the task, which stops the run.
        Bolts that pay a round trip per call (the dedup bolt) override it to make one per
        batch, or per part of one.
        """
        beacon = thread_beacon()
        for tuple_ in tuples:
            beacon.current = tuple_
            try:
                self.execute(tuple_, collector)
            except KafkaRefused:
                raise
            except Exception as exc:
                collector.fail(tuple_, exc)
        beacon.current = None

    def cleanup(self) -> None:
        """Called once per task after the last `execute`."""

    def start(self) -> None:
        """Called once on the driver before the first batch (checks, warnings)."""

    def replay_window(self) -> float | None:
        """Seconds after which this bolt no longer knows a message it finished (the dedup
        bolt's `[dedup] ttl`): a replay reaching further back would apply it again. The
        driver guards that limit; None: replays are harmless to this bolt."""
        return None


class BasicBolt(Bolt):
    """A bolt whose emits anchor to the input and whose input is acked when `process` returns."""

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        raise NotImplementedError

    def execute(self, tuple_: Tuple, collector: Collector) -> None:
        basic = collector.basic(tuple_)
        try:
            self.process(tuple_, basic)
        except BaseException:
            basic.settle(ack=False)
            raise
        basic.settle(ack=True)

    def execute_batch(self, tuples: Sequence[Tuple], collector: Collector) -> None:
        """`execute` per tuple, failing the tuple whose `process` raised, with the per-tuple
        work kept to the ledger's: one XOR into it per input (see BasicCollector)."""
        if type(self).execute is not BasicBolt.execute:  # a subclass that redefines execute
            super().execute_batch(tuples, collector)
            return
        basic, ledger = collector._basic, collector._ledger
        process = self.process
        beacon = thread_beacon()
        for tuple_ in tuples:
            beacon.current = tuple_
            root = basic.point_at(tuple_)
            try:
                process(tuple_, basic)
            except KafkaRefused:
                basic.settle(ack=False)
                raise  # as in `Bolt.execute_batch`: the task fails, the run stops
            except Exception as exc:
                basic.settle(ack=False)
                collector.fail(tuple_, exc)
                continue
            if root is None:
                basic.settle(ack=True)
            else:  # settle(ack=True) inline: the input's one update of the ledger
                ledger[root] = ledger.get(root, 0) ^ basic.edges ^ tuple_._id
        basic.detach()
        beacon.current = None


class FunctionBolt(BasicBolt):
    """A plain function: `f(record)` for the first bolt, `f(tuple)` further down the chain."""

    def __init__(self, function: Callable[[Any], object], *, on_record: bool = True) -> None:
        self.function = function
        self.on_record = on_record

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        self.function(tuple_.record if self.on_record else tuple_)

    def __repr__(self) -> str:
        return f"FunctionBolt({getattr(self.function, '__qualname__', self.function)!r})"

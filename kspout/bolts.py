"""The bolt API, in Storm's spirit: tuples, collectors, bolts and groupings.

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

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kspout.acker import Acker, Mark, new_tuple_id
from kspout.channel.beacon import BEACON
from kspout.kafka import Record
from kspout.outcomes import describe_error

RootKey = tuple[int, int]  # (partition, offset) of the root record
Values = Sequence[Any]


class Tuple:
    """Values with field names, and the tuple's ids in the trees of the roots it descends from.

    `roots` maps each root to the id this tuple contributes when acked; a tuple anchored to
    nothing has no roots.
    """

    __slots__ = ("fields", "roots", "values")

    def __init__(self, values: Values, fields: tuple[str, ...], roots: dict[RootKey, int]) -> None:
        self.values = values if type(values) is tuple else tuple(values)
        self.fields = fields
        self.roots = roots

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

    def __reduce__(self) -> tuple[type[Tuple], tuple[tuple[Any, ...], tuple[str, ...], dict]]:  # type: ignore[type-arg]
        return (Tuple, (self.values, self.fields, self.roots))


ROOT_FIELDS = ("record",)


def root_tuple(record: Record, acker: Acker[RootKey]) -> Tuple:
    """The tuple a record enters the chain as, registered with the acker."""
    key = (record.partition, record.offset)
    tuple_id = new_tuple_id()
    acker.xor(key, tuple_id)
    return Tuple((record,), ROOT_FIELDS, {key: tuple_id})


class Collector:
    """What a bolt emits, acks and fails through; every call updates the ack ledger."""

    __slots__ = ("_acker", "_basic", "_fields", "_out")

    def __init__(
        self, acker: Acker[RootKey], fields: tuple[str, ...], out: list[Tuple] | None
    ) -> None:
        self._acker = acker
        self._fields = fields
        self._out = out  # None: the last bolt, whose emits go nowhere
        self._basic = BasicCollector(self, None)

    def basic(self, input_: Tuple) -> BasicCollector:
        """The `BasicCollector` for `input_` (one object per task, re-pointed per input: the
        bolt itself keeps no per-task state, so it pickles as it was built)."""
        basic = self._basic
        basic._input = input_
        return basic

    def emit(self, anchors: Tuple | Sequence[Tuple] | None, values: Values) -> None:
        """Emit `values`, anchored to `anchors` (one tuple, several, or None for unanchored)."""
        if self._out is None:
            return
        if self._fields and len(values) != len(self._fields):
            raise ValueError(f"emitted {len(values)} values for fields {self._fields}")
        roots: dict[RootKey, int] = {}
        if anchors is not None:
            acker = self._acker
            for anchor in (anchors,) if isinstance(anchors, Tuple) else anchors:
                for root in anchor.roots:
                    edge = new_tuple_id()
                    acker.xor(root, edge)
                    roots[root] = roots.get(root, 0) ^ edge
        self._out.append(Tuple(values, self._fields, roots))

    def ack(self, tuple_: Tuple) -> None:
        """This input is done with."""
        acker = self._acker
        for root, tuple_id in tuple_.roots.items():
            acker.xor(root, tuple_id)

    def fail(self, tuple_: Tuple, error: str | BaseException = "failed by the bolt") -> None:
        """This input failed: its roots fail at once with EXCEPTION."""
        text = error if isinstance(error, str) else describe_error(error)
        self._mark(tuple_, Mark.FAILED, text)

    def duplicate(self, tuple_: Tuple) -> None:
        """Ack a root tuple whose message was processed before (the dedup bolt's DUPLICATE)."""
        self._mark(tuple_, Mark.DUPLICATE)
        self.ack(tuple_)

    def defer(self, tuple_: Tuple) -> None:
        """Give a root back to be offered again later without spending an attempt (the dedup
        bolt's DEFERRED: the message is in flight elsewhere)."""
        self._mark(tuple_, Mark.DEFERRED)
        self.ack(tuple_)

    def release(self, tuple_: Tuple, error: str) -> None:
        """The task handling this tuple failed outside per-message code: its roots are
        offered again without spending an attempt."""
        self._mark(tuple_, Mark.RELEASED, error)

    def invalid(self, tuple_: Tuple, reason: str) -> None:
        """The root's message cannot be processed (no id, undecodable): dead-letter it now."""
        self._mark(tuple_, Mark.INVALID, reason)
        self.ack(tuple_)

    def _mark(self, tuple_: Tuple, mark: Mark, error: str | None = None) -> None:
        for root in tuple_.roots:
            self._acker.mark(root, mark, error)


class BasicCollector:
    """A `BasicBolt`'s collector: emits are anchored to the current input."""

    __slots__ = ("_collector", "_input")

    def __init__(self, collector: Collector, input_: Tuple | None) -> None:
        self._collector = collector
        self._input = input_

    def emit(self, values: Values) -> None:
        """Emit `values` anchored to the tuple being executed."""
        assert self._input is not None, "emit outside process()"
        self._collector.emit(self._input, values)


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

        The default runs `execute` per tuple, failing the tuple whose `execute` raised. Bolts
        that pay a round trip per call (the dedup bolt) override it to make one per batch.
        """
        beacon = BEACON
        for tuple_ in tuples:
            beacon.current = tuple_
            try:
                self.execute(tuple_, collector)
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
        self.process(tuple_, collector.basic(tuple_))
        collector.ack(tuple_)


class FunctionBolt(BasicBolt):
    """A plain function: `f(record)` for the first bolt, `f(tuple)` further down the chain."""

    def __init__(self, function: Callable[[Any], object], *, on_record: bool = True) -> None:
        self.function = function
        self.on_record = on_record

    def process(self, tuple_: Tuple, collector: BasicCollector) -> None:
        self.function(tuple_.record if self.on_record else tuple_)

    def __repr__(self) -> str:
        return f"FunctionBolt({getattr(self.function, '__qualname__', self.function)!r})"


class Grouping:
    """How tuples are routed to the next bolt's tasks (a Spark repartition)."""

    def route(self, tuple_: Tuple, tasks: int) -> int:
        """The index of the task that receives `tuple_`."""
        raise NotImplementedError


class Shuffle(Grouping):
    """Any task; tuples are spread evenly (round robin from a random start per copy, since
    every upstream task routes with its own copy)."""

    def __init__(self) -> None:
        self._next: int | None = None

    def route(self, tuple_: Tuple, tasks: int) -> int:
        current = new_tuple_id() if self._next is None else self._next
        self._next = (current + 1) % tasks
        return self._next

    def __repr__(self) -> str:
        return "Shuffle()"


class Fields(Grouping):
    """Tuples with equal values in `names` go to the same task."""

    def __init__(self, *names: str) -> None:
        if not names:
            raise ValueError("Fields() needs at least one field name")
        self.names = names

    def route(self, tuple_: Tuple, tasks: int) -> int:
        key = tuple(tuple_[name] for name in self.names)
        return stable_hash(key) % tasks

    def __repr__(self) -> str:
        return f"Fields({', '.join(map(repr, self.names))})"


class Global(Grouping):
    """Every tuple goes to the first task."""

    def route(self, tuple_: Tuple, tasks: int) -> int:
        return 0

    def __repr__(self) -> str:
        return "Global()"


def stable_hash(value: object) -> int:
    """A hash equal in every Python worker for values that compare equal.

    `hash()` of a str is salted per process, and `repr` tells apart equal values (1 and 1.0,
    dicts in another order, sets printed in hash order); this hashes a canonical form instead.
    """
    return zlib.crc32(_canonical(value).encode("utf-8", "surrogatepass"))


def _canonical(value: object) -> str:
    if value is None:
        return "N"
    if isinstance(value, bool | int):
        return f"i{int(value)}"
    if isinstance(value, float):
        return f"i{int(value)}" if value.is_integer() else f"f{value!r}"
    if isinstance(value, str):
        return f"s{len(value)}:{value}"
    if isinstance(value, bytes | bytearray):
        return f"y{bytes(value).hex()}"
    if isinstance(value, tuple | list):
        return "(" + ",".join(_canonical(v) for v in value) + ")"
    if isinstance(value, set | frozenset):
        return "{" + ",".join(sorted(_canonical(v) for v in value)) + "}"
    if isinstance(value, dict):
        items = sorted(f"{_canonical(k)}={_canonical(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    return f"r{value!r}"

"""A bolt chain split into stages, and the code that runs a stage inside one task.

`Topology.of(...)` accepts what users pass to `KafkaSpout.run`: a plain function, a bolt, or a
list of bolts (and functions) separated by groupings. Groupings cut the chain into stages; each
stage runs in one task per Spark partition, and the tuples it emits are repartitioned by the
next stage's grouping. A `ColumnarBolt` is a stage of its own (`ColumnarRunner`, in
`kspout.columnar`); the other stages run their bolts tuple by tuple (`StageRunner`).
Backends (in-process, Spark) only move tuples and ledgers between stages; everything here is
pure logic.

Every stage's task keeps an `Acker` ledger. Ledgers travel beside the tuples and are merged per
root after the last stage; `task_results` turns the merged ledger into each partition's
outcomes: complete roots are acked (or DUPLICATE), failed ones fail with EXCEPTION (INVALID
when a bolt found the message unprocessable), deferred ones are DEFERRED, and pending ones
(some tuple never acked) are left in flight for the PartitionManager's `message_timeout`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Any, Protocol

from kspout.acker import Acker, Note, RootState, new_tuple_ids, reseed
from kspout.bolts import (
    ROOT_FIELDS,
    Bolt,
    Chunk,
    Collector,
    FunctionBolt,
    RootKey,
    TaskContext,
    Tuple,
)
from kspout.channel.beacon import thread_beacon
from kspout.columnar import ArrowChunk, ColumnarBolt, ColumnarRunner
from kspout.contract import PartitionTask, TaskResult
from kspout.errors import ChainError, KafkaRefused
from kspout.executor.outcome_log import OutcomeLog
from kspout.executor.task import Handler, cut_short, refused_by_kafka, released
from kspout.gc_pause import cyclic_gc_paused
from kspout.groupings import Fields, Grouping
from kspout.kafka import FetchResult, PartitionFetcher
from kspout.outcomes import FailReason, OutcomeKind, describe_error
from kspout.ranges import runs

ChainItem = Bolt | Grouping | Callable[[Any], object]


@dataclass(frozen=True, slots=True)
class Stage:
    """Bolts that run one after another in the same task, and how their input is routed."""

    bolts: tuple[Bolt, ...]
    grouping: Grouping | None  # None for the first stage, whose input is the fetched records


@dataclass(frozen=True, slots=True)
class Topology:
    """The stages of a bolt chain."""

    stages: tuple[Stage, ...]

    @classmethod
    def of(cls, spec: ChainItem | Sequence[ChainItem]) -> Topology:
        """Build from a function, a bolt, or a list of bolts/functions and groupings.

        Functions become `FunctionBolt`s: the first receives each record, later ones a tuple.
        A `must_be_first` bolt (the dedup bolt) is refused anywhere but at the start.
        """
        items = list(spec) if isinstance(spec, Sequence) else [spec]
        if not items:
            raise ChainError("the bolt chain is empty: pass a function, a bolt or a list")
        stages: list[Stage] = []
        bolts: list[Bolt] = []
        grouping: Grouping | None = None
        for position, item in enumerate(items):
            if isinstance(item, Grouping):
                if not bolts:
                    where = "start" if position == 0 else "follow another grouping"
                    raise ChainError(f"a grouping cannot {where}: {item!r} at position {position}")
                stages.append(Stage(tuple(bolts), grouping))
                bolts, grouping = [], item
            elif isinstance(item, type):
                raise ChainError(
                    f"chain item {position} is the class {item.__name__}: pass an instance, "
                    f"{item.__name__}(...)"
                )
            elif isinstance(item, Bolt):
                if item.must_be_first and position > 0:
                    raise ChainError(_not_first(item, position))
                bolts.append(item)
                if item.terminal and position < len(items) - 1:
                    raise ChainError(
                        f"{type(item).__name__} at position {position} emits nothing, so what "
                        "follows it would never run: make it the last item (its handler is "
                        "where the user code goes)"
                    )
            elif callable(item):
                bolts.append(FunctionBolt(item, on_record=position == 0))
            else:
                raise ChainError(
                    f"chain item {position} is {item!r}: expected a Bolt, a function or a grouping"
                )
        if not bolts:
            raise ChainError(f"the chain ends with a grouping ({grouping!r}): add a bolt after it")
        stages.append(Stage(tuple(bolts), grouping))
        topology = cls(tuple(stages))
        topology._check_columnar()
        topology._check_fields()
        return topology

    def _check_columnar(self) -> None:
        """A `ColumnarBolt` takes a whole task's input at once: it is a stage of its own."""
        for stage in self.stages:
            columnar = [b for b in stage.bolts if isinstance(b, ColumnarBolt)]
            if columnar and len(stage.bolts) > 1:
                name = type(columnar[0]).__name__
                raise ChainError(
                    f"{name} is a ColumnarBolt and shares a stage with "
                    f"{', '.join(type(b).__name__ for b in stage.bolts if b is not columnar[0])}:"
                    " a columnar bolt takes its task's whole input at once, so it must be a "
                    "stage of its own. Put a grouping (Shuffle() when any task will do) "
                    f"before {name} unless it is first, and after it unless it is last"
                )

    def _check_fields(self) -> None:
        upstream: tuple[str, ...] = ROOT_FIELDS
        for stage in self.stages:
            grouping = stage.grouping
            if isinstance(grouping, Fields):
                unknown = [n for n in grouping.names if n not in upstream]
                if unknown:
                    raise ChainError(
                        f"{grouping!r} names {unknown}, but the bolt before it declares "
                        f"outputs {upstream}; set `outputs = (...)` on that bolt"
                    )
            upstream = stage.bolts[-1].outputs

    def start(self) -> None:
        """Let every bolt check its surroundings on the driver before the first batch."""
        for stage in self.stages:
            for bolt in stage.bolts:
                bolt.start()

    def replay_window(self) -> float | None:
        """The shortest `replay_window` of the chain's bolts (None: no bolt has one)."""
        windows = [w for s in self.stages for b in s.bolts if (w := b.replay_window()) is not None]
        return min(windows, default=None)

    @property
    def handler(self) -> Handler | None:
        """The plain function when the chain is just one, for the tracker-free fast path."""
        if len(self.stages) == 1 and len(self.stages[0].bolts) == 1:
            bolt = self.stages[0].bolts[0]
            if type(bolt) is FunctionBolt and bolt.on_record:
                return bolt.function
        return None


def _not_first(bolt: Bolt, position: int) -> str:
    """Why `bolt` (a `must_be_first` bolt, such as the dedup bolt) cannot be at `position`."""
    name = type(bolt).__name__
    where = (
        f"the chain's only item, {name}(...) alone (nothing may follow it either)"
        if bolt.terminal
        else "the chain's first item"
    )
    return (
        f"{name} at position {position} must be {where}: it handles each message once by "
        "the message's id, and every tuple an earlier bolt emits from one message carries "
        "that same id, so after a bolt that emits several tuples per message only the first "
        "would run and the others would be acked as duplicates. Move it to the start of the "
        "chain and do the earlier bolts' work (splitting, parsing) inside its handler"
    )


class Runner(Protocol):
    """What runs a stage in one task: a `StageRunner`, or a `ColumnarRunner`."""

    chunk: Chunk | ArrowChunk  # what the stage emitted, for the next stage's grouping

    def run(self, tuples: Chunk | ArrowChunk) -> None: ...

    def close(self) -> None: ...


def runner_for(stage: Stage, acker: Acker[RootKey], context: TaskContext, *, last: bool) -> Runner:
    """The runner of `stage` in one task (its bolts prepared): a columnar stage's, or rows'."""
    first = stage.bolts[0]
    if isinstance(first, ColumnarBolt):
        columnar: Runner = ColumnarRunner(first, acker, context, last=last)
        return columnar
    return StageRunner(stage, acker, context, last=last)


class StageRunner:
    """Runs one stage's bolts over a task's input tuples, the later bolts depth first.

    Tuples the stage's last bolt emits are collected as rows in `chunk` for the next stage's
    grouping; in the chain's last stage they go nowhere.
    """

    def __init__(
        self, stage: Stage, acker: Acker[RootKey], context: TaskContext, *, last: bool
    ) -> None:
        self._bolts = stage.bolts
        chunk = Chunk(stage.bolts[-1].outputs)
        self.chunk: Chunk | ArrowChunk = chunk
        self._buffers: list[list[Tuple]] = [[] for _ in stage.bolts[:-1]]
        final_out = None if last else chunk
        self._collectors = [
            Collector(acker, bolt.outputs, buffer)
            for bolt, buffer in zip(stage.bolts, [*self._buffers, final_out], strict=True)
        ]
        self._beacon = thread_beacon()  # made in the thread that runs it
        for bolt in self._bolts:
            bolt.prepare(context)

    @property
    def output(self) -> list[Tuple]:
        """What the stage emitted, as tuples (empty in the chain's last stage)."""
        return list(self.chunk)

    def run(self, tuples: Chunk | ArrowChunk) -> None:
        """The stage's first bolt takes all the task's input in one batch; whatever it emits
        then runs through the next bolts, tuple by tuple."""
        rows = tuples.rows() if isinstance(tuples, ArrowChunk) else tuples
        self._bolts[0].execute_batch(rows, self._collectors[0])
        self._forward(0)

    def _feed(self, tuple_: Tuple, index: int) -> None:
        """Execute `tuple_` in bolt `index`, then whatever it emitted in the next bolts."""
        collector = self._collectors[index]
        self._beacon.current = tuple_
        try:
            self._bolts[index].execute(tuple_, collector)
        except KafkaRefused:
            raise  # not the tuple's fault: the task fails, the run stops (`run_guarded`)
        except Exception as exc:
            collector.fail(tuple_, exc)
        self._forward(index)

    def _forward(self, index: int) -> None:
        if index < len(self._buffers):
            buffer = self._buffers[index]
            emitted = buffer[:]
            buffer.clear()
            for child in emitted:
                self._feed(child, index + 1)

    def close(self) -> None:
        """Let every bolt clean up (all of them, even when one raises; the first error wins)."""
        error: Exception | None = None
        for bolt in self._bolts:
            try:
                bolt.cleanup()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error


def root_tuples(fetched: FetchResult, acker: Acker[RootKey]) -> Chunk:
    """The fetched records as the chain's root tuples, registered with `acker`."""
    reseed()
    records = fetched.records
    with cyclic_gc_paused():
        keys: list[RootKey] = list(map(_ROOT_KEY, records))
        ids = new_tuple_ids(len(records))
        acker.xor_each(keys, ids)
        return Chunk(ROOT_FIELDS, list(zip(zip(records), keys, ids, strict=True)))


def first_input(
    topology: Topology, fetched: FetchResult, acker: Acker[RootKey]
) -> Chunk | ArrowChunk:
    """The fetched records as the first stage's input: root tuples registered with `acker`,
    or for a columnar first stage the records' columns (`ArrowChunk.of_records`, or
    `of_columns` when `fetch_input` fetched them as columns)."""
    if fetched.columns is not None:
        return ArrowChunk.of_columns(fetched.columns)
    if columnar_first(topology):
        return ArrowChunk.of_records(fetched.records)
    return root_tuples(fetched, acker)


def columnar_first(topology: Topology) -> bool:
    """Whether the chain's first stage is a `ColumnarBolt`'s."""
    return isinstance(topology.stages[0].bolts[0], ColumnarBolt)


def fetch_input(topology: Topology, fetcher: PartitionFetcher, task: PartitionTask) -> FetchResult:
    """A task's planned records, fetched in the form the chain's first stage reads: columns,
    with no `Record` per message, for a columnar one."""
    fetch = fetcher.fetch_columns if columnar_first(topology) else fetcher.fetch
    return fetch(task.topic, task.partition, task.plan.ranges())


_ROOT_KEY = attrgetter("partition", "offset")
_OFFSET = itemgetter(1)


def run_later_stage(
    tuples: Chunk | ArrowChunk, acker: Acker[RootKey], make_runner: Callable[[], Runner]
) -> Chunk | ArrowChunk:
    """Run tuples routed here by a grouping through a later stage; returns what it emitted.

    When the stage fails outside per-message code (its bolts' `prepare` included), every root
    of its input is marked RELEASED on `acker`, the stage's, and nothing is emitted onward; a
    refusal (Kafka refused the principal) goes with the marks, so that it stops the run as it
    does in the first stage.
    """
    reseed()
    try:
        return run_guarded(tuples, make_runner).chunk
    except StageFailed as failed:
        collector = Collector(acker, (), None)
        for tuple_ in tuples:
            collector.release(tuple_, failed.refused or failed.error)
        return Chunk(())


_SETTLED = {
    RootState.DUPLICATE: (OutcomeKind.DUPLICATE, None),
    RootState.DEFERRED: (OutcomeKind.DEFERRED, None),
    RootState.RELEASED: (OutcomeKind.RELEASED, None),
    RootState.FAILED: (OutcomeKind.FAIL, FailReason.EXCEPTION),
    RootState.INVALID: (OutcomeKind.FAIL, FailReason.INVALID),
}


@dataclass(frozen=True, slots=True)
class FetchReport:
    """What a first-stage task learnt from Kafka besides the records: for the final results."""

    partition: int
    missing: tuple[tuple[int, int], ...]
    out_of_range: tuple[int, int] | None
    infra_error: str | None = None  # the task failed outside per-message code: release all
    attempt_died: bool = False  # an earlier attempt of the task died; this one ran nothing
    reached: int = 0  # with `out_of_range`: where the fetch stopped (see FetchResult.reached)
    refused: KafkaRefused | None = None  # with `infra_error`: one that stops the run
    leader_epoch: tuple[int, int] | None = None  # FetchResult.leader_epoch

    @classmethod
    def of(cls, partition: int, fetched: FetchResult) -> FetchReport:
        """What `fetched` found besides its records."""
        reached = fetched.reached(0) if fetched.out_of_range is not None else 0
        return cls(
            partition,
            tuple(fetched.missing),
            fetched.out_of_range,
            reached=reached,
            leader_epoch=fetched.leader_epoch,
        )

    @classmethod
    def failed(cls, partition: int, exc: BaseException) -> FetchReport:
        """A first-stage task that failed outside per-message code: its roots are released
        (and a refusal no retry cures stops the run)."""
        return cls(partition, (), None, describe_error(exc), refused=refused_by_kafka(exc))


def run_guarded(tuples: Chunk | ArrowChunk, make_runner: Callable[[], Runner]) -> Runner:
    """Prepare a stage's bolts, run `tuples` through them, clean up; raise `StageFailed` when
    any of that raised outside per-message code (every bolt's `cleanup` still runs)."""
    try:
        runner = make_runner()
    except Exception as exc:
        raise StageFailed(describe_error(exc), refused_by_kafka(exc)) from exc
    error: BaseException | None = None
    try:
        runner.run(tuples)
    except Exception as exc:
        error = exc
    finally:
        thread_beacon().current = None
        try:
            runner.close()
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise StageFailed(describe_error(error), refused_by_kafka(error)) from error
    return runner


class StageFailed(Exception):
    """A stage's task failed outside per-message code (prepare, execute_batch, cleanup): the
    infrastructure's fault, so its roots are released without spending an attempt (with
    `refused`, a refusal such as `Publish`'s revoked Write, the run stops)."""

    def __init__(self, error: str, refused: KafkaRefused | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.refused = refused


def task_results(
    tasks: Sequence[PartitionTask], acker: Acker[RootKey], reports: Iterable[FetchReport]
) -> list[TaskResult]:
    """One `TaskResult` per task from the merged ledger of every root in the batch."""
    return partition_results(tasks, by_partition(acker), reports)


def by_partition(acker: Acker[RootKey]) -> dict[int, Acker[int]]:
    """`acker` cut into one ledger per Kafka partition, keyed by offset."""
    values = acker.flat()
    parts: dict[int, Acker[int]] = {p: Acker() for p in {partition for partition, _ in values}}
    if len(parts) == 1:  # a first-stage task's: all of its partition, at once
        [part] = parts.values()
        part.values.update(zip(map(_OFFSET, values), values.values(), strict=True))
    else:
        for (partition, offset), value in values.items():
            parts[partition].values[offset] = value
    for (partition, offset), mark, error in acker.marked():
        parts[partition].mark(offset, mark, error)
    return parts


class PartitionLedger(Protocol):
    """One partition's whole ledger, keyed by offset, as `partition_results` settles it: an
    `Acker[int]`, or the Spark merge's `MergedLedger`."""

    def settled(self) -> tuple[Sequence[int], Sequence[tuple[int, RootState, Note | None]]]:
        """The complete roots, and every marked root with its state and error."""
        ...


def partition_results(
    tasks: Sequence[PartitionTask],
    ledgers: Mapping[int, PartitionLedger],
    reports: Iterable[FetchReport],
) -> list[TaskResult]:
    """One `TaskResult` per task from its partition's merged ledger (offset -> ack value)."""
    missing: dict[int, list[tuple[int, int]]] = {}
    out_of_range: dict[int, tuple[int, int]] = {}
    reached: dict[int, int] = {}
    failed: dict[int, FetchReport] = {}
    died: set[int] = set()
    epochs: dict[int, tuple[int, int]] = {}
    for report in reports:
        if report.leader_epoch is not None:
            seen = epochs.get(report.partition, report.leader_epoch)
            epochs[report.partition] = max(report.leader_epoch, seen)
        if report.attempt_died:
            died.add(report.partition)
        missing.setdefault(report.partition, []).extend(report.missing)
        if report.out_of_range is not None:
            out_of_range[report.partition] = report.out_of_range
            reached[report.partition] = report.reached
        if report.infra_error is not None:
            failed[report.partition] = report
    results = []
    for task in tasks:
        if task.partition in died:
            results.append(
                TaskResult(task.topic, task.partition, task.plan.generation, [], attempt_died=True)
            )
            continue
        if (failure := failed.get(task.partition)) is not None:
            assert failure.infra_error is not None
            results.append(released(task, failure.infra_error, failure.refused))
            continue
        log = OutcomeLog(task)
        ledger = ledgers.get(task.partition)
        infra_error, refused = (None, None) if ledger is None else _settle_roots(log, ledger)
        if task.partition in reached:
            log.outcomes.extend(cut_short(task, reached[task.partition]))
        results.append(
            TaskResult(
                task.topic,
                task.partition,
                task.plan.generation,
                log.finish(missing.get(task.partition, [])),
                out_of_range.get(task.partition),
                infra_error,
                refused=refused,
                leader_epoch=epochs.get(task.partition),
            )
        )
    return results


def _settle_roots(
    log: OutcomeLog, ledger: PartitionLedger
) -> tuple[str | None, KafkaRefused | None]:
    """Write the outcome of each settled root of one partition to `log` (pending roots get
    none); returns the error of the first RELEASED root, when a stage failed under some, and
    the first refusal such a stage met (it stops the run)."""
    complete, marked = ledger.settled()
    for lo, hi in runs(sorted(complete)):
        log.ack_run(lo, hi)
    infra_error = refused = None
    for offset, state, error in sorted(marked, key=itemgetter(0)):
        if state is RootState.PENDING:
            continue
        if isinstance(error, KafkaRefused):
            refused = refused or error
            error = describe_error(error)
        log.add(offset, *_SETTLED[state], error)
        if state is RootState.RELEASED and infra_error is None:
            infra_error = str(error) if error else "a later stage failed"
    return infra_error, refused

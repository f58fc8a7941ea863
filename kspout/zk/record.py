"""storm-kafka's offset record, as kspout writes and reads it: pure encode and decode, no I/O.

Each partition's commit point lives at `<zk_root>/<spout_id>/partition_<n>` as storm-kafka's
JSON record, so a topology that ran on Storm resumes where it stopped, and Storm could resume
from kspout's records::

    {"topology": {"id": "<instance>", "name": "<topology>"}, "offset": <next offset>,
     "partition": <n>, "broker": {"host": "<host>", "port": <port>}, "topic": "<topic>",
     "kspout": {"version": 1, "committed_at": <ms>, "source": "spout" | "operator",
                "stopped": "<reason>", "moved_from": <offset>,
                "done": [<gap>, <length>, ...], "done_cut": <offset>, "emitted": <offset>,
                "advanced_at": <ms>, "lost": <count>, "replaced": <count>,
                "window": <seconds>,
                "history": [[<ms>, <offset>, <emitted>], ...],
                "leader_epoch": [<position>, <epoch>]}}

The `kspout` key is ours; storm-kafka ignores unknown keys, and records it wrote (without that
key, and without `topic` in its oldest versions) are read as they are. `stopped` is present only
while `out_of_range = "fail"` holds the partition: the driver writes it with a commit, and an
operator's `move` (`kspout offsets set`) writes the record without it, which resumes the
partition. Every other field is optional too:

* `done`: the finished runs above `offset`, so a restart replays only what is unfinished (as
  Confluent's Parallel Consumer keeps its offset map). Pairs of numbers: run i starts `gap`
  offsets after the end of run i-1 (run 0: after `offset`) and holds `length` offsets. Only
  the `MAX_DONE_SPANS` runs nearest `offset` are kept; `done_cut` then says where the first
  run left out starts. An offset not listed is simply replayed, so the cap costs replays,
  never correctness. The runs are relative to the record's own `offset`: an operator's move
  writes a record without them.
* `emitted`: every offset below it had been handed out when the record was written.
* `advanced_at`: when the commit point last moved (a stuck one shows how long it has been).
* `leader_epoch`: the record at `position - 1`, the highest kspout fetched, was written in
  Kafka leader epoch `epoch` (KIP-320). A start asks the partition's leader whether its log still
  holds that epoch up to `position`; when an unclean leader election truncated it, the offsets
  from the leader's end of that epoch on are processed again (`kspout.driver.truncation`).
* `lost` and `replaced`: written by a Structured Streaming query (`kspout.streaming`): offsets
  it lost to out-of-range resets so far, and offsets it had read that an unclean leader
  election replaced (read again).
* `window` and `history`, written when the chain has a replay window (the dedup bolt's
  `[dedup] ttl`: a message finished longer ago than that would apply its effect again):
  checkpoints (when, commit point, emitted), oldest first, one every `window / HISTORY_STEP`,
  going back to the last one older than the window. Every offset below a checkpoint's commit
  point was finished by then; none at or above its `emitted` had started. So for any moment
  `t`, offsets below the largest `emitted` up to the first checkpoint after `t` may have been
  finished before `t`, and no others (`StoredOffset.finished_before`). That is how a start,
  or an operator's move, knows whether it would replay effects the dedup bolt has forgotten.
  One blind spot: offsets finished in the last commit interval before a crash are in no
  record, so a restart more than a window after such a crash replays them unchecked.

Anything malformed in these fields is ignored with a warning: the offset is what counts.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kspout.errors import OffsetRecordInvalid, TopicMismatch
from kspout.ranges import Range, union
from kspout.wording import count

log = logging.getLogger(__name__)

RECORD_VERSION = 1  # version of the fields under the "kspout" key
# Finished runs a record lists above its offset: two numbers each, a few KB at most, far below
# ZooKeeper's 1 MB znode limit and cheap to write every commit interval.
MAX_DONE_SPANS = 256
HISTORY_STEP = 16  # a window checkpoint every window / 16: a bound at most 1/16 too cautious
HISTORY_MAX = 24  # checkpoints kept at most (HISTORY_STEP + a few, for irregular writes)
PARTITION_NODE = re.compile(r"^partition_(\d+)$")
STOPPED_KEY = "stopped"  # under "kspout": why `out_of_range = "fail"` stopped the partition


def now_ms() -> int:
    """Wall-clock ms: the stamps in records, for people and for the replay window; never a
    deadline (deadlines use the monotonic clock)."""
    return int(time.time() * 1000)


def new_instance_id(topology: str) -> str:
    """A fresh instance id (the record's `topology.id`): the topology name, a random suffix."""
    return f"{topology}-{uuid.uuid4().hex[:12]}"


def encode(record: Mapping[str, Any]) -> bytes:
    """Compact JSON, as storm-kafka's json-simple writes it."""
    return json.dumps(record, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """At `at_ms`, every offset below `offset` was finished and none from `emitted` had
    started."""

    at_ms: int
    offset: int
    emitted: int


def encode_done(offset: int, spans: Sequence[Range], cut: int | None) -> dict[str, Any]:
    """The `done` (and `done_cut`) fields for finished runs above `offset`, capped."""
    if cut is None and len(spans) > MAX_DONE_SPANS:
        cut = spans[MAX_DONE_SPANS][0]
    numbers: list[int] = []
    at = offset
    for lo, hi in spans[:MAX_DONE_SPANS]:
        numbers += (lo - at, hi - lo)
        at = hi
    fields: dict[str, Any] = {"done": numbers} if numbers else {}
    if cut is not None:
        fields["done_cut"] = cut
    return fields


def next_history(
    history: Sequence[Checkpoint], now: Checkpoint, window: float
) -> tuple[Checkpoint, ...]:
    """`history` with `now` added when the last checkpoint is a step old, trimmed to reach
    just past `window`; the `emitted` of dropped checkpoints folds into the oldest kept one,
    so `finished_before` stays a safe bound after an operator moved the offset back."""
    step_ms = window * 1000 / HISTORY_STEP
    out = list(history)
    if not out or now.at_ms - out[-1].at_ms >= step_ms:
        out.append(now)
    cutoff = now.at_ms - window * 1000
    dropped = 0
    while len(out) > 1 and (out[1].at_ms <= cutoff or len(out) > HISTORY_MAX):
        dropped = max(dropped, out.pop(0).emitted)
    if dropped > out[0].emitted:
        out[0] = Checkpoint(out[0].at_ms, out[0].offset, dropped)
    return tuple(out)


def history_fields(history: Sequence[Checkpoint], window: float) -> dict[str, Any]:
    """The `window` and `history` fields."""
    return {"window": window, "history": [[c.at_ms, c.offset, c.emitted] for c in history]}


@dataclass(frozen=True, slots=True)
class StoredOffset:
    """One partition's record as read: the commit point and the znode version to CAS against."""

    partition: int
    offset: int
    version: int
    topic: str | None  # None only in records written by the oldest storm-kafka versions
    data: dict[str, Any]  # the raw record
    # Why `out_of_range = "fail"` stopped the partition (never empty); None when it runs, and
    # in every record storm-kafka wrote.
    stopped: str | None = None
    done: tuple[Range, ...] = ()  # finished runs above `offset` (absolute), ascending
    done_cut: int | None = None  # finished runs from here up were left out of `done`
    emitted: int | None = None
    advanced_at: int | None = None  # wall ms
    window: float | None = None  # seconds
    history: tuple[Checkpoint, ...] = ()
    leader_epoch: tuple[int, int] | None = None  # (position, epoch): the anchor

    @property
    def committed_at(self) -> int | None:
        """Wall ms of the write (None in records storm-kafka wrote)."""
        ours = self.data.get("kspout")
        at = ours.get("committed_at") if isinstance(ours, dict) else None
        return at if _is_count(at) else None

    def checkpoints(self) -> list[Checkpoint]:
        """The history, then the record itself as the newest checkpoint."""
        out = list(self.history)
        if self.committed_at is not None:
            emitted = max(self.offset, self.emitted or 0, self.done[-1][1] if self.done else 0)
            out.append(Checkpoint(self.committed_at, self.offset, emitted))
        return out

    def finished_before(self, at_ms: int) -> int | None:
        """An offset below which offsets may have been finished before `at_ms`, and above
        which none was; None when the record cannot tell (no history)."""
        if not self.history:
            return None
        bound = 0
        for checkpoint in self.checkpoints():
            bound = max(bound, checkpoint.emitted)
            if checkpoint.at_ms >= at_ms:
                break
        return bound

    def passed_at(self, offset: int) -> int | None:
        """Wall ms of the first checkpoint whose commit point was past `offset` (by then it was
        finished); None when none was."""
        return next((c.at_ms for c in self.checkpoints() if c.offset > offset), None)

    def replay_past_window(
        self, start: int, window: float, now: int, *, keep_done: bool
    ) -> list[Range]:
        """Finished offsets that a start at `start` would process again although they may
        have been finished more than `window` seconds before `now` (wall ms).

        `keep_done`: the start skips the runs listed in `done` (a restart at `offset`); an
        operator's move does not. Offsets left out at `done_cut` always count.
        """
        bound = self.finished_before(now - int(window * 1000))
        if bound is None:
            return []
        finished: list[Range] = [(start, self.offset)]
        if not keep_done:
            finished += self.done
        if self.done_cut is not None:
            finished.append((self.done_cut, bound))
        return list(union((max(lo, start), min(hi, bound)) for lo, hi in finished))

    @property
    def writer_name(self) -> str | None:
        """Topology name of the last writer (storm-kafka's `topology.name`)."""
        return _str_field(self.data.get("topology"), "name")

    @property
    def writer_id(self) -> str | None:
        """Instance id of the last writer (storm-kafka's `topology.id`)."""
        return _str_field(self.data.get("topology"), "id")


def _str_field(section: Any, key: str) -> str | None:
    value = section.get(key) if isinstance(section, dict) else None
    return value if isinstance(value, str) else None


def new_record(
    *,
    instance_id: str,
    topology: str,
    topic: str,
    partition: int,
    offset: int,
    broker: tuple[str, int],
    source: str,
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """storm-kafka's record for `offset`, stamped as written now by `instance_id`."""
    ours: dict[str, Any] = {
        "version": RECORD_VERSION,
        "committed_at": now_ms(),
        "source": source,
    }
    ours.update(extra or {})
    return {
        "topology": {"id": instance_id, "name": topology},
        "offset": offset,
        "partition": partition,
        "broker": {"host": broker[0], "port": broker[1]},
        "topic": topic,
        "kspout": ours,
    }


def decode(partition: int, path: str, raw: bytes, version: int, topic: str) -> StoredOffset:
    """One record's bytes as read from `path`, which belongs to `topic`.

    Raises `TopicMismatch` when the record belongs to another topic (two spouts share one
    spout id) and `OffsetRecordInvalid` when it is not an offset record at all.
    """
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OffsetRecordInvalid(path, f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise OffsetRecordInvalid(path, "not a JSON object")
    offset = data.get("offset")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise OffsetRecordInvalid(path, f"`offset` must be an integer >= 0, got {offset!r}")
    found = data.get("topic")
    if found is None:
        log.warning(
            "%s has no topic (written by an old storm-kafka); assuming it is %r", path, topic
        )
    elif not isinstance(found, str):
        raise OffsetRecordInvalid(path, f"`topic` must be a string, got {found!r}")
    elif found != topic:
        raise TopicMismatch(path, found, topic)
    return StoredOffset(
        partition, offset, version, found, data, _stopped_of(data), **_progress_of(data, path)
    )


def describe_replay(stored: StoredOffset, ranges: Sequence[Range], now: int) -> str:
    """One line for people: a partition's offsets that would apply again, and since when at
    least the first of them was finished."""
    again = sum(hi - lo for lo, hi in ranges)
    shown = ", ".join(f"[{lo}, {hi})" for lo, hi in ranges[:5])
    more = f" and {count(len(ranges) - 5, 'more range')}" if len(ranges) > 5 else ""
    passed = stored.passed_at(ranges[0][0])
    when = (
        "finished above the commit point at an unknown time"
        if passed is None
        else f"finished by {_iso(passed)} ({(now - passed) / 1000:.0f}s ago)"
    )
    return (
        f"partition {stored.partition}: offsets {shown}{more} ({count(again, 'offset')}, those "
        f"finished among them; offset {ranges[0][0]} {when})"
    )


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def broker_of(record: Mapping[str, Any]) -> tuple[str, int]:
    broker = record.get("broker")
    host = _str_field(broker, "host") or ""
    port = broker.get("port") if isinstance(broker, dict) else None
    return host, port if isinstance(port, int) else -1


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _done_of(ours: Mapping[str, Any], offset: int) -> tuple[Range, ...]:
    numbers = ours.get("done", [])
    if not (isinstance(numbers, list) and len(numbers) % 2 == 0):
        raise ValueError("`done` is not a list of (gap, length) pairs")
    spans: list[Range] = []
    at = offset
    for gap, length in zip(numbers[::2], numbers[1::2], strict=True):
        if not (_is_count(gap) and _is_count(length) and length > 0):
            raise ValueError(f"`done` holds a bad pair ({gap!r}, {length!r})")
        spans.append((at + gap, at + gap + length))
        at += gap + length
    return tuple(spans)


def _history_of(ours: Mapping[str, Any]) -> tuple[Checkpoint, ...]:
    entries = ours.get("history", [])
    if not isinstance(entries, list):
        raise ValueError("`history` is not a list")
    out = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 3 and all(map(_is_count, entry))):
            raise ValueError(f"`history` holds a bad checkpoint {entry!r}")
        out.append(Checkpoint(*entry))
    return tuple(out)


def _progress_of(record: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The optional fields under `kspout` (module docstring); a malformed one is ignored with
    a warning, so a start replays more, never less, and never crashes on it."""
    ours = record.get("kspout")
    if not isinstance(ours, dict):
        return {}
    offset = record["offset"]
    out: dict[str, Any] = {}
    try:
        out["done"] = _done_of(ours, offset)
    except ValueError as exc:
        log.warning("%s: %s; ignoring it (those offsets are replayed)", path, exc)
    for name, valid in (
        ("done_cut", _is_count),
        ("emitted", _is_count),
        ("advanced_at", _is_count),
        ("window", lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0),
    ):
        value = ours.get(name)
        if value is not None and not valid(value):
            log.warning("%s: ignoring `%s` = %s (not valid)", path, name, json.dumps(value))
        elif value is not None:
            out[name] = value
    try:
        out["history"] = _history_of(ours)
    except ValueError as exc:
        log.warning("%s: %s; ignoring the history", path, exc)
    anchor = ours.get("leader_epoch")
    if isinstance(anchor, list) and len(anchor) == 2 and all(map(_is_count, anchor)):
        out["leader_epoch"] = (anchor[0], anchor[1])
    elif anchor is not None:
        log.warning("%s: ignoring `leader_epoch` = %s (not valid)", path, json.dumps(anchor))
    return out


def _stopped_of(record: Mapping[str, Any]) -> str | None:
    """The stop reason under the `kspout` key; None when the partition is not stopped.

    A mark that is not a reason text still means stopped (an operator move clears it).
    """
    ours = record.get("kspout")
    mark = ours.get(STOPPED_KEY) if isinstance(ours, dict) else None
    if mark is None:
        return None
    if isinstance(mark, str) and mark.strip():
        return mark
    return f"stopped (the stop mark is not a reason: {json.dumps(mark)})"

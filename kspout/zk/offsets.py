"""Consumer progress in ZooKeeper, in storm-kafka's layout, written by compare-and-set.

Each partition's commit point lives at `<zk_root>/<spout_id>/partition_<n>` as storm-kafka's
JSON record, so a topology that ran on Storm resumes where it stopped, and Storm could resume
from kspout's records::

    {"topology": {"id": "<instance>", "name": "<topology>"}, "offset": <next offset>,
     "partition": <n>, "broker": {"host": "<host>", "port": <port>}, "topic": "<topic>",
     "kspout": {"version": 1, "committed_at": <ms>, "source": "spout" | "operator",
                "stopped": "<reason>", "moved_from": <offset>,
                "done": [<gap>, <length>, ...], "done_cut": <offset>, "emitted": <offset>,
                "advanced_at": <ms>, "lost": <count>, "window": <seconds>,
                "history": [[<ms>, <offset>, <emitted>], ...]}}

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
* `lost`: written by a Structured Streaming query (`kspout.streaming`): offsets it lost to
  out-of-range resets so far.
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

Writes are fenced: a commit names the znode version it read, so a driver that lost ownership of
a partition gets `OffsetConflict` instead of overwriting a newer commit. Transient ZooKeeper
errors are retried here (bounded, exponential backoff); fencing errors never are. Many records
are written at once by `commit_all`: chunks of partitions (at most `CHUNK_WRITES` records and
`CHUNK_BYTES` bytes each) go in one transaction each, every write after the check of its own
claim, and all chunks are sent before any answer is awaited, so a commit round costs one round
trip and few requests. A chunk that is refused (a claim gone, a version stale) is sent again
one partition per transaction, so only the partitions that lost their fence are refused. Many
records are read at once the same way (`read_many`, `read_all`): every read sent, then awaited.

Live spout instances register an ephemeral node under `<zk_root>/<spout_id>/instances/`, so
operators (and `kspout offsets set`) can see that a spout is running.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import socket
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from tenacity import (
    RetryError,
    Retrying,
    before_sleep_log,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from kspout.config import TopicConfig
from kspout.errors import (
    InstanceIdInUse,
    OffsetConflict,
    OffsetRecordExists,
    OffsetRecordInvalid,
    OwnershipLost,
    TopicMismatch,
    ZooKeeperAccessDenied,
    ZooKeeperUnavailable,
)
from kspout.lifecycle import Lifecycle
from kspout.wording import count

log = logging.getLogger(__name__)

T = TypeVar("T")

RECORD_VERSION = 1  # version of the fields under the "kspout" key
# Finished runs a record lists above its offset: two numbers each, a few KB at most, far below
# ZooKeeper's 1 MB znode limit and cheap to write every commit interval.
MAX_DONE_SPANS = 256
HISTORY_STEP = 16  # a window checkpoint every window / 16: a bound at most 1/16 too cautious
HISTORY_MAX = 24  # checkpoints kept at most (HISTORY_STEP + a few, for irregular writes)
PARTITION_NODE = re.compile(r"^partition_(\d+)$")
INSTANCES_NODE = "instances"
STOPPED_KEY = "stopped"  # under "kspout": why `out_of_range = "fail"` stopped the partition
MOVE_ATTEMPTS = 50  # an operator move that loses this many races in a row gives up
# A commit round's chunks (`commit_all`): records in one transaction at most, and their bytes at
# most, half of ZooKeeper's default request limit (jute.maxbuffer, 1 MB), which also has to hold
# the paths, the claim checks and the headers. A larger record goes alone.
CHUNK_WRITES = 100
CHUNK_BYTES = 512 * 1024

# Worth retrying: the request may not have reached ZooKeeper, or the session is being rebuilt.
# ConnectionClosedError (a SessionExpiredError) means we closed the client ourselves: not retried.
TRANSIENT_ERRORS = (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError)
# Someone else wrote first: we lost ownership, retrying would overwrite their write.
FENCING_ERRORS = (BadVersionError, NodeExistsError)


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, TRANSIENT_ERRORS) and not isinstance(exc, ConnectionClosedError)


def now_ms() -> int:
    """Wall-clock ms: the stamps in records, for people and for the replay window; never a
    deadline (deadlines use the monotonic clock)."""
    return int(time.time() * 1000)


def _encode(record: Mapping[str, Any]) -> bytes:
    """Compact JSON, as storm-kafka's json-simple writes it."""
    return json.dumps(record, separators=(",", ":")).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """At `at_ms`, every offset below `offset` was finished and none from `emitted` had
    started."""

    at_ms: int
    offset: int
    emitted: int


Range = tuple[int, int]  # half-open [lo, hi)


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
        out: list[Range] = []
        for lo, hi in sorted((max(lo, start), min(hi, bound)) for lo, hi in finished):
            if lo >= hi:
                continue
            if out and lo <= out[-1][1]:
                out[-1] = (out[-1][0], max(hi, out[-1][1]))
            else:
                out.append((lo, hi))
        return out

    @property
    def writer_name(self) -> str | None:
        """Topology name of the last writer (storm-kafka's `topology.name`)."""
        return _str_field(self.data.get("topology"), "name")

    @property
    def writer_id(self) -> str | None:
        """Instance id of the last writer (storm-kafka's `topology.id`)."""
        return _str_field(self.data.get("topology"), "id")


@dataclass(frozen=True, slots=True)
class OffsetWrite:
    """One partition's commit for `ZkOffsetStore.commit_all` (the arguments of `commit`)."""

    partition: int
    offset: int
    version: int | None  # the record's znode version as last read or written; None: create it
    broker: tuple[str, int] = ("", -1)
    extra: Mapping[str, Any] | None = None
    stopped: str | None = None
    fence: str | None = None


def _str_field(section: Any, key: str) -> str | None:
    value = section.get(key) if isinstance(section, dict) else None
    return value if isinstance(value, str) else None


class ZkOffsetStore(Lifecycle):
    """Reads and fences writes of one spout's offset records; registers live instances.

    Constructing does no I/O; `start()` connects (or raises `ZooKeeperUnavailable`) and
    `close()` disconnects, which also removes this instance's ephemeral registration.

    Timeouts, in seconds: `connect_timeout` bounds `start()`; `request_timeout` bounds one
    ZooKeeper request; `retry_timeout` bounds all retries of one call before it gives up;
    `session_timeout` (default: the topic file's `zk_session_timeout`) is the ZooKeeper
    session: how long ZooKeeper may not hear from this client before its ephemeral nodes (the
    registration, the claims) are gone; the registration is recreated on reconnect.
    """

    def __init__(
        self,
        config: TopicConfig,
        *,
        instance_id: str | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 10.0,
        retry_timeout: float = 30.0,
        session_timeout: float | None = None,
    ) -> None:
        self.config = config
        self.instance_id = instance_id or f"{config.topology_name}-{uuid.uuid4().hex[:12]}"
        self.path = config.zk_spout_path
        self._hosts = config.zookeeper
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._retry_timeout = retry_timeout
        self._session_timeout = (
            config.zk_session_timeout if session_timeout is None else session_timeout
        )
        self._client: Any = None  # KazooClient once started
        self._registered: str | None = None  # our ephemeral instance node, once registered
        self._session_lost = False
        self._parents: set[str] = set()  # parent paths known to exist
        # This instance's node: who it is (`register_instance`) and its last report.
        self._instance_info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "topology": config.topology_name,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Connect to ZooKeeper; `ZooKeeperUnavailable` if no server answers in time."""
        if self._client is not None:
            return
        client = KazooClient(
            timeout=self._session_timeout,
            # Reconnect quickly once ZooKeeper is back (kazoo's default backoff grows to 1 h).
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
            **self.config.kazoo_args(),
        )
        try:
            client.start(timeout=self._connect_timeout)
        except KazooTimeoutError:
            raise ZooKeeperUnavailable(
                f"could not connect to ZooKeeper at {self._hosts} within "
                f"{self._connect_timeout:g}s; check that the ensemble is running and reachable "
                f"from this host; the address is {self.config.origin('zookeeper')}"
            ) from None
        client.add_listener(self._on_state)
        self._client = client

    def close(self) -> None:
        """Disconnect; ZooKeeper drops this instance's ephemeral registration with the session."""
        client, self._client = self._client, None
        self._registered = None
        if client is not None:
            client.stop()
            client.close()

    # -- offsets -----------------------------------------------------------------------------

    def partition_path(self, partition: int) -> str:
        return f"{self.path}/partition_{partition}"

    def read(self, partition: int) -> StoredOffset | None:
        """The partition's record, or None when there is none.

        Raises `TopicMismatch` when the record belongs to another topic (two spouts share one
        spout id) and `OffsetRecordInvalid` when it is not an offset record at all.
        """
        return self.read_many([partition]).get(partition)

    def read_many(self, partitions: Iterable[int]) -> dict[int, StoredOffset]:
        """The records of `partitions` that exist, by partition (ascending); errors as `read`.

        Every read is sent before any answer is awaited: kazoo pipelines them on the session's
        one connection, so a thousand records cost one round trip, not a thousand.
        """
        wanted = sorted(set(partitions))
        paths = [self.partition_path(p) for p in wanted]
        where = paths[0] if len(paths) == 1 else self.path
        many = f"read {count(len(paths), 'record')} under {where}"
        action = f"read {where}" if len(paths) == 1 else many
        found = self.call(action, where, lambda zk: self._get_all(zk, paths))
        return {
            p: self.decode(p, path, *node)
            for p, path, node in zip(wanted, paths, found, strict=True)
            if node is not None
        }

    def read_all(self) -> dict[int, StoredOffset]:
        """Every `partition_<n>` record under the spout path, by partition (`read_many`)."""
        children = self.call(
            f"list {self.path}", self.path, lambda zk: self._children(zk, self.path)
        )
        matches = (PARTITION_NODE.match(child) for child in children)
        # A record deleted between the listing and the read is left out.
        return self.read_many(int(m.group(1)) for m in matches if m is not None)

    def commit(
        self,
        partition: int,
        offset: int,
        *,
        version: int | None,
        broker: tuple[str, int] = ("", -1),
        extra: Mapping[str, Any] | None = None,
        stopped: str | None = None,
        fence: str | None = None,
    ) -> int:
        """Write the commit point if the record is still at `version`; return the new version.

        `version=None` creates the first record. `extra` adds fields under the `kspout` key.
        `stopped` (a reason, for people) marks the partition as stopped by `out_of_range =
        "fail"`; a commit without it writes a record without the mark. `fence` is the path of
        this instance's claim on the partition (`kspout.ownership`): the write and a check that
        the claim still exists go in one ZooKeeper transaction.
        Raises `OffsetConflict` (`OffsetRecordExists` for a create, `OwnershipLost` when the
        claim is gone) when someone else wrote first: this instance no longer owns the
        partition. That is never retried.
        """
        write = OffsetWrite(partition, offset, version, broker, extra, stopped, fence)
        outcome = self.commit_all([write])[partition]
        if isinstance(outcome, OffsetConflict):
            raise outcome
        return outcome

    def commit_all(
        self,
        writes: Sequence[OffsetWrite],
        *,
        chunk_writes: int = CHUNK_WRITES,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> dict[int, int | OffsetConflict]:
        """`commit` of many partitions at once: per partition, its record's new version, or
        the `OffsetConflict` that refused it.

        The writes go in chunks of at most `chunk_writes` records and `chunk_bytes` bytes of
        records, one ZooKeeper transaction each (every write after the check of its own claim):
        a request costs kazoo far more than an operation, and ZooKeeper refuses a request over
        1 MB. All chunks are sent before any answer is awaited; kazoo pipelines them on the
        session's one connection, so the round costs one round trip. A transaction is
        all-or-nothing, so a refused chunk is sent again one partition per transaction: each
        partition gets its own fence outcome, and only those that lost it are refused.
        `chunk_writes=1` sends every partition in its own transaction from the start. After a
        lost connection, the writes that got no answer are sent again (`call`).
        """
        payloads = {w.partition: self._payload(w) for w in writes}
        if len(payloads) != len(writes):
            raise ValueError("commit_all takes at most one write per partition")
        if not writes:
            return {}
        chunks = _chunks(writes, payloads, chunk_writes, chunk_bytes)
        commit = _CommitRound(self, payloads, chunks)
        where = self.partition_path(writes[0].partition) if len(writes) == 1 else self.path
        action = f"commit {count(len(writes), 'record')} under {where}"
        self.call(action, where, commit.send_unanswered)
        return {w.partition: commit.outcome(w) for w in writes}

    def _payload(self, write: OffsetWrite) -> bytes:
        """The record `write` puts in its partition's node (checks the stop mark first)."""
        if write.extra is not None and STOPPED_KEY in write.extra:
            raise ValueError(f"pass the stop reason as `stopped=`, not in `extra[{STOPPED_KEY!r}]`")
        if write.stopped is not None and not write.stopped.strip():
            raise ValueError("`stopped` must say why the partition stopped")
        fields = dict(write.extra or {})
        if write.stopped is not None:
            fields[STOPPED_KEY] = write.stopped
        record = self._record(write.partition, write.offset, write.broker, "spout", fields)
        return _encode(record)

    def _outcome(
        self, write: OffsetWrite, payload: bytes, answer: int | Exception, resent: bool
    ) -> int | OffsetConflict:
        """A write's new version, or the conflict that refused it (never retried)."""
        if isinstance(answer, int | OffsetConflict):
            return answer
        path = self.partition_path(write.partition)
        # After a lost connection an earlier send may have been applied; if the record holds
        # exactly our bytes, that conflict is with ourselves.
        applied = self._version_if_holds(path, payload) if resent else None
        if applied is not None:
            return applied
        if write.version is None:
            return OffsetRecordExists(path)
        return OffsetConflict(path, write.version)

    def claim(
        self, partition: int, fence: str, claim: bytes, initial: Callable[[], int]
    ) -> StoredOffset | None:
        """Take the partition: create the ephemeral claim node `fence` and, in the same
        transaction, rewrite the record unchanged (or create it at offset `initial()` when
        there is none), so its version moves and a former owner's next commit is refused.

        Returns the record as claimed, or None when another live session holds the claim.
        """
        path = self.partition_path(partition)
        for _ in range(MOVE_ATTEMPTS):
            found = self.call(f"read {path}", path, lambda zk: self._get(zk, path))
            if found is None:
                record = self._record(
                    partition, initial(), ("", -1), "claim", {"advanced_at": now_ms()}
                )
                raw, version = _encode(record), None
            else:
                raw, version = found
                self.decode(partition, path, raw, version)  # refuse another topic's record
            outcome = self.call(
                f"claim {path}",
                fence,
                functools.partial(
                    self._claim_once, fence=fence, claim=claim, path=path, raw=raw, version=version
                ),
            )
            if outcome == "busy":
                return None
            if outcome == "raced":
                continue
            return self.decode(partition, path, raw, 0 if version is None else version + 1)
        raise OffsetConflict(path, -1)

    def _claim_once(
        self, zk: Any, *, fence: str, claim: bytes, path: str, raw: bytes, version: int | None
    ) -> str:
        """One claim transaction: "ok", "busy" (the claim node is held) or "raced" (the record
        changed since it was read)."""
        self._ensure_parent(zk, fence)
        self._ensure_parent(zk, path)
        t = zk.transaction()
        t.create(fence, claim, ephemeral=True)
        if version is None:
            t.create(path, raw)
        else:
            t.set_data(path, raw, version=version)
        results = self.wait(t.commit_async())
        if not any(isinstance(r, Exception) for r in results):
            return "ok"
        if isinstance(results[0], NodeExistsError):
            stat = self.wait(zk.exists_async(fence))
            # Ours when an earlier attempt went through before its reply was lost.
            if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
                return "ok"
            return "busy"
        return "raced"

    def _ensure_parent(self, zk: Any, path: str) -> None:
        """Create the parents of `path` (with the client's default ACL) if missing."""
        parent = path.rsplit("/", 1)[0]
        if parent and parent not in self._parents:
            self.wait(zk.ensure_path_async(parent))
            self._parents.add(parent)

    def read_node(self, path: str) -> tuple[bytes, int] | None:
        """Any node's bytes and version under the spout path; None when it does not exist."""
        return self.call(f"read {path}", path, lambda zk: self._get(zk, path))

    def children_of(self, path: str) -> list[str]:
        """Any node's children, sorted; [] when it does not exist."""
        return sorted(self.call(f"list {path}", path, lambda zk: self._children(zk, path)))

    def move(self, partition: int, offset: int) -> StoredOffset:
        """Operator move: set the commit point to `offset`, creating the record if absent.

        A read-modify-write retried when another writer wins the race (compare-and-set on the
        znode version). A record that is not valid JSON is overwritten (this is how an operator
        repairs it); a record for another topic raises `TopicMismatch`. The new record has no
        stop mark, so a partition stopped by `out_of_range = "fail"` resumes from `offset` (a
        running driver notices the change), and no finished runs (they were relative to the
        old offset); it keeps the window history, whose facts stay true.
        """
        for _ in range(MOVE_ATTEMPTS):
            moved = self._move_once(partition, offset)
            if moved is not None:
                return moved
            log.info("%s changed while moving it; reading it again", self.partition_path(partition))
        raise OffsetConflict(self.partition_path(partition), -1)

    def _move_once(self, partition: int, offset: int) -> StoredOffset | None:
        """One read-modify-CAS round of `move`; None when another writer won the race."""
        path = self.partition_path(partition)
        found = self.call(f"read {path}", path, lambda zk: self._get(zk, path))
        old: StoredOffset | None = None
        if found is not None:
            try:
                old = self.decode(partition, path, *found)
            except OffsetRecordInvalid:
                log.warning("%s: overwriting an invalid record (operator move)", path)
        moved_from = old.offset if old is not None else None
        now = now_ms()
        fields: dict[str, Any] = {"moved_from": moved_from, "emitted": offset, "advanced_at": now}
        if old is not None and old.window is not None:  # what was finished when stays true
            checkpoint = Checkpoint(now, offset, offset)
            history = next_history(old.checkpoints(), checkpoint, old.window)
            fields.update(history_fields(history, old.window))
        broker = _broker_of(old.data) if old is not None else ("", -1)
        record = self._record(partition, offset, broker, "operator", fields)
        payload = _encode(record)
        expected = None if found is None else found[1]
        try:
            version = self.call(
                f"move {path}",
                path,
                lambda zk: self._written(
                    self.wait(self._write(zk, path, payload, expected)), path, expected
                ),
            )
        except FENCING_ERRORS:
            return None
        log.info("%s moved from %s to %d", path, moved_from, offset)
        if old is not None and old.stopped is not None:
            log.info("%s: the stop is cleared (it was: %s)", path, old.stopped)
        return self.decode(partition, path, _encode(record), version)

    # -- live instances ----------------------------------------------------------------------

    def register_instance(self) -> str:
        """Create this instance's ephemeral node (host, pid, start time) and return its path.

        It disappears when this client closes or its session expires; after an expiry it is
        created again as soon as the client reconnects.
        """
        path = f"{self.path}/{INSTANCES_NODE}/{self.instance_id}"
        self._instance_info.setdefault("started_at", now_ms())
        payload = _encode(self._instance_info)

        def create(zk: Any) -> None:
            try:
                self.wait(zk.create_async(path, payload, ephemeral=True, makepath=True))
            except NodeExistsError:
                stat = self.wait(zk.exists_async(path))
                # Ours when an earlier attempt of this call went through before a lost reply.
                if stat is None or stat.ephemeralOwner != zk.client_id[0]:
                    raise InstanceIdInUse(path) from None

        self.call(f"register {path}", path, create)
        self._registered = path
        return path

    def report_instance(self, fields: Mapping[str, Any]) -> None:
        """Add `fields` to this instance's node (what `kspout status` shows of it); kept for
        the node's re-creation after a session expiry. Needs `register_instance` first."""
        self._instance_info.update(fields)
        path = self._registered
        if path is None:
            raise RuntimeError("report_instance() before register_instance()")
        payload = _encode(self._instance_info)

        def write(zk: Any) -> None:
            # Gone when the session expired: re-registration writes the info kept above.
            with contextlib.suppress(NoNodeError):
                self.wait(zk.set_async(path, payload))

        self.call(f"report {path}", path, write)

    @property
    def client(self) -> Any:
        """The kazoo client (for watches and listeners); None before `start()`."""
        return self._client

    def live_instances(self) -> list[str]:
        """Instance ids of the spout instances registered right now, sorted."""
        parent = f"{self.path}/{INSTANCES_NODE}"
        return sorted(self.call(f"list {parent}", parent, lambda zk: self._children(zk, parent)))

    # -- internals ---------------------------------------------------------------------------

    def _record(
        self,
        partition: int,
        offset: int,
        broker: tuple[str, int],
        source: str,
        extra: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """storm-kafka's record for `offset`, stamped as written by this instance."""
        ours: dict[str, Any] = {
            "version": RECORD_VERSION,
            "committed_at": now_ms(),
            "source": source,
        }
        ours.update(extra or {})
        return {
            "topology": {"id": self.instance_id, "name": self.config.topology_name},
            "offset": offset,
            "partition": partition,
            "broker": {"host": broker[0], "port": broker[1]},
            "topic": self.config.topic,
            "kspout": ours,
        }

    def decode(self, partition: int, path: str, raw: bytes, version: int) -> StoredOffset:
        """One record's bytes as read from `path` (no I/O); see `read` for the errors."""
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OffsetRecordInvalid(path, f"not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise OffsetRecordInvalid(path, "not a JSON object")
        offset = data.get("offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise OffsetRecordInvalid(path, f"`offset` must be an integer >= 0, got {offset!r}")
        topic = data.get("topic")
        if topic is None:
            log.warning(
                "%s has no topic (written by an old storm-kafka); assuming it is %r",
                path,
                self.config.topic,
            )
        elif not isinstance(topic, str):
            raise OffsetRecordInvalid(path, f"`topic` must be a string, got {topic!r}")
        elif topic != self.config.topic:
            raise TopicMismatch(path, topic, self.config.topic)
        return StoredOffset(
            partition, offset, version, topic, data, _stopped_of(data), **_progress_of(data, path)
        )

    def _version_if_holds(self, path: str, payload: bytes) -> int | None:
        """The znode version if the node holds exactly `payload`, else None."""
        found = self.call(f"read {path}", path, lambda zk: self._get(zk, path))
        return found[1] if found is not None and found[0] == payload else None

    def _send(self, zk: Any, write: OffsetWrite, payload: bytes) -> Any:
        """Send one record write without waiting for its answer (kazoo's async result, read
        by `_written`); with a fence, in one transaction with a check that the claim node
        still exists."""
        if write.fence is None:
            return self._write(zk, self.partition_path(write.partition), payload, write.version)
        return self._transaction(zk, [(write, payload)])

    def _write(self, zk: Any, path: str, payload: bytes, version: int | None) -> Any:
        """Send a create (`version` None) or a compare-and-set of the node (async result)."""
        if version is None:
            return zk.create_async(path, payload, makepath=True)
        return zk.set_async(path, payload, version=version)

    def _transaction(self, zk: Any, writes: Sequence[tuple[OffsetWrite, bytes]]) -> Any:
        """Send the writes as one transaction (async result: one answer per operation), each
        write a create or compare-and-set after the check that its claim node exists."""
        t = zk.transaction()
        for write, payload in writes:
            path = self.partition_path(write.partition)
            if write.fence is not None:
                t.check(write.fence, 0)
            if write.version is None:
                t.create(path, payload)
            else:
                t.set_data(path, payload, version=write.version)
        return t.commit_async()

    def _written(
        self, answer: Any, path: str, version: int | None, fence: str | None = None
    ) -> int:
        """The record's new version from the answer to `_send`; raises `OwnershipLost` when
        the claim check failed, or the write's own error."""
        if fence is not None:
            checked, answer = answer
            if isinstance(checked, Exception) and not isinstance(checked, RolledBackError):
                raise OwnershipLost(path, fence)
            if isinstance(answer, Exception):
                raise answer
        return 0 if version is None else int(answer.version)

    def _get(self, zk: Any, path: str) -> tuple[bytes, int] | None:
        """A node's bytes and version; None when it does not exist."""
        return self._got(zk.get_async(path))

    def _get_all(self, zk: Any, paths: Sequence[str]) -> list[tuple[bytes, int] | None]:
        """`_get` of every path, all sent before the first answer is awaited."""
        requests = [zk.get_async(path) for path in paths]
        return [self._got(request) for request in requests]

    def _got(self, request: Any) -> tuple[bytes, int] | None:
        """The answer to a `get_async`: the node's bytes and version, or None (no node)."""
        try:
            raw, stat = self.wait(request)
        except NoNodeError:
            return None
        return raw, int(stat.version)

    def _children(self, zk: Any, path: str) -> list[str]:
        try:
            return list(self.wait(zk.get_children_async(path)))
        except NoNodeError:
            return []

    def wait(self, result: Any) -> Any:
        """A kazoo async result, waited for at most `request_timeout` (KazooTimeoutError)."""
        return result.get(timeout=self._request_timeout)

    def call(self, action: str, path: str, op: Callable[[Any], T]) -> T:
        """Run `op(client)`, retrying transient ZooKeeper errors within `retry_timeout`; a
        NoAuth answer becomes `ZooKeeperAccessDenied` naming `path`."""
        client = self._client
        if client is None:
            raise RuntimeError("ZkOffsetStore is not started: call start() or use `with`")

        def attempt() -> T:
            if not client.connected:  # fail fast rather than queue a request until reconnect
                raise ConnectionLoss("not connected to ZooKeeper")
            return op(client)

        retrying = Retrying(
            stop=stop_after_delay(self._retry_timeout),
            wait=wait_exponential(multiplier=0.1, min=0.1, max=2.0),
            retry=retry_if_exception(_is_transient),
            before_sleep=before_sleep_log(log, logging.WARNING),
        )
        try:
            return retrying(attempt)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self._hosts} did not answer ({action}) for "
                f"{self._retry_timeout:g}s (last error: {type(last).__name__}); check that the "
                "ensemble is running and reachable from this host"
            ) from last
        except NoAuthError:
            raise ZooKeeperAccessDenied(path, self._hosts) from None

    def _on_state(self, state: str) -> None:
        """kazoo listener (connection thread: must not block): re-register after an expiry."""
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            if self._registered is not None and self._client is not None:
                self._client.handler.spawn(self._reregister)

    def _reregister(self) -> None:
        try:
            self.register_instance()
            log.warning("ZooKeeper session expired; registered instance %s again", self._registered)
        except Exception:  # a background thread: log, never raise into kazoo
            log.exception("could not register instance %s again", self.instance_id)


Chunk = tuple[OffsetWrite, ...]  # the writes `commit_all` sends in one request


def _chunks(
    writes: Sequence[OffsetWrite], payloads: Mapping[int, bytes], most: int, most_bytes: int
) -> list[Chunk]:
    """`writes` in order, cut into chunks of at most `most` writes and `most_bytes` bytes of
    records (a larger record goes alone)."""
    chunks: list[Chunk] = []
    chunk: list[OffsetWrite] = []
    size = 0
    for write in writes:
        length = len(payloads[write.partition])
        if chunk and (len(chunk) >= most or size + length > most_bytes):
            chunks.append(tuple(chunk))
            chunk, size = [], 0
        chunk.append(write)
        size += length
    chunks.append(tuple(chunk))
    return chunks


class _CommitRound:
    """One `commit_all` call: its chunks still to send, the answers so far, and how often each
    partition's write went out (after a lost answer, it may have been applied)."""

    def __init__(
        self, store: ZkOffsetStore, payloads: Mapping[int, bytes], chunks: list[Chunk]
    ) -> None:
        self.store = store
        self.payloads = payloads
        self.chunks = chunks  # a refused chunk is replaced by chunks of one write each
        self.answers: dict[int, int | Exception] = {}
        self.sends: Counter[int] = Counter()
        self.refusals: Counter[int] = Counter()  # sends refused whole: certainly not applied

    def send_unanswered(self, zk: Any) -> None:
        """Send every chunk without an answer, all before awaiting any, and read the answers;
        a refused chunk's writes are sent again, one per transaction. Raises the transient
        error of a chunk that got no answer once all are read (`call` sends it again)."""
        sent = deque(
            (chunk, self._send(zk, chunk))
            for chunk in self.chunks
            if chunk[0].partition not in self.answers
        )
        lost: Exception | None = None
        while sent:
            chunk, request = sent.popleft()
            try:
                refused = self._settle(chunk, request)
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                lost = exc  # sent again, with the others that got no answer
                continue
            if refused:
                sent.extend((alone, self._send(zk, alone)) for alone in self._split(chunk))
        if lost is not None:
            raise lost

    def outcome(self, write: OffsetWrite) -> int | OffsetConflict:
        """The write's new version, or the conflict that refused it (`ZkOffsetStore._outcome`);
        "resent" when a send of it got no answer, so it may have been applied."""
        p = write.partition
        resent = self.sends[p] - self.refusals[p] > 1
        return self.store._outcome(write, self.payloads[p], self.answers[p], resent)

    def _send(self, zk: Any, chunk: Chunk) -> Any:
        """Send the chunk without awaiting its answer (kazoo's async result)."""
        self.sends.update(w.partition for w in chunk)
        if len(chunk) == 1:
            return self.store._send(zk, chunk[0], self.payloads[chunk[0].partition])
        if any(w.version is None for w in chunk):  # a create in a transaction: no makepath
            self.store._ensure_parent(zk, self.store.partition_path(chunk[0].partition))
        return self.store._transaction(zk, [(w, self.payloads[w.partition]) for w in chunk])

    def _settle(self, chunk: Chunk, request: Any) -> bool:
        """Await a sent chunk's answer and record it; True when a chunk of several was refused
        (its writes then need an answer each). Raises a transient error (no answer)."""
        if len(chunk) == 1:
            write = chunk[0]
            path = self.store.partition_path(write.partition)
            try:
                self.answers[write.partition] = self.store._written(
                    self.store.wait(request), path, write.version, write.fence
                )
            except (*FENCING_ERRORS, OwnershipLost) as exc:
                self.answers[write.partition] = exc
            return False
        answer = self.store.wait(request)
        if any(isinstance(result, Exception) for result in answer):
            log.debug("%s; sending its writes one per transaction", _refusal(chunk, answer))
            return True
        written = iter(answer)
        for write in chunk:
            if write.fence is not None:
                next(written)  # the claim check's answer
            stat = next(written)
            self.answers[write.partition] = 0 if write.version is None else int(stat.version)
        return False

    def _split(self, chunk: Chunk) -> list[Chunk]:
        """Replace a refused chunk by one chunk per write; none of its writes was applied."""
        alone: list[Chunk] = [(write,) for write in chunk]
        at = self.chunks.index(chunk)
        self.chunks[at : at + 1] = alone
        self.refusals.update(w.partition for w in chunk)
        return alone


def _refusal(chunk: Chunk, results: Sequence[Any]) -> str:
    """Which operation refused a chunk's transaction: ZooKeeper answers the failed one with
    its error, those before it with RolledBackError and those after with RuntimeInconsistency."""
    partitions = [w.partition for w in chunk for _ in range(1 if w.fence is None else 2)]
    for partition, result in zip(partitions, results, strict=True):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return (
                f"a commit of {count(len(chunk), 'partition')} refused at partition {partition} "
                f"({type(result).__name__})"
            )
    return f"a commit of {count(len(chunk), 'partition')} refused"


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


def _broker_of(record: Mapping[str, Any]) -> tuple[str, int]:
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

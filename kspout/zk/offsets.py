"""The offset store: one spout's offset records in ZooKeeper, written by compare-and-set.

ZooKeeper layout: each partition's commit point lives at `<zk_root>/<spout_id>/partition_<n>` as
storm-kafka's JSON record (`kspout.zk.record`), so a topology that ran on Storm resumes where it
stopped, and Storm could resume from kspout's records.

Writes are fenced: a commit names the znode version it read, so a driver that lost ownership of
a partition gets `OffsetConflict` instead of overwriting a newer commit. Transient ZooKeeper
errors are retried by the session (`ZkSession.call`); fencing errors never are. Many records
are written at once by `commit_all`: bundles of partitions (at most `BUNDLE_WRITES` records and
`BUNDLE_BYTES` bytes each) go in one transaction each, every write after the check of its own
claim (`kspout.zk.claims`), and all bundles are sent before any answer is awaited, so a commit
round costs one round trip and few requests. A bundle that is refused (a claim gone, a version
stale) is sent again one partition per transaction, so only the partitions that lost their
fence are refused. Many records are read at once the same way (`read_many`, `read_all`):
every read sent, then awaited.

A commit round (`_CommitRound`), per bundle::

    UNSENT --sent--> SENT --answered--> WRITTEN (each write's new version)
    SENT --refused (several writes)--> split: UNSENT, one write per bundle
    SENT --refused (one write)--> CONFLICT (OffsetConflict, never retried)
    SENT --no answer (transient)--> UNSENT (the session's retry sends it again)
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import RolledBackError, RuntimeInconsistency

from kspout.errors import (
    OffsetConflict,
    OffsetRecordExists,
    OffsetRecordInvalid,
    OwnershipLost,
)
from kspout.wording import count
from kspout.zk.record import (
    PARTITION_NODE,
    STOPPED_KEY,
    Checkpoint,
    StoredOffset,
    broker_of,
    decode,
    encode,
    history_fields,
    new_instance_id,
    new_record,
    next_history,
    now_ms,
)
from kspout.zk.session import FENCING_ERRORS, Race, ZkSession, is_transient, until_won

log = logging.getLogger(__name__)

# A commit round's bundles (`commit_all`): records in one transaction at most, and their bytes at
# most, half of ZooKeeper's default request limit (jute.maxbuffer, 1 MB), which also has to hold
# the paths, the claim checks and the headers. A larger record goes alone.
BUNDLE_WRITES = 100
BUNDLE_BYTES = 512 * 1024


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


class ZkOffsetStore:
    """Reads and fences writes of one spout's offset records, through `session`.

    `instance_id` (default: a fresh one) is stamped in every record this store writes
    (storm-kafka's `topology.id`); the driver registers under the same id.
    """

    def __init__(self, session: ZkSession, *, instance_id: str | None = None) -> None:
        self.session = session
        self.config = session.config
        self.instance_id = instance_id or new_instance_id(self.config.topology_name)
        self.path = session.path

    def partition_path(self, partition: int) -> str:
        return f"{self.path}/partition_{partition}"

    # -- reads -------------------------------------------------------------------------------

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
        session = self.session
        wanted = sorted(set(partitions))
        paths = [self.partition_path(p) for p in wanted]
        where = paths[0] if len(paths) == 1 else self.path
        many = f"read {count(len(paths), 'record')} under {where}"
        action = f"read {where}" if len(paths) == 1 else many
        found = session.call(action, where, lambda zk: session.get_all(zk, paths))
        return {
            p: self.decode(p, path, *node)
            for p, path, node in zip(wanted, paths, found, strict=True)
            if node is not None
        }

    def read_all(self) -> dict[int, StoredOffset]:
        """Every `partition_<n>` record under the spout path, by partition (`read_many`)."""
        session = self.session
        children = session.call(
            f"list {self.path}", self.path, lambda zk: session.children(zk, self.path)
        )
        matches = (PARTITION_NODE.match(child) for child in children)
        # A record deleted between the listing and the read is left out.
        return self.read_many(int(m.group(1)) for m in matches if m is not None)

    def decode(self, partition: int, path: str, raw: bytes, version: int) -> StoredOffset:
        """One record's bytes as read from `path` (no I/O); see `read` for the errors."""
        return decode(partition, path, raw, version, self.config.topic)

    def record(
        self,
        partition: int,
        offset: int,
        broker: tuple[str, int],
        source: str,
        extra: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """storm-kafka's record for `offset`, stamped as written by this instance."""
        return new_record(
            instance_id=self.instance_id,
            topology=self.config.topology_name,
            topic=self.config.topic,
            partition=partition,
            offset=offset,
            broker=broker,
            source=source,
            extra=extra,
        )

    # -- commits -----------------------------------------------------------------------------

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
        this instance's claim on the partition (`kspout.zk.claims`): the write and a check
        that the claim still exists go in one ZooKeeper transaction.
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
        bundle_writes: int = BUNDLE_WRITES,
        bundle_bytes: int = BUNDLE_BYTES,
    ) -> dict[int, int | OffsetConflict]:
        """`commit` of many partitions at once: per partition, its record's new version, or
        the `OffsetConflict` that refused it.

        The writes go in bundles of at most `bundle_writes` records and `bundle_bytes` bytes of
        records, one ZooKeeper transaction each (every write after the check of its own claim):
        a request costs kazoo far more than an operation, and ZooKeeper refuses a request over
        1 MB. All bundles are sent before any answer is awaited; kazoo pipelines them on the
        session's one connection, so the round costs one round trip. A transaction is
        all-or-nothing, so a refused bundle is sent again one partition per transaction: each
        partition gets its own fence outcome, and only those that lost it are refused.
        `bundle_writes=1` sends every partition in its own transaction from the start. After a
        lost connection, the writes that got no answer are sent again (`ZkSession.call`).
        """
        payloads = {w.partition: self._payload(w) for w in writes}
        if len(payloads) != len(writes):
            raise ValueError("commit_all takes at most one write per partition")
        if not writes:
            return {}
        paths = {w.partition: self.partition_path(w.partition) for w in writes}
        bundles = _bundles(writes, payloads, bundle_writes, bundle_bytes)
        commit = _CommitRound(self.session, paths, payloads, bundles)
        where = paths[writes[0].partition] if len(writes) == 1 else self.path
        action = f"commit {count(len(writes), 'record')} under {where}"
        self.session.call(action, where, commit.send_unanswered)
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
        record = self.record(write.partition, write.offset, write.broker, "spout", fields)
        return encode(record)

    # -- operator moves ----------------------------------------------------------------------

    def move(self, partition: int, offset: int) -> StoredOffset:
        """Operator move: set the commit point to `offset`, creating the record if absent.

        A read-modify-write retried when another writer wins the race (compare-and-set on the
        znode version). A record that is not valid JSON is overwritten (this is how an operator
        repairs it); a record for another topic raises `TopicMismatch`. The new record has no
        stop mark, so a partition stopped by `out_of_range = "fail"` resumes from `offset` (a
        running driver notices the change), and no finished runs (they were relative to the
        old offset); it keeps the window history, whose facts stay true.
        """
        path = self.partition_path(partition)
        return until_won(path, "moving it", lambda: self._move_once(partition, offset))

    def _move_once(self, partition: int, offset: int) -> StoredOffset | Literal[Race.LOST]:
        """One read-modify-CAS round of `move`."""
        session = self.session
        path = self.partition_path(partition)
        found = session.read_node(path)
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
        broker = broker_of(old.data) if old is not None else ("", -1)
        record = self.record(partition, offset, broker, "operator", fields)
        payload = encode(record)
        expected = None if found is None else found[1]
        try:
            version = session.call(
                f"move {path}",
                path,
                lambda zk: written(
                    session.wait(send_write(zk, path, payload, expected)), path, expected
                ),
            )
        except FENCING_ERRORS:
            return Race.LOST
        log.info("%s moved from %s to %d", path, moved_from, offset)
        if old is not None and old.stopped is not None:
            log.info("%s: the stop is cleared (it was: %s)", path, old.stopped)
        return self.decode(partition, path, encode(record), version)


# -- the requests of a commit ----------------------------------------------------------------


def send_write(zk: KazooClient, path: str, payload: bytes, version: int | None) -> Any:
    """Send a create (`version` None) or a compare-and-set of the node (async result)."""
    if version is None:
        return zk.create_async(path, payload, makepath=True)
    return zk.set_async(path, payload, version=version)


def send_transaction(zk: KazooClient, writes: Sequence[tuple[str, OffsetWrite, bytes]]) -> Any:
    """Send the writes (path, write, record) as one transaction (async result: one answer per
    operation), each a create or compare-and-set after the check that its claim node exists."""
    t = zk.transaction()
    for path, write, payload in writes:
        if write.fence is not None:
            t.check(write.fence, 0)
        if write.version is None:
            t.create(path, payload)
        else:
            t.set_data(path, payload, version=write.version)
    return t.commit_async()


def written(answer: Any, path: str, version: int | None, fence: str | None = None) -> int:
    """The record's new version from the answer to one write (with `fence`: to its
    transaction); raises `OwnershipLost` when the claim check failed, or the write's own
    error."""
    if fence is not None:
        checked, answer = answer
        if isinstance(checked, Exception) and not isinstance(checked, RolledBackError):
            raise OwnershipLost(path, fence)
        if isinstance(answer, Exception):
            raise answer
    return 0 if version is None else int(answer.version)


Bundle = tuple[OffsetWrite, ...]  # the writes `commit_all` sends in one request


def _bundles(
    writes: Sequence[OffsetWrite], payloads: Mapping[int, bytes], most: int, most_bytes: int
) -> list[Bundle]:
    """`writes` in order, cut into bundles of at most `most` writes and `most_bytes` bytes of
    records (a larger record goes alone)."""
    bundles: list[Bundle] = []
    bundle: list[OffsetWrite] = []
    size = 0
    for write in writes:
        length = len(payloads[write.partition])
        if bundle and (len(bundle) >= most or size + length > most_bytes):
            bundles.append(tuple(bundle))
            bundle, size = [], 0
        bundle.append(write)
        size += length
    bundles.append(tuple(bundle))
    return bundles


class _CommitRound:
    """One `commit_all` call: its bundles still to send, the answers so far, and how often each
    partition's write went out (after a lost answer, it may have been applied)."""

    def __init__(
        self,
        session: ZkSession,
        paths: Mapping[int, str],
        payloads: Mapping[int, bytes],
        bundles: list[Bundle],
    ) -> None:
        self.session = session
        self.paths = paths
        self.payloads = payloads
        self.bundles = bundles  # a refused bundle is replaced by bundles of one write each
        self.answers: dict[int, int | Exception] = {}
        self.sends: Counter[int] = Counter()
        self.refusals: Counter[int] = Counter()  # sends refused whole: certainly not applied

    def send_unanswered(self, zk: KazooClient) -> None:
        """Send every bundle without an answer, all before awaiting any, and read the answers;
        a refused bundle's writes are sent again, one per transaction. Raises the transient
        error of a bundle that got no answer once all are read (`call` sends it again)."""
        sent = deque(
            (bundle, self._send(zk, bundle))
            for bundle in self.bundles
            if bundle[0].partition not in self.answers
        )
        lost: Exception | None = None
        while sent:
            bundle, request = sent.popleft()
            try:
                refused = self._await_answer(bundle, request)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                lost = exc  # sent again, with the others that got no answer
                continue
            if refused:
                sent.extend((alone, self._send(zk, alone)) for alone in self._split(bundle))
        if lost is not None:
            raise lost

    def outcome(self, write: OffsetWrite) -> int | OffsetConflict:
        """The write's new version, or the conflict that refused it (never retried)."""
        p = write.partition
        answer = self.answers[p]
        if isinstance(answer, int | OffsetConflict):
            return answer
        path = self.paths[p]
        # After a lost connection an earlier send may have been applied; if the record holds
        # exactly our bytes, that conflict is with ourselves.
        if self.sends[p] - self.refusals[p] > 1:
            found = self.session.read_node(path)
            if found is not None and found[0] == self.payloads[p]:
                return found[1]
        if write.version is None:
            return OffsetRecordExists(path)
        return OffsetConflict(path, write.version)

    def _send(self, zk: KazooClient, bundle: Bundle) -> Any:
        """Send the bundle without awaiting its answer (kazoo's async result); one write without
        a fence goes alone, any other in a transaction (with the check of its claim)."""
        self.sends.update(w.partition for w in bundle)
        first = bundle[0]
        if len(bundle) == 1 and first.fence is None:
            path = self.paths[first.partition]
            return send_write(zk, path, self.payloads[first.partition], first.version)
        if len(bundle) > 1 and any(w.version is None for w in bundle):
            # a create in a transaction: no makepath
            self.session.ensure_parent(zk, self.paths[first.partition])
        return send_transaction(
            zk, [(self.paths[w.partition], w, self.payloads[w.partition]) for w in bundle]
        )

    def _await_answer(self, bundle: Bundle, request: Any) -> bool:
        """Await a sent bundle's answer and record it; True when a bundle of several was refused
        (its writes then need an answer each). Raises a transient error (no answer)."""
        if len(bundle) == 1:
            write = bundle[0]
            path = self.paths[write.partition]
            try:
                self.answers[write.partition] = written(
                    self.session.wait(request), path, write.version, write.fence
                )
            except (*FENCING_ERRORS, OwnershipLost) as exc:
                self.answers[write.partition] = exc
            return False
        answer = self.session.wait(request)
        if any(isinstance(result, Exception) for result in answer):
            log.debug("%s; sending its writes one per transaction", _refusal(bundle, answer))
            return True
        results = iter(answer)
        for write in bundle:
            if write.fence is not None:
                next(results)  # the claim check's answer
            stat = next(results)
            self.answers[write.partition] = 0 if write.version is None else int(stat.version)
        return False

    def _split(self, bundle: Bundle) -> list[Bundle]:
        """Replace a refused bundle by one bundle per write; none of its writes was applied."""
        alone: list[Bundle] = [(write,) for write in bundle]
        at = self.bundles.index(bundle)
        self.bundles[at : at + 1] = alone
        self.refusals.update(w.partition for w in bundle)
        return alone


def _refusal(bundle: Bundle, results: Sequence[Any]) -> str:
    """Which operation refused a bundle's transaction: ZooKeeper answers the failed one with
    its error, those before it with RolledBackError and those after with RuntimeInconsistency."""
    partitions = [w.partition for w in bundle for _ in range(1 if w.fence is None else 2)]
    for partition, result in zip(partitions, results, strict=True):
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            return (
                f"a commit of {count(len(bundle), 'partition')} refused at partition {partition} "
                f"({type(result).__name__})"
            )
    return f"a commit of {count(len(bundle), 'partition')} refused"

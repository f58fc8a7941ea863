"""This instance's part in sharing a spout's partitions with the other live instances.

The driver calls `poll()` every loop turn; it reads the ownership nodes (`tree.py`) only when
a watch fired or `POLL_EVERY` passed, so a quiet loop costs nothing. The leader, the live
instance whose id sorts first, balances the assignment (`assignment.balance`) when the live
set or the topic's partitions changed, and writes it with compare-and-set; every instance then
claims the partitions assigned to it (once their last owner released them) and releases those
assigned away (after its final commit). The leader checks the topic for added partitions every
`partition_refresh` seconds.

A session that expired (a process stopped past `zk_session_timeout`, a long network cut) loses
every claim at once: `take_lost()` tells the driver, which drops the partitions; its fenced
commits would be refused anyway (`kspout.zk.claims`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from kspout.errors import KafkaUnavailable
from kspout.ownership.assignment import Assignment, balance
from kspout.ownership.tree import (
    Pause,
    SpoutTree,
    decode,
    encode,
    partitions_named,
    write_assignment,
)
from kspout.wording import count
from kspout.zk.claims import claim_partition
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.record import StoredOffset, now_ms
from kspout.zk.registry import InstanceRegistry
from kspout.zk.session import ZkSession

log = logging.getLogger(__name__)

POLL_EVERY = 1.0  # seconds between reads of the ownership nodes when no watch fired


class Membership:
    """Registration, the leader's assignment, claims and releases of one driver."""

    def __init__(
        self,
        session: ZkSession,
        store: ZkOffsetStore,
        registry: InstanceRegistry,
        topic_partitions: Callable[[], list[int]],
        clock: Callable[[], float],
        partition_refresh: float,
    ) -> None:
        self._session = session
        self._store = store
        self._registry = registry
        self._tree = SpoutTree(session.path)
        self.instance_id = registry.instance_id
        self._topic_partitions = topic_partitions
        self._clock = clock
        self._refresh = partition_refresh
        self._changed = threading.Event()
        self._lost = threading.Event()
        self.suspended = False  # connection to ZooKeeper lost; the session may still live
        self._polled_at = float("-inf")
        self._partitions: list[int] = []
        self._partitions_at = float("-inf")
        self.live: list[str] = []
        self.assignment = Assignment()
        self.paused: dict[int, Pause] = {}

    def start(self) -> None:
        """Register this instance and watch the nodes that move partitions."""
        self._registry.register()
        client = self._session.client
        for path in (self._tree.owners, self._tree.paused):
            self._session.call(f"create {path}", path, functools.partial(_ensure, path=path))
        client.add_listener(self._on_state)
        ChildrenWatch(client, self._tree.instances, self._children_changed)
        ChildrenWatch(client, self._tree.owners, self._children_changed)
        ChildrenWatch(client, self._tree.paused, self._children_changed)
        DataWatch(client, self._tree.assignment, self._data_changed)

    @property
    def is_leader(self) -> bool:
        return bool(self.live) and self.live[0] == self.instance_id

    def mine(self) -> set[int]:
        """The partitions the current assignment gives this instance."""
        return self.assignment.of(self.instance_id)

    # -- reading the tree --------------------------------------------------------------------

    def poll(self, *, now: float | None = None) -> bool:
        """Read the ownership nodes if a watch fired or `POLL_EVERY` passed (the leader also
        balances); True when it read them."""
        now = self._clock() if now is None else now
        if self.suspended:
            return False  # reads would wait for the connection; it sets `_changed` when back
        if not self._changed.is_set() and now - self._polled_at < POLL_EVERY:
            return False
        self._changed.clear()
        self._polled_at = now
        session, tree = self._session, self._tree
        self.live = session.children_of(tree.instances)
        found = session.read_node(tree.assignment)
        self.assignment = Assignment.decode(found[0]) if found is not None else Assignment()
        self.paused = {}
        for p in partitions_named(session.children_of(tree.paused)):
            node = session.read_node(tree.pause(p))
            if node is not None:
                self.paused[p] = Pause.of(decode(node[0]))
        if self.is_leader:
            self._lead(now, None if found is None else found[1])
        return True

    def _lead(self, now: float, version: int | None) -> None:
        """Balance again when the live set or the topic's partitions changed."""
        if not self._partitions or now - self._partitions_at >= self._refresh:
            try:
                self._partitions = self._topic_partitions()
            except KafkaUnavailable as exc:  # keep what is known; ask again next time
                log.warning("could not list the topic's partitions: %s", exc)
            self._partitions_at = now
        if not self._partitions:
            return
        if not self.assignment.stale(self.live, self._partitions):
            return
        new = Assignment(
            balance(self._partitions, self.live, self.assignment.owners),
            tuple(self.live),
            tuple(self._partitions),
            self.instance_id,
            now_ms(),
        )
        try:
            write_assignment(self._session, new, version)
        except (BadVersionError, NodeExistsError):
            self._changed.set()  # another writer won: read it and decide again
            return
        moved = sum(
            1 for p in self.assignment.owners if self.assignment.owners[p] != new.owners.get(p)
        )
        # Info, not a warning: a balance follows every start, join and departure, and a lone
        # instance restarting takes its partitions over from its own earlier, stopped self.
        log.info(
            "balanced %s over %s (%s)",
            count(len(new.owners), "partition"),
            count(len(self.live), "instance"),
            f"{count(moved, 'partition')} moved" if moved else "none moved",
        )
        self.assignment = new

    # -- claims ------------------------------------------------------------------------------

    def claim(self, partition: int, initial: Callable[[], int]) -> StoredOffset | None:
        """Claim `partition` (see `kspout.zk.claims`); None while another instance holds it."""
        payload = encode({"instance": self.instance_id, "since": now_ms()})
        fence = self._tree.claim(partition)
        return claim_partition(self._store, partition, fence, payload, initial)

    def fence(self, partition: int) -> str:
        """The claim node a commit of `partition` must find in place."""
        return self._tree.claim(partition)

    def release(self, partition: int) -> None:
        """Give the claim up (after the final commit): the next owner may take it."""
        path = self._tree.claim(partition)

        def delete(zk: KazooClient) -> None:
            stat = zk.exists(path)
            if stat is not None and stat.ephemeralOwner == zk.client_id[0]:
                zk.delete(path, version=stat.version)

        with contextlib.suppress(NoNodeError):
            self._session.call(f"release {path}", path, delete)

    def ack_pause(self, partition: int, offset: int) -> None:
        """Tell the operator who paused `partition` that nothing runs there any more."""
        path = self._tree.pause(partition)
        found = self._session.read_node(path)
        if found is None:
            return
        data = decode(found[0])
        data["ack"] = {"instance": self.instance_id, "offset": offset, "at": now_ms()}

        def write(zk: KazooClient) -> None:
            zk.set(path, encode(data), version=found[1])

        try:
            self._session.call(f"ack {path}", path, write)
        except (BadVersionError, NoNodeError):
            self._changed.set()  # resumed or re-paused meanwhile: look again

    @property
    def expired(self) -> bool:
        """The session expired and `take_lost()` has not told the driver yet."""
        return self._lost.is_set()

    def take_lost(self) -> bool:
        """True once after the session expired (every claim is gone)."""
        if not self._lost.is_set():
            return False
        self._lost.clear()
        return True

    # -- kazoo callbacks (its event thread: never block) -------------------------------------

    def _children_changed(self, _children: list[str]) -> None:
        self._changed.set()

    def _data_changed(self, _data: bytes | None, _stat: object) -> None:
        self._changed.set()

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._lost.set()
        self.suspended = state != KazooState.CONNECTED
        self._changed.set()


def _ensure(zk: KazooClient, *, path: str) -> None:
    zk.ensure_path(path)

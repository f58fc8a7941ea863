"""One ZooKeeper session: the kazoo client, its one retry idiom, and its state listener.

The recipes (`offsets`, `claims`, `registry`, and `kspout.ownership`) take a `ZkSession` and
send their requests through `call`, which retries transient errors (bounded, exponential
backoff, tenacity) and never retries fencing errors. A read-modify-compare-and-set that loses
the race to another writer is a different matter: `until_won` runs its round again, reading
the node anew. Nodes live under the topic file's spout path, `<zk_root>/<spout_id>`.

The session's states, as kazoo reports them to `_on_state` (on kazoo's connection thread)::

    CONNECTED --connection lost--> SUSPENDED --reconnected--> CONNECTED   (same session)
    SUSPENDED --expired--> LOST --reconnected--> CONNECTED (new session: `on_renewed` runs)

After LOST, every ephemeral node of the old session is gone; the callbacks given to
`on_renewed` (re-registration) run on a kazoo worker once the new session is connected.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
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
from kspout.errors import OffsetConflict, ZooKeeperAccessDenied, ZooKeeperUnavailable
from kspout.lifecycle import Lifecycle

log = logging.getLogger(__name__)

T = TypeVar("T")

# Worth retrying: the request may not have reached ZooKeeper, or the session is being rebuilt.
# ConnectionClosedError (a SessionExpiredError) means we closed the client ourselves: not retried.
TRANSIENT_ERRORS = (ConnectionLoss, OperationTimeoutError, SessionExpiredError, KazooTimeoutError)
# Someone else wrote first: we lost ownership, retrying would overwrite their write.
FENCING_ERRORS = (BadVersionError, NodeExistsError)

Node = tuple[bytes, int]  # a node's bytes and znode version

RACE_ATTEMPTS = 50  # a read-modify-compare-and-set that loses this many races in a row gives up


class Race(enum.Enum):
    LOST = "lost"  # another writer changed the node between our read and our compare-and-set


def is_transient(exc: BaseException) -> bool:
    """Whether `call` sends the request again after `exc`."""
    return isinstance(exc, TRANSIENT_ERRORS) and not isinstance(exc, ConnectionClosedError)


def until_won(path: str, doing: str, round_: Callable[[], T | Literal[Race.LOST]]) -> T:
    """`round_()` (read `path`, modify, compare-and-set) again while another writer wins the
    race, at most `RACE_ATTEMPTS` times; then `OffsetConflict`."""
    for _ in range(RACE_ATTEMPTS):
        outcome = round_()
        if outcome is not Race.LOST:
            return outcome
        log.info("%s changed while %s; reading it again", path, doing)
    raise OffsetConflict(path, -1)


class ZkSession(Lifecycle):
    """The kazoo client of one spout's ZooKeeper tree; the recipes send through `call`.

    Constructing does no I/O; `start()` connects (or raises `ZooKeeperUnavailable`) and
    `close()` disconnects, which drops every ephemeral node of the session.

    Timeouts, in seconds: `request_timeout` bounds one ZooKeeper request; `retry_timeout`
    bounds all retries of one call before it gives up; `session_timeout` (default: the topic
    file's `zk_session_timeout`) is the ZooKeeper session: how long ZooKeeper may not hear
    from this client before its ephemeral nodes (the registration, the claims) are gone;
    `connect_timeout` (default: the session timeout) bounds `start()`.
    """

    def __init__(
        self,
        config: TopicConfig,
        *,
        connect_timeout: float | None = None,
        request_timeout: float = 10.0,
        retry_timeout: float = 30.0,
        session_timeout: float | None = None,
    ) -> None:
        self.config = config
        self.path = config.zk_spout_path
        self.hosts = config.zookeeper
        self._request_timeout = request_timeout
        self._retry_timeout = retry_timeout
        self._session_timeout = (
            config.zk_session_timeout if session_timeout is None else session_timeout
        )
        self._connect_timeout = (
            self._session_timeout if connect_timeout is None else connect_timeout
        )
        self._client: KazooClient | None = None
        self._session_lost = False
        self._renewed: list[Callable[[], None]] = []
        self._parents: set[str] = set()  # parent paths known to exist

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
                f"could not connect to ZooKeeper at {self.hosts} within "
                f"{self._connect_timeout:g}s; check that the ensemble is running and reachable "
                f"from this host; the address is {self.config.origin('zookeeper')}"
            ) from None
        client.add_listener(self._on_state)
        self._client = client

    def close(self) -> None:
        """Disconnect; ZooKeeper drops the session's ephemeral nodes with it."""
        client, self._client = self._client, None
        if client is not None:
            client.stop()
            client.close()

    @property
    def client(self) -> KazooClient:
        """The kazoo client (for watches and listeners); needs `start()`."""
        if self._client is None:
            raise RuntimeError("ZkSession is not started: call start() or use `with`")
        return self._client

    def on_renewed(self, callback: Callable[[], None]) -> None:
        """Run `callback` (on a kazoo worker) each time a new session replaces an expired one."""
        self._renewed.append(callback)

    # -- requests ----------------------------------------------------------------------------

    def call(self, action: str, path: str, op: Callable[[KazooClient], T]) -> T:
        """Run `op(client)`, retrying transient ZooKeeper errors within `retry_timeout`; a
        NoAuth answer becomes `ZooKeeperAccessDenied` naming `path`."""
        client = self.client

        def attempt() -> T:
            if not client.connected:  # fail fast rather than queue a request until reconnect
                raise ConnectionLoss("not connected to ZooKeeper")
            return op(client)

        retrying = Retrying(
            stop=stop_after_delay(self._retry_timeout),
            wait=wait_exponential(multiplier=0.1, min=0.1, max=2.0),
            retry=retry_if_exception(is_transient),
            before_sleep=before_sleep_log(log, logging.WARNING),
        )
        try:
            return retrying(attempt)
        except RetryError as exc:
            last = exc.last_attempt.exception()
            raise ZooKeeperUnavailable(
                f"ZooKeeper at {self.hosts} did not answer ({action}) for "
                f"{self._retry_timeout:g}s (last error: {type(last).__name__}); check that the "
                "ensemble is running and reachable from this host"
            ) from last
        except NoAuthError:
            raise ZooKeeperAccessDenied(path, self.hosts) from None

    def wait(self, result: Any) -> Any:
        """A kazoo async result, waited for at most `request_timeout` (KazooTimeoutError)."""
        return result.get(timeout=self._request_timeout)

    def read_node(self, path: str) -> Node | None:
        """A node's bytes and version; None when it does not exist."""
        return self.call(f"read {path}", path, lambda zk: self.get(zk, path))

    def children_of(self, path: str) -> list[str]:
        """A node's children, sorted; [] when it does not exist."""
        return sorted(self.call(f"list {path}", path, lambda zk: self.children(zk, path)))

    # -- inside `call` -----------------------------------------------------------------------

    def get(self, zk: KazooClient, path: str) -> Node | None:
        """A node's bytes and version; None when it does not exist."""
        return self.got(zk.get_async(path))

    def get_all(self, zk: KazooClient, paths: Sequence[str]) -> list[Node | None]:
        """`get` of every path, all sent before the first answer is awaited."""
        requests = [zk.get_async(path) for path in paths]
        return [self.got(request) for request in requests]

    def got(self, request: Any) -> Node | None:
        """The answer to a `get_async`: the node's bytes and version, or None (no node)."""
        try:
            raw, stat = self.wait(request)
        except NoNodeError:
            return None
        return raw, int(stat.version)

    def children(self, zk: KazooClient, path: str) -> list[str]:
        """A node's children as listed; [] when it does not exist."""
        try:
            return list(self.wait(zk.get_children_async(path)))
        except NoNodeError:
            return []

    def ensure_parent(self, zk: KazooClient, path: str) -> None:
        """Create the parents of `path` (with the client's default ACL) if missing."""
        parent = path.rsplit("/", 1)[0]
        if parent and parent not in self._parents:
            self.wait(zk.ensure_path_async(parent))
            self._parents.add(parent)

    # -- state -------------------------------------------------------------------------------

    def _on_state(self, state: str) -> None:
        """kazoo listener (connection thread: must not block): after an expiry, run the
        `on_renewed` callbacks once connected again."""
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            self._session_lost = False
            if self._client is not None:
                for callback in self._renewed:
                    self._client.handler.spawn(callback)

"""Fencing epochs kept in ZooKeeper, so tokens never repeat even if Redis loses all its data.

The epoch is a decimal integer in one znode. `bump` is an optimistic compare-and-set on the
znode's version (retried on `BadVersionError`), so concurrent bumps each get a distinct epoch and
no epoch is ever handed out twice: a store that finds Redis's fence missing always installs an
epoch nobody has used, even if another store detected the same loss a moment earlier.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from dedup.errors import EpochCorrupt


class ZkEpoch:
    """The epoch source of `IdempotencyStore`, in the znode `path` (created on the first bump).

    Uses an already started kazoo client and its command retry policy (connection losses are
    retried; what remains after that propagates as kazoo raised it).
    """

    def __init__(self, client: KazooClient, path: str) -> None:
        if not path.startswith("/") or path.endswith("/"):
            raise ValueError(f"epoch path {path!r} must be absolute, without a trailing slash")
        self._client = client
        self.path = path

    def current(self) -> int:
        """The latest epoch handed out; 0 if none was (the znode does not exist)."""
        try:
            data, _ = self._client.retry(self._client.get, self.path)
        except NoNodeError:
            return 0
        return self._parse(data)

    def bump(self, seen: int) -> int:
        """A fresh epoch: one more than the larger of `seen` and the stored epoch, stored with a
        compare-and-set so no two callers ever get the same one."""
        result: int = self._client.retry(self._bump, seen)
        return result

    def _bump(self, seen: int) -> int:
        while True:
            try:
                data, stat = self._client.get(self.path)
            except NoNodeError:
                fresh = max(seen, 0) + 1
                try:
                    self._client.create(self.path, str(fresh).encode(), makepath=True)
                except NodeExistsError:
                    continue  # another client created it first: bump what it stored
                return fresh
            fresh = max(seen, self._parse(data)) + 1
            try:
                self._client.set(self.path, str(fresh).encode(), version=stat.version)
            except BadVersionError:
                continue  # another client bumped in between: bump again from its value
            return fresh

    def _parse(self, data: bytes) -> int:
        text = data.decode("ascii", "replace").strip()
        if not text.isdigit():
            raise EpochCorrupt(self.path, data)
        return int(text)

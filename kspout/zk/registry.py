"""The instance registry: which spout instances are running now.

ZooKeeper layout: one ephemeral node per live instance, holding JSON (host, pid, topology,
start time, and what the instance last reported: metrics address, progress)::

    <zk_root>/<spout_id>/instances/<instance id>

An instance's node lives as long as its session::

    UNREGISTERED --register()--> REGISTERED --session expired--> GONE
    GONE --new session connected, or the next report()--> REGISTERED (created again, with
                                                         the last report)

Operators (`kspout status`, and `kspout offsets set`, which refuses to move a running spout)
read the registry; `kspout.ownership` balances partitions over it.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from kspout.errors import InstanceIdInUse
from kspout.zk.record import encode, now_ms
from kspout.zk.session import ZkSession

log = logging.getLogger(__name__)

INSTANCES_NODE = "instances"


def instances_path(spout_path: str) -> str:
    """The registry's parent node."""
    return f"{spout_path}/{INSTANCES_NODE}"


class InstanceRegistry:
    """This instance's ephemeral node in the registry, and the list of live instances."""

    def __init__(self, session: ZkSession, instance_id: str) -> None:
        self._session = session
        self.instance_id = instance_id
        self.path = f"{instances_path(session.path)}/{instance_id}"
        self._registered = False
        # Who this instance is (`register`) and its last report (`report`).
        self._info: dict[str, Any] = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "topology": session.config.topology_name,
        }
        session.on_renewed(self._register_again)

    def register(self) -> str:
        """Create this instance's ephemeral node (host, pid, start time) and return its path.

        It disappears when the session closes or expires; after an expiry it is created again
        as soon as the session is renewed (or, if that fails, at the next `report`).
        """
        self._info.setdefault("started_at", now_ms())
        payload = encode(self._info)
        self._session.call(f"register {self.path}", self.path, lambda zk: self._create(zk, payload))
        self._registered = True
        return self.path

    def report(self, fields: Mapping[str, Any]) -> None:
        """Add `fields` to this instance's node (what `kspout status` shows of it); kept for
        the node's re-creation after a session expiry. Needs `register` first."""
        self._info.update(fields)
        if not self._registered:
            raise RuntimeError("report() before register()")
        session, path = self._session, self.path
        payload = encode(self._info)

        def write(zk: KazooClient) -> None:
            try:
                session.wait(zk.set_async(path, payload))
            except NoNodeError:
                # The session expired and registering again after it failed (or has not run
                # yet): without its node this instance would get no partitions.
                self._create(zk, payload)

        session.call(f"report {path}", path, write)

    def _create(self, zk: KazooClient, payload: bytes) -> None:
        session, path = self._session, self.path
        try:
            session.wait(zk.create_async(path, payload, ephemeral=True, makepath=True))
        except NodeExistsError:
            stat = session.wait(zk.exists_async(path))
            # Ours when an earlier attempt went through before a lost reply, or when renewal
            # and a report raced to create it.
            if stat is None or stat.ephemeralOwner != zk.client_id[0]:
                raise InstanceIdInUse(path) from None

    def _register_again(self) -> None:
        """After a session expiry (a kazoo worker: log, never raise into kazoo)."""
        if not self._registered:
            return
        try:
            self.register()
            log.warning("ZooKeeper session expired; registered instance %s again", self.path)
        except Exception:
            log.exception(
                "could not register instance %s again; the next report will try",
                self.instance_id,
            )


def live_instances(session: ZkSession) -> list[str]:
    """Instance ids of the spout instances registered right now, sorted."""
    return session.children_of(instances_path(session.path))

"""The driver's ZooKeeper work during an outage: it holds off, never ends the run.

The driver's claims, commits and reports go through `ZooKeeperOutage.guard`. While the session
is suspended (the connection lost; `Membership.suspended`), the work is not tried at all: a
request would wait for the connection. When a request gives up (`ZooKeeperUnavailable`: the
session's retries ran out, after `PATIENCE`), the work is skipped and tried again at the next
turn. Either way nothing runs that a commit could not follow (the planner asks `away`), and
nothing is lost: what finished is committed once ZooKeeper answers, with the claim checked in
the same transaction, so a session that expired meanwhile has its commits refused and its
partitions dropped and claimed afresh (`Ownership`).

States::

    ANSWERING --suspended, or a request gave up--> AWAY(since)    logged once
    AWAY --connected, and the work went through--> ANSWERING      logged with how long it lasted
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, TypeVar

from kspout.errors import ZooKeeperUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds one ZooKeeper call of the driver retries before it gives up (`ZkSession`'s
# `retry_timeout`, 30 s by default): long enough for a dropped connection to come back, short
# enough that the loop does not stall in an outage (batches end, progress says why it waits).
PATIENCE = 5.0


class Session(Protocol):
    """What the outage reads of the session (`Membership`)."""

    @property
    def suspended(self) -> bool:
        """The connection is lost; the session may still live on the server."""

    @property
    def expired(self) -> bool:
        """The session expired; the driver has not dropped its partitions yet."""


class ZooKeeperOutage:
    """Whether ZooKeeper is away for this driver, and since when (`clock` time).

    `session` says whether the connection is lost and whether the session expired.
    """

    def __init__(self, hosts: str, session: Session, clock: Callable[[], float]) -> None:
        self._hosts = hosts
        self._session = session
        self._clock = clock
        self._since: float | None = None
        self.outages = 0  # outages seen since start

    @property
    def away(self) -> bool:
        """ZooKeeper is away, or the session expired and its partitions are not dropped yet:
        claims are unsure, nothing new may run."""
        session = self._session
        return self._since is not None or session.suspended or session.expired

    def away_for(self) -> float | None:
        """Seconds since ZooKeeper went away; None while it answers."""
        if self._since is None:
            return 0.0 if self._session.suspended else None
        return self._clock() - self._since

    def guard(self, what: str, work: Callable[[], T]) -> T | None:
        """`work()`, or None when ZooKeeper is away (not tried while suspended; a request
        that gave up is tried again at the next call)."""
        if self._session.suspended:
            self._went_away("the connection is lost")
            return None
        try:
            result = work()
        except ZooKeeperUnavailable as exc:
            self._went_away(str(exc))
            return None
        if self._since is not None:
            log.warning(
                "ZooKeeper answers again after %.1fs away: %s goes on", self.away_for(), what
            )
            self._since = None
        return result

    def warn_unwritten(self) -> None:
        """After the last commit (`Driver.drain`): say so if ZooKeeper did not take it."""
        if self.away:
            log.error(
                "ZooKeeper is away: the last commit points are not written; what finished "
                "since the commit before runs again on the partitions' next start or owner"
            )

    def _went_away(self, why: str) -> None:
        if self._since is not None:
            return
        self._since = self._clock()
        self.outages += 1
        log.warning(
            "ZooKeeper at %s is away (%s): commits and claims wait for it and no new batch "
            "starts; finished work is committed once it answers",
            self._hosts,
            why,
        )

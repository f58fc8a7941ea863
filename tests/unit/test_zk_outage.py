"""`ZooKeeperOutage`: the driver's ZooKeeper work is held off during an outage, never fatal.

Pure logic: the session's suspended flag and the clock are plain values the test sets; the
real outage (ZooKeeper frozen past the session timeout) is in
tests/integration/test_zookeeper_outage.py.
"""

from __future__ import annotations

import logging

import pytest

from kspout.driver.zk_outage import ZooKeeperOutage
from kspout.errors import ZooKeeperAccessDenied, ZooKeeperUnavailable


class Session:
    """The flags and the clock the outage reads."""

    def __init__(self) -> None:
        self.suspended = False
        self.expired = False
        self.now = 100.0


@pytest.fixture
def session() -> Session:
    return Session()


@pytest.fixture
def outage(session: Session) -> ZooKeeperOutage:
    return ZooKeeperOutage("127.0.0.1:2181", session, lambda: session.now)


def test_work_runs_while_zookeeper_answers(outage: ZooKeeperOutage) -> None:
    assert outage.guard("committing", lambda: 7) == 7
    assert not outage.away
    assert outage.away_for() is None
    assert outage.outages == 0


def test_nothing_is_tried_while_the_session_is_suspended(
    outage: ZooKeeperOutage, session: Session
) -> None:
    tried: list[str] = []
    session.suspended = True
    assert outage.away  # the planner asks this before any work was tried
    assert outage.away_for() == 0.0
    assert outage.guard("committing", lambda: tried.append("commit")) is None
    session.now += 12.0
    assert tried == []
    assert outage.away_for() == 12.0
    session.suspended = False
    assert outage.away  # until some work went through
    assert outage.guard("committing", lambda: tried.append("commit")) is None  # append's None
    assert tried == ["commit"]
    assert not outage.away
    assert outage.outages == 1


def test_a_request_that_gave_up_is_held_off_and_tried_again(
    outage: ZooKeeperOutage, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    answers = iter([ZooKeeperUnavailable("did not answer for 30s"), None, None])

    def commit() -> str:
        answer = next(answers)
        if answer is not None:
            raise answer
        return "written"

    with caplog.at_level(logging.WARNING, logger="kspout.driver.zk_outage"):
        assert outage.guard("committing", commit) is None
        assert outage.away
        session.now += 5.0
        assert outage.guard("committing", commit) == "written"
        assert outage.guard("committing", commit) == "written"
    assert not outage.away
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # one when it went away, one when it came back
    assert "did not answer for 30s" in said[0] and "commits and claims wait" in said[0]
    assert "after 5.0s away" in said[1]


def test_an_access_refusal_is_not_an_outage(outage: ZooKeeperOutage) -> None:
    def refused() -> None:
        raise ZooKeeperAccessDenied("/kspout/s", "127.0.0.1:2181")

    with pytest.raises(ZooKeeperAccessDenied):
        outage.guard("committing", refused)
    assert not outage.away


def test_a_last_commit_not_written_is_said(
    outage: ZooKeeperOutage, session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    outage.warn_unwritten()
    assert not caplog.records
    session.suspended = True
    outage.warn_unwritten()
    assert "last commit points are not written" in caplog.records[-1].getMessage()


def test_nothing_new_runs_on_an_expired_session_until_its_partitions_are_dropped(
    outage: ZooKeeperOutage, session: Session
) -> None:
    session.expired = True  # connected again, on a new session: the old claims are gone
    assert outage.away
    assert outage.guard("following the ownership nodes", lambda: "dropped") == "dropped"
    session.expired = False  # the driver took the news
    assert not outage.away

"""ZkOffsetStore against the session's real ZooKeeper server (the dev stack's).

The retry tests break it through `stack.zookeeper` (SIGKILL, then a restart on the same port and
data directory); the `zookeeper` fixture makes sure it runs again after them, pass or fail.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoAuthError

from kspout.config import TopicConfig, parse_config
from kspout.devstack import DevStack, ZooKeeperServer
from kspout.devstack.ports import free_port
from kspout.errors import (
    OffsetConflict,
    OffsetRecordExists,
    OffsetRecordInvalid,
    OwnershipLost,
    TopicMismatch,
    ZooKeeperAccessDenied,
    ZooKeeperUnavailable,
)
from kspout.zk import offsets
from kspout.zk.claims import claim_partition
from kspout.zk.offsets import OffsetWrite
from kspout.zk.registry import InstanceRegistry, live_instances
from kspout.zk.session import ZkSession
from tests.integration.helpers import open_store, register


@pytest.fixture
def zookeeper(stack: DevStack) -> Iterator[ZooKeeperServer]:
    """The stack's ZooKeeper, for tests that kill it: running again afterwards, pass or fail."""
    yield stack.zookeeper
    stack.zookeeper.start()  # a no-op when it runs


@pytest.fixture
def make_config(stack: DevStack) -> Callable[..., TopicConfig]:
    """Factory: a config with its own spout id (so tests never share records)."""
    spout_id = f"spout-{uuid.uuid4().hex[:8]}"

    def make(**overrides: Any) -> TopicConfig:
        data: dict[str, Any] = {
            "topic": "events",
            "spout_id": spout_id,
            "zookeeper": stack.info.zookeeper,
            "zk_root": "/kspout-test",
            "topology_name": "orders",
        }
        data.update(overrides)
        return parse_config(data)

    return make


def test_round_trip(make_config: Callable[..., TopicConfig]) -> None:
    with open_store(make_config(), instance_id="run-1") as store:
        assert store.read(0) is None
        assert store.read_all() == {}
        version = store.commit(0, 100, version=None, broker=("kafka1", 9092))
        stored = store.read(0)
        assert stored is not None
        assert (stored.offset, stored.version, stored.topic) == (100, version, "events")
        assert stored.data["topology"] == {"id": "run-1", "name": "orders"}
        assert stored.data["broker"] == {"host": "kafka1", "port": 9092}
        assert stored.data["partition"] == 0
        assert stored.data["kspout"]["version"] == 1
        new_version = store.commit(0, 250, version=version, extra={"finished_above": [[260, 270]]})
        assert new_version == version + 1
        store.commit(3, 7, version=None)
        every = store.read_all()
        assert sorted(every) == [0, 3]
        assert every[0].offset == 250 and every[3].offset == 7
        assert every[0].data["kspout"]["finished_above"] == [[260, 270]]


def test_reads_storm_kafka_record(make_config: Callable[..., TopicConfig], zk: KazooClient) -> None:
    config = make_config()
    storm = {
        "topology": {"id": "wordcount-1-1700000000", "name": "wordcount"},
        "offset": 4242,
        "partition": 3,
        "broker": {"host": "kafka1.example.com", "port": 9092},
        "topic": "events",
    }
    zk.create(f"{config.zk_spout_path}/partition_3", json.dumps(storm).encode(), makepath=True)
    with open_store(config) as store:
        stored = store.read(3)
        assert stored is not None
        assert stored.offset == 4242  # resumes where Storm stopped
        assert (stored.writer_name, stored.writer_id) == ("wordcount", "wordcount-1-1700000000")
        assert stored.stopped is None
        store.commit(3, 5000, version=stored.version, broker=("kafka1.example.com", 9092))
    written = json.loads(zk.get(f"{config.zk_spout_path}/partition_3")[0])
    assert set(written) == set(storm) | {"kspout"}  # storm-kafka's fields, plus ours
    assert (written["offset"], written["partition"], written["topic"]) == (5000, 3, "events")
    assert written["broker"] == storm["broker"]


def test_accepts_record_without_topic(
    make_config: Callable[..., TopicConfig],
    zk: KazooClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = make_config()
    oldest = {"topology": {"id": "t-1", "name": "t"}, "offset": 9, "partition": 0, "broker": {}}
    zk.create(f"{config.zk_spout_path}/partition_0", json.dumps(oldest).encode(), makepath=True)
    with caplog.at_level(logging.WARNING, "kspout.zk.record"), open_store(config) as store:
        stored = store.read(0)
    assert stored is not None and stored.offset == 9 and stored.topic is None
    assert "no topic" in caplog.text


def test_record_for_another_topic_is_refused(
    make_config: Callable[..., TopicConfig], zk: KazooClient
) -> None:
    config = make_config(topic="payments")
    record = {"topology": {"id": "x", "name": "y"}, "offset": 1, "partition": 0, "topic": "clicks"}
    zk.create(f"{config.zk_spout_path}/partition_0", json.dumps(record).encode(), makepath=True)
    with open_store(config) as store:
        with pytest.raises(TopicMismatch) as caught:
            store.read(0)
        with pytest.raises(TopicMismatch):
            store.read_all()
        with pytest.raises(TopicMismatch):
            store.move(0, 5)
    assert "'clicks'" in str(caught.value) and "'payments'" in str(caught.value)


def test_compare_and_set_fences_the_second_writer(make_config: Callable[..., TopicConfig]) -> None:
    config = make_config()
    with open_store(config) as first, open_store(config) as second:
        version = first.commit(1, 10, version=None)
        assert second.commit(1, 20, version=version) == version + 1
        with pytest.raises(OffsetConflict) as caught:
            first.commit(1, 15, version=version)
        assert caught.value.expected_version == version
        stored = first.read(1)
        assert stored is not None and stored.offset == 20


def test_a_commit_is_refused_once_the_claim_is_gone_or_taken(
    make_config: Callable[..., TopicConfig], zk: KazooClient
) -> None:
    """The two halves of the fence (kspout.ownership): a commit checks its claim in the same
    transaction, and a claim rewrites the record, so the former owner's version is stale even
    before the new owner's first commit."""
    config = make_config()
    fence = f"{config.zk_spout_path}/owners/partition_0"
    with open_store(config, instance_id="a") as a, open_store(config, instance_id="b") as b:
        claimed = claim_partition(a, 0, fence, b'{"instance": "a"}', lambda: 5)
        assert claimed is not None and claimed.offset == 5
        version = a.commit(0, 7, version=claimed.version, fence=fence)
        assert claim_partition(b, 0, fence, b'{"instance": "b"}', lambda: 0) is None  # a holds it

        zk.delete(fence)  # a's session expired: ZooKeeper removed its claim
        with pytest.raises(OwnershipLost):
            a.commit(0, 8, version=version, fence=fence)
        taken = claim_partition(b, 0, fence, b'{"instance": "b"}', lambda: 0)
        assert taken is not None and taken.offset == 7  # b resumes from a's last commit
        with pytest.raises(OffsetConflict):  # the claim node exists again, but not for a
            a.commit(0, 8, version=version, fence=fence)
        assert b.commit(0, 9, version=taken.version, fence=fence) == taken.version + 1
        assert a.read(0) is not None and a.read(0).offset == 9  # type: ignore[union-attr]


def test_create_when_record_exists_conflicts(make_config: Callable[..., TopicConfig]) -> None:
    config = make_config()
    with open_store(config) as first, open_store(config) as second:
        first.commit(2, 10, version=None)
        with pytest.raises(OffsetRecordExists):
            second.commit(2, 99, version=None)
        stored = second.read(2)
        assert stored is not None and stored.offset == 10


@pytest.mark.parametrize("create", [False, True], ids=["update", "create"])
def test_commit_whose_reply_was_lost_recognises_its_own_write(
    make_config: Callable[..., TopicConfig], monkeypatch: pytest.MonkeyPatch, create: bool
) -> None:
    """ZooKeeper applied the first attempt but the connection dropped before the reply: the
    retry's compare-and-set then fails against our own write, which is not a conflict."""
    with open_store(make_config()) as store:
        version = None if create else store.commit(0, 10, version=None)
        real_write = offsets.send_write
        calls = 0

        def write_then_lose_the_reply(zk: Any, path: str, payload: bytes, expected: Any) -> int:
            nonlocal calls
            calls += 1
            written = real_write(zk, path, payload, expected)
            if calls == 1:
                raise ConnectionLoss("connection lost before the reply")
            return written

        monkeypatch.setattr(offsets, "send_write", write_then_lose_the_reply)
        new_version = store.commit(0, 20, version=version)
        assert calls == 2  # retried; the retry found the record already written
        assert new_version == (0 if version is None else version + 1)
        stored = store.read(0)
        assert stored is not None and (stored.offset, stored.version) == (20, new_version)


def test_a_bundled_commit_whose_reply_was_lost_recognises_its_own_writes(
    make_config: Callable[..., TopicConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper applied a bundle's transaction but the reply was lost: sent again, the bundle
    is refused whole (its versions are stale), then each write alone; every one of them finds
    its own bytes, so none is a conflict (an instance would drop a partition it still owns)."""
    with open_store(make_config()) as store:
        versions = {p: store.commit(p, 10, version=None) for p in range(10)}
        real_wait = store.session.wait
        lost = 0

        def wait_then_lose_the_first_reply(result: Any) -> Any:
            nonlocal lost
            answer = real_wait(result)
            if lost == 0 and isinstance(answer, list):  # a transaction's answers
                lost += 1
                raise ConnectionLoss("connection lost before the reply")
            return answer

        monkeypatch.setattr(store.session, "wait", wait_then_lose_the_first_reply)
        writes = [OffsetWrite(p, 20, versions[p]) for p in range(10)]
        outcomes = store.commit_all(writes, bundle_writes=5)
        assert lost == 1
        assert outcomes == {p: versions[p] + 1 for p in range(10)}
        for p in range(10):
            stored = store.read(p)
            assert stored is not None and (stored.offset, stored.version) == (20, versions[p] + 1)


def test_move_retries_past_a_concurrent_writer(
    make_config: Callable[..., TopicConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    with open_store(config) as spout, open_store(config) as operator:
        spout_version = spout.commit(0, 10, version=None, broker=("b1", 9092))
        real_get = operator.session.get
        reads = []

        def get_then_spout_commits(zk: Any, path: str) -> Any:
            found = real_get(zk, path)
            reads.append(found)
            if len(reads) == 1:  # the spout commits between the operator's read and write
                spout.commit(0, 11, version=spout_version, broker=("b1", 9092))
            return found

        monkeypatch.setattr(operator.session, "get", get_then_spout_commits)
        moved = operator.move(0, 500)
        assert len(reads) == 2  # lost the first compare-and-set, read again, won
        stored = spout.read(0)
        assert stored is not None and stored.offset == 500 and stored.version == moved.version
        assert stored.data["kspout"]["moved_from"] == 11
        assert stored.data["broker"] == {"host": "b1", "port": 9092}
        with pytest.raises(OffsetConflict):  # the spout lost ownership
            spout.commit(0, 12, version=spout_version + 1)


def test_move_creates_a_missing_record(make_config: Callable[..., TopicConfig]) -> None:
    with open_store(make_config()) as store:
        moved = store.move(5, 42)
        stored = store.read(5)
        assert stored is not None and stored.offset == 42 and moved.version == stored.version


REASON = "offset 100 is out of range: Kafka holds [150, 900)"


def test_stop_mark_is_written_read_and_cleared_by_the_next_commit(
    make_config: Callable[..., TopicConfig], zk: KazooClient
) -> None:
    config = make_config()
    path = f"{config.zk_spout_path}/partition_2"
    with open_store(config) as store:
        version = store.commit(2, 100, version=None, broker=("b1", 9092))
        stored = store.read(2)
        assert stored is not None and stored.stopped is None
        stopped_version = store.commit(2, 100, version=version, broker=("b1", 9092), stopped=REASON)
        assert stopped_version == version + 1
        stored = store.read(2)
        assert stored is not None
        assert (stored.offset, stored.version, stored.stopped) == (100, stopped_version, REASON)
        assert store.read_all()[2].stopped == REASON
        written = json.loads(zk.get(path)[0])
        # storm-kafka's fields unchanged; the mark is in kspout's own section
        assert set(written) == {"topology", "offset", "partition", "broker", "topic", "kspout"}
        assert (written["offset"], written["partition"], written["topic"]) == (100, 2, "events")
        assert written["broker"] == {"host": "b1", "port": 9092}
        assert written["kspout"]["stopped"] == REASON
        with pytest.raises(OffsetConflict):  # the stop is fenced like every commit
            store.commit(2, 100, version=version, stopped=REASON)
        store.commit(2, 160, version=stopped_version)
        stored = store.read(2)
        assert stored is not None and stored.offset == 160 and stored.stopped is None
        assert "stopped" not in json.loads(zk.get(path)[0])["kspout"]


def test_move_clears_the_stop_mark(make_config: Callable[..., TopicConfig]) -> None:
    with open_store(make_config()) as store:
        store.commit(0, 100, version=None, stopped=REASON)
        moved = store.move(0, 150)
        assert moved.stopped is None and "stopped" not in moved.data["kspout"]
        stored = store.read(0)
        assert stored is not None
        assert (stored.offset, stored.version, stored.stopped) == (150, moved.version, None)
        assert stored.data["kspout"]["moved_from"] == 100


def test_a_stop_mark_without_a_reason_still_reads_as_stopped(
    make_config: Callable[..., TopicConfig], zk: KazooClient
) -> None:
    config = make_config()
    record = {"offset": 5, "partition": 0, "topic": "events", "kspout": {"stopped": True}}
    zk.create(f"{config.zk_spout_path}/partition_0", json.dumps(record).encode(), makepath=True)
    with open_store(config) as store:
        stored = store.read(0)
        assert stored is not None and stored.stopped is not None
        assert "true" in stored.stopped
        with pytest.raises(ValueError, match="stopped"):
            store.commit(0, 5, version=stored.version, stopped=" ")
        with pytest.raises(ValueError, match="stopped="):
            store.commit(0, 5, version=stored.version, extra={"stopped": REASON})
        stored = store.read(0)
        assert stored is not None and stored.version == 0  # nothing was written


def test_instance_registration_is_ephemeral(make_config: Callable[..., TopicConfig]) -> None:
    config = make_config()
    with open_store(config) as observer:
        assert live_instances(observer.session) == []
        session = ZkSession(config)
        session.start()
        registry = InstanceRegistry(session, "orders-a")
        assert registry.register() == f"{config.zk_spout_path}/instances/orders-a"
        assert live_instances(observer.session) == ["orders-a"]
        session.close()
        assert live_instances(observer.session) == []


def test_registration_survives_session_expiry(make_config: Callable[..., TopicConfig]) -> None:
    config = make_config()
    with open_store(config) as observer, open_store(config, instance_id="b") as spout:
        register(spout)
        # Expire the spout's session the way kazoo's own test harness does: a second client
        # joins the session and closes it.
        session_id, password = spout.session.client.client_id
        thief = KazooClient(hosts=config.zookeeper, client_id=(session_id, password))
        thief.start(timeout=10)
        thief.stop()
        thief.close()
        deadline = time.monotonic() + 20

        def session() -> int | None:
            client_id = spout.session.client.client_id  # None while the client reconnects
            return None if client_id is None else int(client_id[0])

        while session() in (None, session_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session() not in (None, session_id), "the session did not expire"
        while live_instances(observer.session) != ["b"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_instances(observer.session) == ["b"]


def test_a_report_creates_the_node_again_when_it_is_gone(
    make_config: Callable[..., TopicConfig],
) -> None:
    """After an expiry whose re-registration failed the node is missing: the next report
    creates it again, with what was reported, so the instance gets partitions again."""
    config = make_config()
    with open_store(config) as observer:
        session = ZkSession(config)
        session.start()
        try:
            registry = InstanceRegistry(session, "orders-a")
            path = registry.register()
            observer.session.client.delete(path)  # what a failed re-registration leaves
            assert live_instances(observer.session) == []
            registry.report({"report": {"acked": 7}})
            assert live_instances(observer.session) == ["orders-a"]
            data, stat = observer.session.client.get(path)
            assert json.loads(data)["report"] == {"acked": 7}
            assert stat.ephemeralOwner == session.client.client_id[0]
        finally:
            session.close()


def test_read_retries_while_zookeeper_restarts(
    make_config: Callable[..., TopicConfig], zookeeper: ZooKeeperServer
) -> None:
    with open_store(make_config(), retry_timeout=30) as store:
        store.commit(0, 77, version=None)
        zookeeper.kill()
        restart = threading.Timer(2.0, zookeeper.start)
        restart.start()
        started = time.monotonic()
        try:
            stored = store.read(0)
        finally:
            restart.join()
        assert time.monotonic() - started >= 1.5  # it waited for the restart
        assert stored is not None and stored.offset == 77


def test_zookeeper_down_past_the_retry_budget(
    make_config: Callable[..., TopicConfig], zookeeper: ZooKeeperServer
) -> None:
    with open_store(make_config(), retry_timeout=2) as store:
        zookeeper.kill()
        try:
            with pytest.raises(ZooKeeperUnavailable) as caught:
                store.read(0)
        finally:
            zookeeper.start()
        assert zookeeper.address in str(caught.value)
        # The same store works again once its client has reconnected: kazoo's reconnect
        # backoff, grown while the server was down, may take longer than the 2 s budget.
        deadline = time.monotonic() + 30
        while True:
            try:
                assert store.read(0) is None
                break
            except ZooKeeperUnavailable:
                if time.monotonic() > deadline:
                    raise


def test_start_without_zookeeper_names_the_hosts(make_config: Callable[..., TopicConfig]) -> None:
    hosts = f"127.0.0.1:{free_port()}"
    session = ZkSession(make_config(zookeeper=hosts), connect_timeout=1)
    with pytest.raises(ZooKeeperUnavailable, match=hosts):
        session.start()


def test_digest_acl_hides_records_from_other_clients(
    make_config: Callable[..., TopicConfig], zk: KazooClient
) -> None:
    secured = make_config(zookeeper_auth={"credential": "kspout:s3cret"})
    with open_store(secured) as store:
        store.commit(0, 1, version=None)
        stored = store.read(0)
        assert stored is not None and stored.offset == 1
    path = f"{secured.zk_spout_path}/partition_0"
    with pytest.raises(NoAuthError):
        zk.get(path)
    with open_store(make_config()) as anonymous, pytest.raises(ZooKeeperAccessDenied) as caught:
        anonymous.read(0)
    assert "zookeeper_auth" in str(caught.value)


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[1, 2]",
        b'{"offset": "12"}',
        b'{"offset": true}',
        b'{"offset": 3, "topic": 7}',
    ],
)
def test_invalid_record_is_reported_and_move_repairs_it(
    make_config: Callable[..., TopicConfig], zk: KazooClient, raw: bytes
) -> None:
    config = make_config()
    zk.create(f"{config.zk_spout_path}/partition_0", raw, makepath=True)
    with open_store(config) as store:
        with pytest.raises(OffsetRecordInvalid, match="partition_0"):
            store.read(0)
        store.move(0, 12)
        stored = store.read(0)
        assert stored is not None and stored.offset == 12

"""ZkEpoch against the real ZooKeeper: a missing znode is epoch 0, every bump hands out an epoch
nobody else got, and a corrupt znode is a clear error."""

from __future__ import annotations

import threading
import uuid

import pytest
from kazoo.client import KazooClient

from dedup import EpochCorrupt, ZkEpoch

pytestmark = pytest.mark.integration


@pytest.fixture
def epoch(zk: KazooClient) -> ZkEpoch:
    return ZkEpoch(zk, f"/kspout-test/dedup-epoch/{uuid.uuid4().hex}/epoch")


def test_a_missing_znode_is_epoch_zero_and_the_first_bump_creates_it(
    epoch: ZkEpoch, zk: KazooClient
) -> None:
    assert epoch.current() == 0
    assert zk.exists(epoch.path) is None

    assert epoch.bump(0) == 1

    assert epoch.current() == 1
    assert zk.get(epoch.path)[0] == b"1"


def test_bump_goes_past_both_the_stored_epoch_and_the_one_seen(epoch: ZkEpoch) -> None:
    assert epoch.bump(0) == 1
    assert epoch.bump(0) == 2  # seen is stale: still a fresh epoch, never 1 again
    assert epoch.bump(10) == 11  # the caller saw a higher epoch elsewhere (Redis's fence)
    assert epoch.current() == 11


def test_concurrent_bumps_never_hand_out_the_same_epoch(zk: KazooClient, epoch: ZkEpoch) -> None:
    threads, bumps = 6, 5
    got: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run() -> None:
        mine = ZkEpoch(zk, epoch.path)
        start.wait()
        for _ in range(bumps):
            fresh = mine.bump(0)
            with lock:
                got.append(fresh)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)

    assert sorted(got) == list(range(1, threads * bumps + 1))
    assert epoch.current() == threads * bumps


def test_a_corrupt_znode_is_an_error_naming_the_path(zk: KazooClient, epoch: ZkEpoch) -> None:
    zk.create(epoch.path, b"not-a-number", makepath=True)

    with pytest.raises(EpochCorrupt) as raised:
        epoch.current()
    assert raised.value.path == epoch.path
    with pytest.raises(EpochCorrupt):
        epoch.bump(3)


@pytest.mark.parametrize("path", ["relative/epoch", "/trailing/", ""])
def test_the_path_must_be_absolute(zk: KazooClient, path: str) -> None:
    with pytest.raises(ValueError, match="absolute"):
        ZkEpoch(zk, path)

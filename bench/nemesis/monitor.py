"""What the nemesis watches while it runs: the commit points and the partitions' owners in
ZooKeeper, sampled every `INTERVAL` seconds on a thread of its own (a sample that fails, as
it will while ZooKeeper is down, is skipped), and each instance's id by its pid."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from kspout.config import TopicConfig
from kspout.ownership.tree import read_ownership
from kspout.zk.offsets import ZkOffsetStore
from kspout.zk.session import ZkSession

INTERVAL = 0.25  # seconds between samples: recovery times are read to this


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # time.monotonic() once read
    commits: dict[int, int]  # partition -> commit point
    owners: dict[int, str]  # partition -> the instance id that claims it
    pids: dict[str, int]  # instance id -> its process's pid


class Monitor:
    """Samples ZooKeeper until `stop()`; `samples` in time order."""

    def __init__(self, config: TopicConfig) -> None:
        # Short request retries: a sample is skipped rather than late.
        self.session = ZkSession(config, request_timeout=2.0, retry_timeout=2.0)
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nemesis-monitor", daemon=True)

    def start(self) -> None:
        self.session.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.session.close()

    @property
    def latest(self) -> Sample:
        while not self.samples:
            time.sleep(INTERVAL)
        return self.samples[-1]

    def held_by(self, pid: int, timeout: float = 30.0) -> tuple[str, list[int]]:
        """The instance id of process `pid` and the partitions it claims, once it claims any
        (it may have just started)."""
        deadline = time.monotonic() + timeout
        while True:
            sample = self.latest
            ids = [i for i, p in sample.pids.items() if p == pid]
            held = sorted(p for p, owner in sample.owners.items() if ids and owner == ids[0])
            if held or time.monotonic() > deadline:
                return (ids[0] if ids else "?"), held
            time.sleep(INTERVAL)

    def _run(self) -> None:
        store = ZkOffsetStore(self.session)
        while not self._stop.wait(INTERVAL):
            try:
                commits = {p: s.offset for p, s in store.read_all().items()}
                tree = read_ownership(self.session)
            except Exception:  # ZooKeeper is down or slow: this sample is skipped
                continue
            pids = {i: int(data.get("pid", -1)) for i, data in tree.instances.items()}
            self.samples.append(Sample(time.monotonic(), commits, dict(tree.claims), pids))

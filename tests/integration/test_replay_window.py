"""The replay window against the real ZooKeeper and Kafka broker: a start that would replay past
it is refused, a commit point stuck for half of it is reported, and an operator's move behind it
needs `--force`. The window is seconds here; records carry wall-clock stamps, so the tests wait
for a window to pass instead of faking it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from kspout.cli import main
from kspout.cli.report import progress_json
from kspout.config import TopicConfig
from kspout.contract import PartitionTask, TaskResult
from kspout.devstack import DevStack
from kspout.driver import Driver
from kspout.errors import ReplayPastWindow
from kspout.executor.local import LocalExecutor
from kspout.kafka import Record
from kspout.zk.record import Checkpoint, encode_done, history_fields, now_ms
from kspout.zk.registry import live_instances
from tests.integration.helpers import PARTITIONS, open_store, produce, stored, topic_file


class InlineExecutor(LocalExecutor):
    """Runs each batch to its end inside `submit`: a fake clock stands still while it runs."""

    def submit(self, batch: int, tasks: Sequence[PartitionTask]) -> Future[list[TaskResult]]:
        future = super().submit(batch, tasks)
        wait([future])
        return future


def acks(record: Record) -> None:
    """A handler that finishes every record."""


def test_a_start_that_would_replay_past_the_window_is_refused(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(20)})
    window = 2.0
    long_ago = now_ms() - 60_000
    # Stuck at 5 for a minute with finished runs above it; the cap left out those from 9 up,
    # handed out before the window began: a restart would run them again.
    fields = {
        **encode_done(5, [(6, 8)], 9),
        "emitted": 12,
        **history_fields([Checkpoint(long_ago, 5, 12)], window),
    }
    with open_store(config) as store:
        store.commit(0, 5, version=None, extra=fields)

    refused = Driver(config, LocalExecutor(config, acks), replay_window=window)
    with pytest.raises(ReplayPastWindow) as caught:
        refused.start()
    refused.close()
    message = str(caught.value)
    assert "partition 0: offsets [9, 12)" in message
    assert "--replay-past-window" in message and "replay_past_window=True" in message
    with open_store(config) as store:
        assert live_instances(store.session) == [], "a refused start leaves no registration"

    allowed = Driver(
        config, LocalExecutor(config, acks), replay_window=window, replay_past_window=True
    )
    with allowed:
        final = allowed.run(until_caught_up=True)
    p0 = final.partitions[0]
    assert p0.stats.restored == 2 and p0.committed == 20
    assert stored(config)[0] == 20


def test_a_listed_run_is_skipped_so_only_a_cut_list_is_refused(
    make_config: Callable[..., TopicConfig], producer: Producer
) -> None:
    config = make_config()
    produce(producer, config.topic, {0: range(20)})
    fields = {
        **encode_done(5, [(6, 12)], None),
        "emitted": 12,
        **history_fields([Checkpoint(now_ms() - 60_000, 5, 12)], 2.0),
    }
    with open_store(config) as store:
        store.commit(0, 5, version=None, extra=fields)
    seen: list[int] = []
    with Driver(
        config, LocalExecutor(config, lambda r: seen.append(r.offset)), replay_window=2.0
    ) as d:
        d.run(until_caught_up=True)
    assert seen[:2] == [5, 12], "finished offsets 6-11 were not run again"
    assert sorted(seen) == [5, *range(12, 20)]


def test_a_commit_point_stuck_for_half_the_window_is_reported_once(
    make_config: Callable[..., TopicConfig], producer: Producer, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(max_retries=1_000_000)
    produce(producer, config.topic, {0: range(40)})
    now = [0.0]

    def handler(record: Record) -> None:
        if record.offset == 3:
            raise ValueError("cannot parse order 3")

    driver = Driver(
        config,
        InlineExecutor(config, handler),
        clock=lambda: now[0],
        sleep=lambda s: None,
        replay_window=10.0,
    )
    with caplog.at_level(logging.WARNING, "kspout.driver.window"), driver:
        while now[0] < 30.0:  # three windows of fake time: one episode, one warning
            driver.step()
            now[0] += 0.25
        progress = driver.progress()
    warnings = [r.getMessage() for r in caplog.records if r.name == "kspout.driver.window"]
    assert len(warnings) == 1, warnings
    assert f"{config.topic}[0]" in warnings[0] and "stuck at 3" in warnings[0]
    assert "offset 3, waiting for attempt" in warnings[0] and "cannot parse order 3" in warnings[0]
    view = progress.partitions[0]
    assert view.stalls == 1 and view.stuck_for is not None and view.stuck_for > 25.0
    rows = {row["partition"]: row for row in progress_json(progress)["partitions"]}
    assert rows[0]["stalls"] == 1 and rows[1]["stalls"] == 0
    assert progress_json(progress)["totals"]["stalls"] == 1


def test_an_operators_move_behind_the_window_needs_force(
    stack: DevStack, make_config: Callable[..., TopicConfig], producer: Producer, tmp_path: Path
) -> None:
    config = make_config()
    produce(producer, config.topic, {p: range(30) for p in PARTITIONS})
    window = 1.0
    with Driver(config, LocalExecutor(config, acks), replay_window=window) as driver:
        driver.run(until_caught_up=True)
    with open_store(config) as store:
        records = store.read_all()
    assert all(r.window == window and r.history for r in records.values())
    time.sleep(window + 0.5)  # the window passes: offsets 0-29 were finished before it began
    path = topic_file(tmp_path / "topic.toml", stack, config)

    def kspout(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(main, ["offsets", "set", "--config", str(path), *args])
        return result.exit_code, result.output

    code, output = kspout("--partition", "0", "--partition", "2", "--to", "earliest")
    assert code == 1, output
    assert "dedup window (1s)" in output and "--force" in output
    assert "partition 0: offsets [0, 30)" in output and "partition 2: offsets [0, 30)" in output
    assert "finished by" in output
    assert stored(config) == dict.fromkeys(PARTITIONS, 30), "nothing moved"

    code, output = kspout("--partition", "1", "--to", "30")  # not behind: nothing applies again
    assert code == 0, output

    code, output = kspout("--partition", "0", "--to", "10", "--force", "--json")
    assert code == 0, output
    (row,) = json.loads(output)["partitions"]
    assert row["to"] == 10 and "partition 0: offsets [10, 30)" in row["applies_again"]
    assert stored(config)[0] == 10

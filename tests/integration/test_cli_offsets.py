"""`kspout offsets show|set` against the session's real ZooKeeper and Kafka broker."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from kspout.cli import main
from kspout.config import load_config
from kspout.devstack import DevStack
from kspout.ownership.tree import SpoutTree
from kspout.zk.claims import claim_partition
from kspout.zk.offsets import ZkOffsetStore
from tests.integration.helpers import open_store, register

BASE_MS = 1_700_000_000_000  # message i of a test topic has timestamp BASE_MS + i * 1000


@pytest.fixture
def topic_file(tmp_path: Path, stack: DevStack, topic_name: str) -> Path:
    """A topic with 10 messages in partition 0 and 4 in partition 1 (4 partitions), and its
    config file."""
    producer = Producer({"bootstrap.servers": stack.info.brokers})
    for partition, count in ((0, 10), (1, 4)):
        for i in range(count):
            producer.produce(topic_name, b"x", partition=partition, timestamp=BASE_MS + i * 1000)
    assert producer.flush(10) == 0
    path = tmp_path / "topic.toml"
    path.write_text(
        f'topic = "{topic_name}"\nspout_id = "{topic_name}-spout"\nzk_root = "/cli-test"\n'
        f'brokers = "{stack.info.brokers}"\nzookeeper = "{stack.info.zookeeper}"\n'
        'topology_name = "orders"\n'
    )
    return path


@pytest.fixture
def kspout(topic_file: Path) -> Callable[..., Result]:
    """Runs `kspout offsets <args> --config <topic file>`."""

    def run(*args: str) -> Result:
        runner = CliRunner()
        return runner.invoke(
            main, ["offsets", *args, "--config", str(topic_file)], env={"COLUMNS": "200"}
        )

    return run


def stored_offsets(topic_file: Path) -> dict[int, int]:
    with open_store(load_config(topic_file)) as store:
        return {p: s.offset for p, s in store.read_all().items()}


def test_show_reports_lag_and_where_start_would_begin(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    with open_store(load_config(topic_file), instance_id="orders-run1") as spout:
        spout.commit(0, 4, version=None)
        register(spout)
        result = kspout("show", "--json")
        assert result.exit_code == 0, result.output
        answer = json.loads(result.stdout)
        assert answer["live_instances"] == ["orders-run1"]
        rows = {row["partition"]: row for row in answer["partitions"]}
        assert sorted(rows) == [0, 1, 2, 3]
        assert rows[0] == {
            "partition": 0,
            "stored_offset": 4,
            "low": 0,
            "high": 10,
            "lag": 6,
            "out_of_range": False,
            "stopped": None,
            "start": None,
            "writer_name": "orders",
            "writer_id": "orders-run1",
            "writer_live": True,
        }
        assert rows[1]["stored_offset"] is None and rows[1]["lag"] is None
        assert rows[1]["start"] == {"position": "earliest", "offset": 0}
        assert rows[1]["high"] == 4

        table = kspout("show")
        assert table.exit_code == 0, table.output
        assert "orders/orders-run1" in table.stdout
        assert "(start earliest: 0)" in table.stdout
        assert "live instances: orders-run1" in table.stdout


def test_set_to_a_number_prints_old_and_new(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    with open_store(load_config(topic_file)) as spout:
        spout.commit(0, 4, version=None)
    result = kspout("set", "--partition", "0", "--to", "7")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("[0]: 4 -> 7")
    created = kspout("set", "--partition", "1", "--to", "2", "--json")
    moved = {"partition": 1, "changed": True, "from": None, "to": 2, "applies_again": None}
    answer = json.loads(created.stdout)
    assert (answer["action"], answer["dry_run"], answer["partitions"]) == ("set", False, [moved])
    assert stored_offsets(topic_file) == {0: 7, 1: 2}


def test_set_to_earliest_latest_and_timestamp(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    assert kspout("set", "--all", "--to", "latest").exit_code == 0
    assert stored_offsets(topic_file) == {0: 10, 1: 4, 2: 0, 3: 0}
    assert kspout("set", "--partition", "0", "--partition", "1", "--to", "earliest").exit_code == 0
    assert stored_offsets(topic_file) == {0: 0, 1: 0, 2: 0, 3: 0}
    at = kspout("set", "--partition", "0", "--to", f"timestamp:{BASE_MS + 5000}", "--json")
    assert at.exit_code == 0, at.output
    moved = {"partition": 0, "changed": True, "from": 0, "to": 5, "applies_again": None}
    assert json.loads(at.stdout)["partitions"] == [moved]


def claim(spout: ZkOffsetStore, partition: int) -> None:
    """Claim `partition` as a live owner does (`kspout.ownership`)."""
    fence = SpoutTree(spout.path).claim(partition)
    owner = b'{"instance": "orders-live"}'
    assert claim_partition(spout, partition, fence, owner, lambda: 0) is not None


def test_set_refuses_a_partition_a_live_instance_owns(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    with open_store(load_config(topic_file), instance_id="orders-live") as spout:
        register(spout)
        claim(spout, 0)
        refused = kspout("set", "--partition", "0", "--to", "3")
        assert refused.exit_code == 1
        assert "orders-live" in refused.stderr and "--force" in refused.stderr
        assert "stop the spout" in refused.stderr
        assert stored_offsets(topic_file) == {0: 0}  # as claimed
        unowned = kspout("set", "--partition", "1", "--to", "3")  # registered, but not its owner
        assert unowned.exit_code == 0, unowned.output
        assert stored_offsets(topic_file) == {0: 0, 1: 3}


def test_set_refuses_an_offset_outside_the_partition(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    result = kspout("set", "--partition", "1", "--to", "99")
    assert result.exit_code == 1
    assert "from 0 to 4" in result.stderr
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert stored_offsets(topic_file) == {}


def test_set_usage_errors(kspout: Callable[..., Result]) -> None:
    assert kspout("set", "--to", "1").exit_code == 2  # neither --partition nor --all
    bad = kspout("set", "--all", "--to", "yesterday")
    assert bad.exit_code == 2 and "timestamp:<ms>" in bad.stderr
    missing = kspout("set", "--partition", "9", "--to", "0")
    assert missing.exit_code == 2 and "no partition 9" in missing.stderr


REASON = "offset 100 is out of range: Kafka holds [0, 10)"


def test_show_marks_a_stopped_partition_and_its_resume_command_resumes_it(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    with open_store(load_config(topic_file), instance_id="orders-run2") as spout:
        spout.commit(0, 100, version=None, stopped=REASON)
        spout.commit(1, 2, version=None)
        register(spout)  # the driver keeps running the other partitions

        result = kspout("show", "--json")
        assert result.exit_code == 0, result.output
        rows = {row["partition"]: row for row in json.loads(result.stdout)["partitions"]}
        assert rows[0]["stopped"] == REASON and rows[0]["out_of_range"] is True
        assert rows[1]["stopped"] is None and rows[2]["stopped"] is None

        table = kspout("show")
        assert table.exit_code == 0, table.output
        lines = table.stdout.splitlines()
        row_0 = next(line for line in lines if "orders/orders-run2" in line and "STOPPED" in line)
        assert "Kafka holds [0, 10)" in row_0  # the reason, on the stopped partition's row
        assert sum("STOPPED" in line for line in lines) == 1
        command = f"kspout offsets set --config {topic_file} --partition 0 --to earliest"
        resume = [line.strip() for line in lines if line.strip().startswith("kspout offsets set")]
        assert resume == [command]

        # The printed command, run as printed, works under the live instance without --force.
        moved = CliRunner().invoke(main, shlex.split(command)[1:])
        assert moved.exit_code == 0, moved.output
        assert moved.stdout.strip().endswith("[0]: 100 -> 0")
        with open_store(load_config(topic_file)) as store:
            stored = store.read(0)
        assert stored is not None and (stored.offset, stored.stopped) == (0, None)

        after = kspout("show")
        assert after.exit_code == 0, after.output
        assert "STOPPED" not in after.stdout and "kspout offsets set" not in after.stdout
        shown = json.loads(kspout("show", "--json").stdout)
        rows = {row["partition"]: row for row in shown["partitions"]}
        assert rows[0]["stopped"] is None and rows[0]["stored_offset"] == 0


def test_set_under_a_live_owner_needs_force_unless_the_partition_is_stopped(
    topic_file: Path, kspout: Callable[..., Result]
) -> None:
    with open_store(load_config(topic_file), instance_id="orders-live") as spout:
        spout.commit(0, 100, version=None, stopped=REASON)
        spout.commit(1, 2, version=None)
        register(spout)
        claim(spout, 0)
        claim(spout, 1)
        refused = kspout("set", "--partition", "0", "--partition", "1", "--to", "earliest")
        assert refused.exit_code == 1 and "--force" in refused.stderr
        assert "partitions 1 are owned" in refused.stderr  # 0 is stopped: nobody runs it
        assert stored_offsets(topic_file) == {0: 100, 1: 2}
        stopped = kspout("set", "--partition", "0", "--to", "earliest")
        assert stopped.exit_code == 0, stopped.output
        assert stored_offsets(topic_file) == {0: 0, 1: 2}

"""A real Spark standalone cluster (master + worker from the pyspark wheel): a session on it runs
Python tasks in executor processes that the worker started, those import kspout and
confluent-kafka, and stopping the cluster or the session leaves nothing behind."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from pyspark import cloudpickle
from pyspark.sql import SparkSession

import kspout
from kspout import Fields, KafkaSpout
from kspout.config import TopicConfig
from kspout.devstack import DevStack
from kspout.devstack.ports import LOOPBACK, port_open
from kspout.devstack.processes import pid_alive
from kspout.devstack.spark_cluster import SparkStandalone
from kspout.errors import StackError
from kspout.executor.topology import ChainItem
from tests.integration import spark_jobs
from tests.integration.spark_jobs import Count, Split
from tests.integration.word_count import check_word_count, word_count_topic

pytestmark = pytest.mark.integration

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# Executors do not run from the repository: a function of this module, pickled by reference as
# usual, would fail there with "No module named 'tests'" (local mode hides that). Ship this
# module's functions by value instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with SparkStandalone(tmp_path_factory.mktemp("spark"), cores=2, memory="1g") as spark_cluster:
        yield spark_cluster


def _stop_spark() -> None:
    """Stop whatever session or context this process has (other tests share a `local[2]` one),
    so that `getOrCreate()` builds a new one with our settings instead of returning it."""
    from pyspark import SparkContext

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])  # field 4, ppid


def _task_facts(_: object) -> dict[str, Any]:
    """Runs in a Spark Python worker: who it is, which JVM started it, and what it imports."""
    import confluent_kafka

    import kspout

    pid = ancestor = os.getpid()
    for _level in range(5):  # Python worker <- pyspark.daemon <- executor JVM
        ancestor = _parent(ancestor)
        if EXECUTOR_CLASS.encode() in Path(f"/proc/{ancestor}/cmdline").read_bytes():
            break
    else:
        ancestor = 0
    return {
        "pid": pid,
        "executable": sys.executable,
        "executor_jvm": ancestor,
        "executor_parent": _parent(ancestor) if ancestor else 0,
        "kspout": kspout.__file__,
        "confluent_kafka": confluent_kafka.version()[0],
    }


def test_standalone_cluster_runs_python_tasks_in_its_executors(
    cluster: SparkStandalone,
) -> None:
    assert cluster.master_url.startswith("spark://127.0.0.1:")
    assert cluster.master_state()["aliveworkers"] == 1
    _stop_spark()
    spark = _cluster_session(cluster)
    try:
        sc = spark.sparkContext
        assert sc.master == cluster.master_url, "an earlier session leaked into this test"
        facts = sc.parallelize(range(4), 2).map(_task_facts).collect()
        executors = sc._jsc.sc().getExecutorIds().size()
        driver_jvm = sc._gateway.proc.pid
    finally:
        spark.stop()
    assert SparkSession.getActiveSession() is None

    assert len(facts) == 4, cluster.log_tails()
    assert executors >= 1, "no executor registered with the driver"
    for fact in facts:
        assert fact["pid"] != os.getpid()
        assert fact["executable"] == sys.executable
        # The executor JVM is neither the driver's JVM nor ours, and the worker started it.
        assert fact["executor_jvm"] not in (0, driver_jvm, os.getpid())
        assert fact["executor_parent"] == cluster.worker_pid
        assert fact["kspout"] == kspout.__file__
        assert fact["confluent_kafka"]
    # The session is over: the worker kills its executor, which must not outlive it.
    [executor_jvm] = {fact["executor_jvm"] for fact in facts}
    deadline = time.monotonic() + 30.0
    while pid_alive(executor_jvm) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(executor_jvm), cluster.log_tails()


def test_kspout_runs_a_grouped_word_count_on_the_cluster(
    cluster: SparkStandalone,
    stack: DevStack,
    make_config: Callable[..., TopicConfig],
    producer: Producer,
    redis_client: redis.Redis,
) -> None:
    """The production shape: the driver here, bolts in the worker's executor processes."""
    per_partition = 500
    config, url, key = word_count_topic(make_config, producer, stack, per_partition, 500)
    _stop_spark()
    # The bolts live in a test module that executors cannot import: ship them by value.
    cloudpickle.register_pickle_by_value(spark_jobs)
    spark = _cluster_session(cluster)
    try:
        assert spark.sparkContext.master == cluster.master_url
        chain: list[ChainItem] = [Split(url), Fields("word"), Count(url, key)]
        progress = KafkaSpout(config, spark).run(chain, until_caught_up=True)
    finally:
        spark.stop()
        cloudpickle.unregister_pickle_by_value(spark_jobs)

    check_word_count(progress, config, stack, redis_client, per_partition)
    pids = {int(pid) for pid in redis_client.smembers(f"{key}:pids")}
    assert pids and os.getpid() not in pids  # the bolts ran in the executors' workers


def _cluster_session(cluster: SparkStandalone) -> SparkSession:
    builder = SparkSession.builder.appName("kspout-test-spark-cluster").config(
        "spark.ui.showConsoleProgress", "false"
    )
    for key, value in cluster.session_conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def test_local_mode_still_works_after_a_cluster_session() -> None:
    """A session on the standalone master must not leak into tests that use `local[2]`."""
    active = SparkSession.getActiveSession()
    assert active is None or not active.sparkContext.master.startswith("spark://")
    _stop_spark()
    spark = SparkSession.builder.master("local[2]").appName("kspout-test-local").getOrCreate()
    try:
        assert spark.sparkContext.master == "local[2]"
        assert spark.sparkContext.parallelize(range(10), 2).sum() == 45
    finally:
        spark.stop()
    assert SparkSession.getActiveSession() is None


def _process_group(pgid: int) -> list[int]:
    """Pids of the live processes in process group `pgid` (from /proc)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] != "Z":  # field 5, pgrp; field 3, state
            members.append(int(stat.parent.name))
    return members


def test_stop_leaves_no_process_alive_and_start_runs_it_again(cluster: SparkStandalone) -> None:
    master, worker = cluster.master_pid, cluster.worker_pid
    assert master is not None and worker is not None
    assert _process_group(master) and _process_group(worker)
    try:
        cluster.stop()
        assert not pid_alive(master) and not pid_alive(worker)
        assert _process_group(master) == [] and _process_group(worker) == []
        assert not cluster.running and cluster.master_pid is None
        cluster.stop()  # idempotent
    finally:
        cluster.start()  # on the same ports, for any later test of the module
    assert cluster.running and cluster.master_pid not in (None, master)
    assert cluster.master_state()["aliveworkers"] == 1


def test_a_start_that_times_out_names_the_log_and_leaves_nothing_running(tmp_path: Path) -> None:
    slow = SparkStandalone(tmp_path, start_timeout=1.0)  # a JVM needs longer than that to start
    with pytest.raises(StackError, match=r"Spark master did not answer within 1 s") as caught:
        slow.start()
    assert str(slow.master_log) in str(caught.value)
    assert not slow.running and slow.master_pid is None and slow.worker_pid is None
    assert slow.master_log.exists() and not slow.worker_log.exists()
    master_port = int(slow.master_url.rpartition(":")[2])
    assert not port_open(LOOPBACK, master_port)


def test_memory_in_spark_syntax_only(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'lots'"):
        SparkStandalone(tmp_path, memory="lots")

"""`classify`: whose fault a failed Spark job is, from the error text PySpark 4 hands the driver.

A dead Python worker or a lost executor is a CRASH (ambiguous: isolate what the task left
open); anything else Spark reports (an exception raised in the worker outside per-message code,
a job that cannot be serialized, a cancelled job group) is the INFRASTRUCTURE's and costs the
messages nothing. The texts below are shaped as `str()` of what the job future raises.
"""

from __future__ import annotations

import pytest

from kspout.driver.failures import JobFailure, classify

PY4J = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n: "
)

WORKER_CRASHED = (
    PY4J + "org.apache.spark.SparkException: Job aborted due to stage failure: Task 1 in stage "
    "3.0 failed 1 times, most recent failure: Lost task 1.0 in stage 3.0 (TID 7) (localhost "
    "executor driver): org.apache.spark.SparkException: Python worker exited unexpectedly "
    "(crashed)\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1"
    ".applyOrElse(PythonRunner.scala:621)\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1"
    ".applyOrElse(PythonRunner.scala:603)\n"
    "Caused by: java.io.EOFException\n"
    "\tat java.base/java.io.DataInputStream.readInt(DataInputStream.java:386)\n"
    "\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:933)\n"
    "\t... 31 more\n\nDriver stacktrace:\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
    "(DAGScheduler.scala:2856)\n"
)

WORKER_CRASHED_FAULTHANDLER = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 12.0 "
    "failed 4 times, most recent failure: Lost task 0.3 in stage 12.0 (TID 48) (10.1.4.17 "
    "executor 2): org.apache.spark.SparkException: Python worker exited unexpectedly "
    "(crashed): Fatal Python error: Segmentation fault\n\n"
    "Current thread 0x00007f3b2c1ff740 (most recent call first):\n"
    '  File "/opt/jobs/handler.py", line 41 in parse\n'
)

EXECUTOR_LOST = (
    PY4J + "org.apache.spark.SparkException: Job aborted due to stage failure: Task 2 in stage "
    "5.0 failed 4 times, most recent failure: Lost task 2.3 in stage 5.0 (TID 31) (10.1.4.22 "
    "executor 3): ExecutorLostFailure (executor 3 exited caused by one of the running tasks) "
    "Reason: Command exited with code 137\n"
    "Driver stacktrace:\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages"
    "(DAGScheduler.scala:2856)\n"
)

WORKER_CONNECTION_RESET = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 7.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 7.0 (TID 12) (localhost "
    "executor driver): java.net.SocketException: Connection reset\n"
    "\tat java.base/sun.nio.ch.NioSocketImpl.implRead(NioSocketImpl.java:318)\n"
    "\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:933)\n"
)

MODULE_NOT_FOUND = (
    PY4J + "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
    "2.0 failed 1 times, most recent failure: Lost task 0.0 in stage 2.0 (TID 2) (localhost "
    "executor driver): org.apache.spark.api.python.PythonException: Traceback (most recent "
    "call last):\n"
    '  File "/opt/venv/lib/python3.11/site-packages/pyspark/worker.py", line 3225, in main\n'
    "    func, profiler, deserializer, serializer = read_command(pickleSer, infile)\n"
    '  File "/opt/venv/lib/python3.11/site-packages/pyspark/worker.py", line 2949, in '
    "read_command\n"
    "    command = serializer._read_with_length(file)\n"
    '  File "/opt/venv/lib/python3.11/site-packages/pyspark/serializers.py", line 174, in '
    "_read_with_length\n"
    '    raise SerializationError("Caused by " + traceback.format_exc())\n'
    "pyspark.serializers.SerializationError: Caused by Traceback (most recent call last):\n"
    '  File "/opt/venv/lib/python3.11/site-packages/pyspark/serializers.py", line 472, in loads\n'
    "    return cloudpickle.loads(obj, encoding=encoding)\n"
    "ModuleNotFoundError: No module named 'confluent_kafka'\n\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException"
    "(PythonRunner.scala:581)\n"
    "\tat org.apache.spark.api.python.PythonRunner$$anon$3.read(PythonRunner.scala:940)\n"
)

PYTHON_EXCEPTION_IN_TASK = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 3 in stage 9.0 "
    "failed 1 times, most recent failure: Lost task 3.0 in stage 9.0 (TID 19) (localhost "
    "executor driver): org.apache.spark.api.python.PythonException: Traceback (most recent "
    "call last):\n"
    '  File "/work/main/kspout/spark/worker.py", line 160, in run_partition\n'
    "    results = list(run(task))\n"
    "AttributeError: 'NoneType' object has no attribute 'spans'\n"
)

NOT_PICKLABLE = "Could not serialize object: TypeError: cannot pickle '_thread.RLock' object"

TASK_NOT_SERIALIZABLE = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Failed to serialize "
    "task 4, not attempting to retry it. Exception during serialization: "
    "java.io.NotSerializableException: org.apache.spark.SparkContext\n"
)

CANCELLED = (
    PY4J + "org.apache.spark.SparkException: Job 17 cancelled part of cancelled job group "
    "kspout-batch-42\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.handleJobCancellation(DAGScheduler.scala:2700)\n"
)

STAGE_CANCELLED = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 4.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 4.0 (TID 9) (localhost "
    "executor driver): TaskKilled (Stage cancelled: Job 5 cancelled part of cancelled job group "
    "kspout-batch-5)\n"
)

NO_EXECUTORS = "org.apache.spark.SparkException: Job 3 cancelled because SparkContext was shut down"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(WORKER_CRASHED, id="python-worker-crashed"),
        pytest.param(WORKER_CRASHED_FAULTHANDLER, id="python-worker-segfault"),
        pytest.param(EXECUTOR_LOST, id="executor-lost"),
        pytest.param(WORKER_CONNECTION_RESET, id="worker-socket-reset"),
        pytest.param(
            WORKER_CONNECTION_RESET.replace("Connection reset", "Broken pipe"),
            id="worker-died-while-the-jvm-wrote-to-it",
        ),
        pytest.param("Python worker exited unexpectedly (crashed)", id="bare-message"),
    ],
)
def test_a_dead_worker_or_executor_is_a_crash(error: str) -> None:
    assert classify(error) is JobFailure.CRASH


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(MODULE_NOT_FOUND, id="module-not-found"),
        pytest.param(PYTHON_EXCEPTION_IN_TASK, id="python-exception"),
        pytest.param(NOT_PICKLABLE, id="pickling-error"),
        pytest.param(TASK_NOT_SERIALIZABLE, id="task-not-serializable"),
        pytest.param(CANCELLED, id="job-group-cancelled"),
        pytest.param(STAGE_CANCELLED, id="task-killed-stage-cancelled"),
        pytest.param(NO_EXECUTORS, id="context-shut-down"),
        pytest.param("", id="empty"),
        pytest.param("CancelledError", id="future-cancelled"),
    ],
)
def test_anything_else_spark_reports_is_the_infrastructures(error: str) -> None:
    assert classify(error) is JobFailure.INFRASTRUCTURE


def test_the_crash_is_found_anywhere_in_a_multi_line_error() -> None:
    """Spark prints the crash after a long driver-side preamble; one line of it decides."""
    preamble = "\n".join(f"\tat org.apache.spark.Frame{i}.run(Frame.scala:{i})" for i in range(50))
    assert classify(preamble + "\n" + WORKER_CRASHED) is JobFailure.CRASH
    assert classify(preamble + "\n" + MODULE_NOT_FOUND) is JobFailure.INFRASTRUCTURE

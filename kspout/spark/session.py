"""Creating (or reusing) the SparkSession kspout runs its jobs on."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from pyspark.sql import SparkSession

from kspout import streaming


def spark_session(
    master: str | None = None, app_name: str = "kspout", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The active SparkSession, or a new one whose Python workers run this interpreter.

    `master` defaults to spark-submit's `--master`, or `local[*]` outside spark-submit; `conf`
    adds Spark settings.
    Workers start `python3` from PATH unless told otherwise, and that interpreter may lack
    confluent-kafka or kspout; so unless the environment already names one, the workers use
    the driver's own interpreter. A session made here can read `spark.readStream.format(
    "kspout")` (`kspout.streaming`, with PySpark 4.2+).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    python = os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.pyspark.python", python)
        .config("spark.ui.showConsoleProgress", "false")  # kspout shows its own progress
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if master is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        master = "local[*]"  # not under spark-submit, which passes its own --master
    if master is not None:
        builder = builder.master(master)
    session = builder.getOrCreate()
    if streaming.supported():  # spark.readStream.format("kspout")
        streaming.register(session)
    return session

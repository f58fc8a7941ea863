"""The driver program `deploy/spark-submit.sh` submits: `kspout run` under spark-submit.

    spark-submit [...] deploy/job.py --config orders.toml --handler myjob:chain [RUN OPTIONS]

The arguments are `kspout run`'s (`--config`, `--handler`, `--until-caught-up`,
`--max-batches`, `--replay-past-window`, `--json`), handed to the `kspout` console script's
own command (`ENTRY_POINT`, the target of `[project.scripts] kspout` in pyproject.toml), so a
job submitted to a cluster takes exactly the options `kspout run` takes on one machine. Only
`--spark` is not given: this script starts the SparkSession with what spark-submit set up
(`--master`, `--archives`, `--conf`) and passes that session's master as `--spark`, so the
batches run on it.

The topic file is read where it was given; when the driver runs on another machine
(`--deploy-mode cluster`), the copy that spark-submit's `--files` put in the driver's working
directory is used instead. Handler modules that need the topic's settings (the dedup bolt takes
the config) find the path they should load in the environment variable `KSPOUT_CONFIG`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ENTRY_POINT = "kspout.cli:main"  # pyproject.toml: [project.scripts] kspout
CONFIG_ENV = "KSPOUT_CONFIG"
USAGE = "usage: spark-submit [...] deploy/job.py --config FILE --handler MODULE:ATTR [RUN OPTIONS]"


def config_path(argv: Sequence[str]) -> str | None:
    """The value of `--config` in `argv` (`--config F` or `--config=F`), or None."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return None


def with_config(argv: Sequence[str], path: str) -> list[str]:
    """`argv` with the value of `--config` replaced by `path`."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = path
        elif arg.startswith("--config="):
            out[i] = f"--config={path}"
    return out


def locate_config(path: str, shipped: Callable[[str], str] | None = None) -> str:
    """The topic file to read: `path` itself, else the copy `--files` shipped (cluster mode:
    the driver's working directory, or `shipped(name)`, Spark's SparkFiles)."""
    candidates = [Path(path), Path.cwd() / Path(path).name]
    if shipped is not None:
        candidates.append(Path(shipped(Path(path).name)))
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    return path  # `kspout run` names the file it cannot read


def run_args(argv: Sequence[str], master: str) -> list[str]:
    """`kspout run`'s arguments for this job: the caller's, and `--spark` set to `master`."""
    if any(arg == "--spark" or arg.startswith("--spark=") for arg in argv):
        raise SystemExit(
            "deploy/job.py: do not pass --spark; the master comes from spark-submit's --master"
        )
    return ["run", *argv, "--spark", master]


def load_entry_point(spec: str = ENTRY_POINT) -> Callable[..., Any]:
    """Import `module:attr`, the way the console script does."""
    module, _, attr = spec.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if config_path(args) is None:
        raise SystemExit(f"{USAGE}\ndeploy/job.py: --config is required")
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        raise SystemExit(
            "deploy/job.py runs under spark-submit (see deploy/spark-submit.sh); on one machine, "
            "run `kspout run --config ... --handler ... --spark local[2]` instead"
        )
    from pyspark import SparkFiles
    from pyspark.sql import SparkSession

    # spark-submit's settings (master, archives, spark.pyspark.python, conf) make the session;
    # `kspout run --spark` then finds it active and uses it as it is. kspout run shows its own
    # progress table, so Spark's console progress bar stays off.
    builder = SparkSession.builder.config("spark.ui.showConsoleProgress", "false")
    spark = builder.getOrCreate()
    config = locate_config(config_path(args) or "", SparkFiles.get)
    os.environ[CONFIG_ENV] = config  # the file this run reads, for handler modules
    args = with_config(args, config)
    master = spark.sparkContext.master
    if not master:
        raise SystemExit("deploy/job.py: spark-submit set no master (give --master)")
    kspout = load_entry_point()
    kspout(run_args(args, master), prog_name="kspout")


if __name__ == "__main__":
    main()

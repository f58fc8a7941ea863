"""Locate what the dev stack runs: `java`, Apache Kafka's jars (in kspout's Kafka cache, filled by
`deploy/setup.sh`), ZooKeeper's jars (in the pyspark wheel), `redis-server`, PostgreSQL's server
binaries.

Each lookup raises `StackError` with the command that installs the missing piece. `path` replaces
`$PATH` for the lookup (None: the real `$PATH`), so tests can simulate a missing binary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from kspout.errors import StackError

JAVA_INSTALL = "apt-get install -y openjdk-17-jre-headless"
REDIS_INSTALL = "apt-get install -y redis-server"
PYSPARK_INSTALL = "pip install pyspark"
POSTGRES_INSTALL = "apt-get install -y postgresql"
SETUP = "bash deploy/setup.sh"
DEBIAN_POSTGRES = "/usr/lib/postgresql"  # Debian keeps initdb and postgres off $PATH, per version


def find_binary(name: str, install: str, path: str | None = None) -> str:
    """The absolute path of executable `name`, or a `StackError` saying how to install it."""
    found = shutil.which(name, path=path)
    if found is None:
        where = "$PATH" if path is None else repr(path)
        raise StackError(f"{name} not found on {where}; install it with `{install}`")
    return found


def find_java(path: str | None = None) -> str:
    """`$JAVA_HOME/bin/java` when `JAVA_HOME` is set and `path` is not given, else `java`."""
    java_home = os.environ.get("JAVA_HOME")
    if path is None and java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return find_binary("java", JAVA_INSTALL, path)


KAFKA_VERSION = "4.2.0"  # the pinned broker: deploy/kafka/pom.xml and deploy/compose match it
ENV_KAFKA_LIBS = "KSPOUT_KAFKA_LIBS"  # where setup put the jars, when not the default cache


def kafka_libs() -> Path:
    """The folder of the pinned Kafka release's jars: `$KSPOUT_KAFKA_LIBS`, else
    `$XDG_CACHE_HOME/kspout/kafka-<version>` (`~/.cache` when unset), as `deploy/setup.sh`
    fills it."""
    chosen = os.environ.get(ENV_KAFKA_LIBS)
    if chosen:
        return Path(chosen)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "kspout" / f"kafka-{KAFKA_VERSION}"


def kafka_classpath() -> str:
    """A `-cp` value covering the Kafka cache, or a `StackError` naming the setup command.

    The cache is complete once setup wrote its `.complete` marker; nothing is fetched here."""
    libs = kafka_libs()
    if not (libs / ".complete").is_file() or not any(libs.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise StackError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {libs}; run `{SETUP}` from the "
            f"kspout checkout (it resolves them from Maven Central once), or point "
            f"{ENV_KAFKA_LIBS} at a folder that holds them"
        )
    return f"{libs}{os.sep}*"


def zookeeper_classpath() -> str:
    """A `-cp` value covering pyspark's jars directory, which ships ZooKeeper's server.

    Found through the import system without importing pyspark (that would start nothing, but
    costs time and memory).
    """
    spec = importlib.util.find_spec("pyspark")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        jars = Path(location) / "jars"
        if any(jars.glob("zookeeper-*.jar")):
            return f"{jars}{os.sep}*"
    raise StackError(
        f"ZooKeeper's jars were not found in the pyspark package; install it with "
        f"`{PYSPARK_INSTALL}`"
    )


def find_postgres_bin(path: str | None = None) -> Path:
    """The directory of PostgreSQL's `initdb` and `postgres`: found on `path` (the real `$PATH`
    when None), else Debian's newest `/usr/lib/postgresql/<version>/bin` when `path` is None."""
    found = shutil.which("initdb", path=path)
    if found is not None:
        return Path(found).resolve().parent  # through a symlink, to the dir that has `postgres`
    if path is None:
        versions = sorted(
            Path(DEBIAN_POSTGRES).glob("*/bin/initdb"),
            key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else -1,
        )
        if versions:
            return versions[-1].parent
    where = "$PATH" if path is None else repr(path)
    raise StackError(
        f"initdb not found on {where} or in {DEBIAN_POSTGRES}/*/bin; install PostgreSQL's server "
        f"with `{POSTGRES_INSTALL}`"
    )

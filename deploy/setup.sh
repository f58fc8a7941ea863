#!/usr/bin/env bash
# Set up a development machine from nothing: system packages the embedded stack needs
# (Java for Kafka and ZooKeeper, Maven to fetch Kafka's jars, redis-server, PostgreSQL), a
# virtualenv in .venv, kspout with its dev extras, and Apache Kafka's broker jars in kspout's
# Kafka cache (deploy/kafka/pom.xml pins the release), and Spark's Kafka source for the benchmark.
# Safe to run again: every step checks before it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v redis-server >/dev/null || missing+=(redis-server)
# PostgreSQL's server, for the fenced SQL sink's tests; Debian keeps initdb off $PATH
command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null \
    || missing+=(postgresql)
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "setup: please install ${missing[*]} (no apt-get on this machine)" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]} with apt-get" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ "${java_major:-0}" -lt 17 ]; then
    echo "setup: Java ${java_major:-?} found; Spark and ZooKeeper here need Java 17+" \
         "(apt-get install -y openjdk-17-jre-headless)" >&2
    exit 1
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "setup: Python 3.11+ is required ($("$PYTHON" --version))" >&2; exit 1; }
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'

# Apache Kafka's broker, from Maven Central into the cache the dev stack and the tests start it
# from; nothing is downloaded at test time. A finished copy leaves a marker, so a half copy
# (an interrupted run) is made again.
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' deploy/kafka/pom.xml)
kafka_libs="${KSPOUT_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/kspout/kafka-$kafka_version}"
if [ ! -f "$kafka_libs/.complete" ]; then
    echo "setup: resolving Apache Kafka $kafka_version's jars into $kafka_libs" >&2
    rm -rf "$kafka_libs"
    mvn -B -q -Dstyle.color=never -f deploy/kafka/pom.xml \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$kafka_libs"
    compgen -G "$kafka_libs/kafka_2.13-$kafka_version.jar" >/dev/null || {
        echo "setup: Maven copied no kafka_2.13-$kafka_version.jar into $kafka_libs" >&2; exit 1; }
    touch "$kafka_libs/.complete"
fi

# Spark's own Kafka source (the connector matching the installed pyspark), for the benchmark
# beside it (bench.bench_vs_spark); the same marker guards against a half copy.
spark_version=$(.venv/bin/python -c 'import pyspark; print(pyspark.__version__)')
connector="${KSPOUT_SPARK_KAFKA_JARS:-${XDG_CACHE_HOME:-$HOME/.cache}/kspout/spark-kafka-$spark_version}"
if [ ! -f "$connector/.complete" ]; then
    echo "setup: resolving Spark $spark_version's Kafka source into $connector" >&2
    rm -rf "$connector"
    mvn -B -q -Dstyle.color=never -f deploy/spark-kafka/pom.xml \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$connector" -Dspark.version="$spark_version"
    compgen -G "$connector/spark-sql-kafka-0-10_2.13-$spark_version.jar" >/dev/null || {
        echo "setup: Maven copied no spark-sql-kafka-0-10_2.13-$spark_version.jar" >&2; exit 1; }
    touch "$connector/.complete"
fi
echo "setup: ready (.venv/bin/kspout, .venv/bin/pytest; Kafka $kafka_version in $kafka_libs)" >&2

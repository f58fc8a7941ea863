#!/usr/bin/env bash
# Set up a development machine from nothing: system packages the embedded stack needs
# (Java for ZooKeeper, redis-server, PostgreSQL), a virtualenv in .venv, and kspout with its
# dev extras.
# Safe to run again: every step checks before it installs.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

missing=()
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
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
echo "setup: ready (.venv/bin/kspout, .venv/bin/pytest)" >&2

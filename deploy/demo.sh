#!/usr/bin/env bash
# Set up (see setup.sh) and run the demo job on the embedded stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
exec .venv/bin/kspout demo "$@"

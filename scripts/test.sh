#!/usr/bin/env bash
# The test command: set up (idempotent), build the engine with bounds checks
# on, and run the whole suite.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
ZEROLAKE_BOUNDSCHECK=1 scripts/setup.sh --test
export PATH="$PATH:/usr/games"
exec .venv/bin/python -m pytest "$@"

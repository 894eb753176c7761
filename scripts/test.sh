#!/usr/bin/env bash
# The test command: set up (idempotent), build the engine with bounds checks
# on, and run the whole suite.  Extra arguments go to pytest.
#
# The suite runs in ZEROLAKE_TEST_WORKERS processes (pytest-xdist; default 2):
# most tests keep one core busy (a GNU Go game, a Beam job, a child role), so
# two processes on two cores finish in a little over half the time.  Each
# test file runs whole in one process (--dist loadfile), so a module's
# fixtures (a GNU Go process, a trained model) are made once.  Pass `-n 0` to
# run in this process (e.g. to use a debugger).
set -euo pipefail
cd "$(dirname "$0")/.."
ZEROLAKE_BOUNDSCHECK=1 scripts/setup.sh --test
export PATH="$PATH:/usr/games"
exec .venv/bin/python -m pytest -n "${ZEROLAKE_TEST_WORKERS:-2}" --dist loadfile "$@"

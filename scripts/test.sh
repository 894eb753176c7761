#!/usr/bin/env bash
# The test command: set up (idempotent), build the engine with bounds checks
# on, and run the whole suite (CI's command, through .ci/run).  Extra
# arguments go to pytest.
#
#   scripts/test.sh            the whole suite: before a commit goes to main
#   scripts/test.sh --quick    the quick tier, every package's fast tests (a
#                              minute or two): while working on a change
#
# --quick leaves out the tests marked slow (pytest -m "not slow"); which ones
# those are is listed in one place, tests/conftest.py (SLOW).
#
# The suite runs in ZEROLAKE_TEST_WORKERS processes (pytest-xdist; default 2):
# most tests keep one core busy (a GNU Go game, a Beam job, a child role), so
# two processes on two cores finish in a little over half the time.  Each
# test file runs whole in one process (--dist loadfile), so a module's
# fixtures (a GNU Go process, a trained model) are made once.  Pass `-n 0` to
# run in this process (e.g. to use a debugger).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for arg in "$@"; do
    if [[ $arg == --quick ]]; then
        args+=(-m "not slow")
    else
        args+=("$arg")
    fi
done
ZEROLAKE_BOUNDSCHECK=1 scripts/setup.sh --test
export PATH="$PATH:/usr/games"
exec .venv/bin/python -m pytest -n "${ZEROLAKE_TEST_WORKERS:-2}" --dist loadfile "${args[@]}"

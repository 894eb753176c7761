#!/usr/bin/env bash
# Set up a fresh machine for zerolake: Debian packages, a virtual environment
# in .venv, and the package itself with its Cython extensions compiled.
#
#   scripts/setup.sh          # what running the system needs
#   scripts/setup.sh --test   # plus the test tools (pytest, GCS emulators, GNU Go)
#
# Safe to rerun: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

WANT_TEST=0
[[ "${1:-}" == "--test" ]] && WANT_TEST=1

SUDO=""
if [[ "$(id -u)" != "0" ]] && command -v sudo >/dev/null; then SUDO="sudo"; fi

# GNU Go is the rules referee for the engine's cross-check tests and the
# opponent for `selfplay.match`.  Debian installs it under /usr/games.
if [[ $WANT_TEST == 1 ]] && ! command -v gnugo >/dev/null && [[ ! -x /usr/games/gnugo ]]; then
    echo "[setup] installing gnugo from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gnugo >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if [[ ! -x .venv/bin/python ]]; then
    echo "[setup] creating .venv"
    "$PYTHON" -m venv .venv
fi
VPY=.venv/bin/python
if ! $VPY -c "import Cython, numpy, setuptools" 2>/dev/null; then
    $VPY -m pip install -q --upgrade pip
    $VPY -m pip install -q "setuptools>=68" wheel "Cython>=3.0" "numpy>=1.26"
fi

EXTRAS=""
[[ $WANT_TEST == 1 ]] && EXTRAS="[test]"
echo "[setup] installing zerolake${EXTRAS} (compiles the Cython extensions)"
# --no-build-isolation: build against the venv's own Cython and numpy rather
# than downloading a second copy into a throwaway build environment.
$VPY -m pip install -q --no-build-isolation -e ".${EXTRAS}"
echo "[setup] done: $($VPY --version), extensions built in $(if [[ "${ZEROLAKE_BOUNDSCHECK:-0}" == 1 ]]; then echo bounds-checked; else echo fast; fi) mode"

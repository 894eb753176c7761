#!/usr/bin/env bash
# Set up a fresh machine for zerolake: Debian packages, a virtual environment
# in .venv, and the package itself with its Cython extensions compiled.
#
#   scripts/setup.sh          # what running the system needs
#   scripts/setup.sh --test   # plus the test tools (pytest, GCS emulators, GNU Go, linters, Chromium)
#   scripts/setup.sh --gnugo  # plus GNU Go alone (a long run's closing games play it)
#   scripts/setup.sh --accelerator gpu   # TensorFlow for NVIDIA GPUs (CUDA from pip)
#   scripts/setup.sh --accelerator tpu   # TensorFlow 2.20 for a Cloud TPU VM
#
# --accelerator cpu|gpu|tpu (or ZEROLAKE_ACCELERATOR; default cpu) picks the
# TensorFlow distribution: tensorflow-cpu, tensorflow[and-cuda] or
# tensorflow-tpu.  setup.py reads the same variable (why: see there).
#
# Safe to rerun: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

WANT_TEST=0
WANT_GNUGO=0
ACCELERATOR="${ZEROLAKE_ACCELERATOR:-cpu}"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --test) WANT_TEST=1; WANT_GNUGO=1 ;;
        --gnugo) WANT_GNUGO=1 ;;
        --accelerator) ACCELERATOR="${2:-}"; shift ;;
        --accelerator=*) ACCELERATOR="${1#*=}" ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "scripts/setup.sh: unknown argument $1 (use --test, --gnugo, --accelerator cpu|gpu|tpu)" >&2; exit 2 ;;
    esac
    shift
done
case "$ACCELERATOR" in
    cpu) TF_DIST=tensorflow-cpu ;;
    gpu) TF_DIST=tensorflow ;;
    tpu) TF_DIST=tensorflow-tpu ;;
    *) echo "scripts/setup.sh: --accelerator must be cpu, gpu or tpu, not '$ACCELERATOR'" >&2; exit 2 ;;
esac
export ZEROLAKE_ACCELERATOR="$ACCELERATOR"

SUDO=""
if [[ "$(id -u)" != "0" ]] && command -v sudo >/dev/null; then SUDO="sudo"; fi

# GNU Go is the rules referee for the engine's cross-check tests and the
# opponent for `arena.match`.  Debian installs it under /usr/games.
if [[ $WANT_GNUGO == 1 ]] && ! command -v gnugo >/dev/null && [[ ! -x /usr/games/gnugo ]]; then
    echo "[setup] installing gnugo from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gnugo >/dev/null
fi

# Leela Zero is the peer that bench/selfplay.py measures beside the worker (and
# tests/bench/test_selfplay.py runs it once on the weights the bench writes).
# Debian installs the binary under /usr/lib/leelaz/bin.
if [[ $WANT_TEST == 1 ]] && [[ ! -x /usr/lib/leelaz/bin/leelaz ]]; then
    echo "[setup] installing leela-zero from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq leela-zero >/dev/null
fi

# strace, unshare (util-linux) and ip (iproute2): tests/system/test_no_telemetry.py runs
# each role in a network namespace with only loopback, under strace, and fails on
# any connection attempt (child processes and native code included).
if [[ $WANT_TEST == 1 ]] && ! { command -v strace && command -v unshare && command -v ip; } >/dev/null; then
    echo "[setup] installing strace, util-linux and iproute2 from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq strace util-linux iproute2 >/dev/null
fi

# ShellCheck: tests/system/test_lint.py lints every shell script and the deployment's
# generated plans with it (hadolint, for the Dockerfiles, comes from PyPI with
# the test extra).
if [[ $WANT_TEST == 1 ]] && ! command -v shellcheck >/dev/null; then
    echo "[setup] installing shellcheck from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq shellcheck >/dev/null
fi

# Chromium's headless shell: tests/arena/test_run_page.py renders the page `python -m arena.run_page`
# writes, reads its numbers back with --dump-dom and leaves a screenshot.
if [[ $WANT_TEST == 1 ]] && ! command -v chromium-headless-shell >/dev/null && ! command -v chromium >/dev/null; then
    echo "[setup] installing chromium-headless-shell from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium-headless-shell >/dev/null
fi

# Debian's Lizzie (a JRE with it) on a virtual display: tests/arena/test_lizzie.py runs
# scripts/check_lizzie.sh, the real GUI analysing a network through `python -m arena.gtp`.
if [[ $WANT_TEST == 1 ]] && { [[ ! -f /usr/share/java/lizzie.jar ]] || ! command -v Xvfb >/dev/null \
        || ! command -v xdotool >/dev/null || ! command -v import >/dev/null; }; then
    echo "[setup] installing Lizzie, a JRE, Xvfb, xdotool and imagemagick from Debian"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq liblizzie-java default-jre xvfb xdotool \
        imagemagick >/dev/null
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

# The TensorFlow distributions all install the `tensorflow` package, and pip
# does not know they conflict: when switching accelerator, remove the others
# first, or the new one would be installed over the old one's files.
OTHER_TF_LINES=$($VPY - "$TF_DIST" <<'EOF'
import importlib.metadata as metadata, sys
for name in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu"):
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        continue
    if name != sys.argv[1]:
        print(name)
EOF
)
read -r -d '' -a OTHER_TF <<< "$OTHER_TF_LINES" || true   # one name a line -> an array (read ends at EOF: status 1)
if [[ ${#OTHER_TF[@]} -gt 0 ]]; then
    echo "[setup] removing ${OTHER_TF[*]} to install $TF_DIST (--accelerator $ACCELERATOR)"
    $VPY -m pip uninstall -y -q "${OTHER_TF[@]}"
fi

EXTRAS=""
[[ $WANT_TEST == 1 ]] && EXTRAS="[test]"
echo "[setup] installing zerolake${EXTRAS} for $ACCELERATOR (compiles the Cython extensions)"
# --no-build-isolation: build against the venv's own Cython and numpy rather
# than downloading a second copy into a throwaway build environment.
$VPY -m pip install -q --no-build-isolation -e ".${EXTRAS}"
echo "[setup] done: $($VPY --version), extensions built in $(if [[ "${ZEROLAKE_BOUNDSCHECK:-0}" == 1 ]]; then echo bounds-checked; else echo fast; fi) mode"
if [[ $ACCELERATOR == tpu ]]; then
    # tensorflow-tpu on the PJRT runtime sees the TPU only with its environment set before import
    # (docs/accelerators.md); the values come from the one table in operations/deploy/zones.py.
    echo "[setup] on this TPU VM, before running zerolake: export \$(.venv/bin/python -m operations.deploy.zones environment GENERATION | xargs)   # GENERATION: v2 v3 v4 v5litepod v5p v6e"
fi

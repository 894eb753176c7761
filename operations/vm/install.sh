#!/usr/bin/env bash
# Install zerolake into a virtual environment: the one install script, called by
# the VMs' start-up script (operations/vm/startup.sh) and by the Dockerfile.
#
#   install.sh --accelerator cpu|gpu|tpu --package SDIST_OR_SOURCE_DIR [--prefix /opt/zerolake] [--system]
#
# --system installs into $PYTHON's own environment instead of PREFIX/venv: for
# an image whose interpreter is the one that must import zerolake (Beam's SDK
# image, which the Dataflow image operations/dataflow/Dockerfile builds on).
#
# Steps: Debian/Ubuntu build packages (python3-venv, python3-dev, a C
# compiler: the Cython extensions are compiled here) -> PREFIX/venv ->
# the build tools -> the package, with the TensorFlow of the accelerator
# (setup.py reads ZEROLAKE_ACCELERATOR: tensorflow-cpu, tensorflow[and-cuda],
# or tensorflow-tpu 2.20) and every version pinned by operations/vm/constraints.txt.
# ZEROLAKE_SKIP_APT=1 skips the apt step (an image that has the packages).
# Safe to rerun.
set -euo pipefail

ACCELERATOR=cpu
PACKAGE=""
PREFIX=/opt/zerolake
SYSTEM=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --accelerator) ACCELERATOR="${2:-}"; shift ;;
        --package) PACKAGE="${2:-}"; shift ;;
        --prefix) PREFIX="${2:-}"; shift ;;
        --system) SYSTEM=1 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$ACCELERATOR" in
    cpu|gpu|tpu) ;;
    *) echo "install.sh: --accelerator must be cpu, gpu or tpu, not '$ACCELERATOR'" >&2; exit 2 ;;
esac
if [[ -z "$PACKAGE" || ! -e "$PACKAGE" ]]; then
    echo "install.sh: --package '$PACKAGE' is not a file or folder (the zerolake sdist or source tree)" >&2
    exit 2
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
CONSTRAINTS="$HERE/constraints.txt"

log() { echo "[install $(date +%H:%M:%S)] $*"; }

if [[ "${ZEROLAKE_SKIP_APT:-0}" != 1 ]] && command -v apt-get >/dev/null; then
    # --system: the interpreter and its headers are the image's own; only the compiler is missing.
    packages=(build-essential ca-certificates)
    (( SYSTEM )) || packages+=(python3 python3-venv python3-dev)
    log "Debian packages: ${packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if (( SYSTEM )); then
    TARGET="$(command -v "$PYTHON")"
    log "into $TARGET's own environment ($($PYTHON --version))"
elif [[ ! -x "$PREFIX/venv/bin/python" ]]; then
    log "virtual environment $PREFIX/venv ($($PYTHON --version))"
    mkdir -p "$PREFIX"
    "$PYTHON" -m venv "$PREFIX/venv"
fi
(( SYSTEM )) || TARGET="$PREFIX/venv/bin/python"
PIP=("$TARGET" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q -c "$CONSTRAINTS" --upgrade pip setuptools wheel Cython numpy

# Another accelerator's TensorFlow installs the same `tensorflow` package
# (see setup.py): remove it before switching.
case "$ACCELERATOR" in cpu) want=tensorflow-cpu ;; gpu) want=tensorflow ;; tpu) want=tensorflow-tpu ;; esac
for other in tensorflow tensorflow-cpu tensorflow-tpu; do
    if [[ $other != "$want" ]] && "${PIP[@]}" show -q "$other" >/dev/null 2>&1; then
        "${PIP[@]}" uninstall -y -q "$other"
    fi
done

log "zerolake for $ACCELERATOR from $PACKAGE (compiles the Cython extensions)"
# On a TPU VM, Google's libtpu index is a source beside PyPI, as Google's TensorFlow TPU tests install
# tensorflow-tpu (operations/deploy/zones.py, TF_INSTALL_SOURCE); the pins in setup.py still decide the versions.
sources=()
[[ "$ACCELERATOR" == tpu ]] && sources=(--find-links https://storage.googleapis.com/libtpu-tf-releases/index.html)
# --no-build-isolation: build against the venv's pinned Cython and numpy.
ZEROLAKE_ACCELERATOR="$ACCELERATOR" "${PIP[@]}" install -q --no-build-isolation -c "$CONSTRAINTS" "${sources[@]}" "$PACKAGE"
"$TARGET" -c "import engine.board, pipeline.shuffle, model.train" \
    || { echo "install.sh: the installed package does not import" >&2; exit 1; }
log "done: $("$TARGET" -c 'import tensorflow as tf; print("tensorflow", tf.__version__)' 2>/dev/null)"

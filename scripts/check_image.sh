#!/usr/bin/env bash
# Check the Docker image's two stages (./Dockerfile) in chroots, as far as this machine allows.
#
#   scripts/check_image.sh [WORKDIR]      (as root; ~8 minutes the first time)
#
# No container engine runs here and no registry serves python:3.11-slim-bookworm,
# so the stages are rebuilt from a Debian 12 base that debootstrap makes, with
# Debian's own Python 3.11 (/usr/bin/python3) standing in for the image's
# /usr/local/bin/python3 (the same minor version and Debian release):
#
# 1. base:  debootstrap --variant=minbase bookworm, plus python3, python3-venv
#           and ca-certificates, apt lists removed (what the slim image holds);
# 2. build: a copy of base; the checkout's tracked files in /opt/zerolake/src
#           (the Dockerfile's COPY); operations/vm/install.sh --accelerator cpu
#           --package /opt/zerolake/src --prefix /opt/zerolake (its RUN),
#           which adds the compiler and headers, builds the Cython engine and
#           installs the pinned packages into /opt/zerolake/venv;
# 3. final: a fresh copy of base; /opt/zerolake taken from build (COPY
#           --from=build); the user zerolake made as the Dockerfile makes it;
# 4. checks on final: no compiler, no apt lists, no pip cache; the code
#           belongs to root and cannot be changed by the role's user; the
#           worker role, run as that user through operations/vm/run-role.sh (the
#           ENTRYPOINT) with its state in /var/lib/zerolake (the VOLUME),
#           plays games into a local lake whose chunks `format.inspect verify`
#           accepts, and writes nothing outside the volume.
# Prints one JSON line at the end: {"check": "image", "ok": ..., sizes, timings}.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/zerolake-image-check}"
VPY="$REPO/.venv/bin/python"
BASE="$WORK/base" BUILD="$WORK/build" FINAL="$WORK/final"
mkdir -p "$WORK"
[[ "$(id -u)" == 0 ]] || { echo "check_image.sh: run as root (debootstrap, chroot)" >&2; exit 2; }
log() { echo "[image-check $(date +%H:%M:%S)] $*"; }
t0=$(date +%s)
MOUNTED=()
mount_system() {   # proc, sys and dev inside a root, unmounted on exit
    for fs in proc sys dev; do
        mountpoint -q "$1/$fs" || { mount --bind "/$fs" "$1/$fs"; MOUNTED+=("$1/$fs"); }
    done
}
cleanup() {
    local i
    for (( i=${#MOUNTED[@]}-1; i>=0; i-- )); do umount -l "${MOUNTED[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
in_root() {   # in_root ROOT COMMAND...: run a command in a root with a clean environment
    local root="$1"; shift
    chroot "$root" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 PIP_CONFIG_FILE=/etc/pip.conf PIP_CERT=/etc/zerolake-check/ca-bundle.crt "$@"
}

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [[ ! -x "$BASE/usr/bin/python3" ]]; then
    log "base: debootstrap --variant=minbase bookworm, then Debian's python3"
    rm -rf "$BASE"
    debootstrap --variant=minbase bookworm "$BASE" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log"; exit 1; }
    cp /etc/resolv.conf "$BASE/etc/resolv.conf"
    mkdir -p "$BASE/etc/zerolake-check"
    # The host's CA bundle and pip settings, so that the build reaches the same package index
    # the host does (as scripts/check_vm_startup.sh does for its root).
    cp /etc/ssl/certs/ca-certificates.crt "$BASE/etc/zerolake-check/ca-bundle.crt"
    [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$BASE/etc/pip.conf"
    mount_system "$BASE"
    in_root "$BASE" bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
        apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates >/dev/null && \
        rm -rf /var/lib/apt/lists/*"
    cleanup; MOUNTED=()
fi
t_base=$(date +%s)

log "build: the checkout's tracked files into /opt/zerolake/src, then operations/vm/install.sh (the Dockerfile's RUN)"
rm -rf "$BUILD" && cp -a "$BASE" "$BUILD"
mkdir -p "$BUILD/opt/zerolake/src"
(cd "$REPO" && git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$BUILD/opt/zerolake/src")
mount_system "$BUILD"
set +e
in_root "$BUILD" bash -c "PYTHON=/usr/bin/python3 /opt/zerolake/src/operations/vm/install.sh --accelerator cpu \
    --package /opt/zerolake/src --prefix /opt/zerolake && rm -rf /root/.cache/pip" > "$WORK/build.log" 2>&1
build_status=$?
set -e
tail -5 "$WORK/build.log"
cleanup; MOUNTED=()
[[ $build_status == 0 ]] || { echo "{\"check\": \"image\", \"ok\": false, \"build_exit\": $build_status}"; exit 1; }
t_build=$(date +%s)

log "final: a fresh base, /opt/zerolake from build, the user zerolake (COPY --from=build, RUN useradd)"
rm -rf "$FINAL" && cp -a "$BASE" "$FINAL"
cp -a "$BUILD/opt/zerolake" "$FINAL/opt/zerolake"
in_root "$FINAL" useradd --system --uid 10001 --user-group --home-dir /var/lib/zerolake --create-home zerolake
mount_system "$FINAL"
compiler=false; apt_lists=false; pip_cache=false; code_writable=false
in_root "$FINAL" sh -c 'command -v gcc || command -v cc' >/dev/null && compiler=true
[[ -n "$(find "$FINAL/var/lib/apt/lists" -mindepth 1 -maxdepth 1 ! -name partial -print -quit 2>/dev/null || true)" ]] \
    && apt_lists=true
[[ -d "$FINAL/root/.cache/pip" ]] && pip_cache=true
in_root "$FINAL" setpriv --reuid=10001 --regid=10001 --clear-groups touch /opt/zerolake/src/probe 2>/dev/null \
    && code_writable=true
touch "$WORK/marker"
log "running the worker role as zerolake through run-role.sh, state in the volume /var/lib/zerolake"
set +e
in_root "$FINAL" setpriv --reuid=10001 --regid=10001 --clear-groups /usr/bin/env HOME=/var/lib/zerolake \
    PYTHONDONTWRITEBYTECODE=1 \
    ZEROLAKE_PREFIX=/opt/zerolake ZEROLAKE_STATE=/var/lib/zerolake ZEROLAKE_ACCELERATOR=cpu \
    ZEROLAKE_ROOT=/var/lib/zerolake/lake \
    ZEROLAKE_ARGS="--max-games 6 --games 6 --visits 4 --fast-visits 2 --chunk-games 3 --board-size 9" \
    /opt/zerolake/src/operations/vm/run-role.sh worker 0 > "$WORK/worker.log" 2>&1
worker_status=$?
set -e
grep -v '"schema": "zerolake.event"' "$WORK/worker.log" | tail -5
t_done=$(date +%s)
# What the role wrote outside the volume (and /tmp): nothing, in an image whose code is read-only to it.
outside=$(cd "$FINAL" && find . -xdev -newer "$WORK/marker" -type f \
    -not -path "./var/lib/zerolake/*" -not -path "./tmp/*" -not -path "./proc/*" -not -path "./sys/*" \
    -not -path "./dev/*" | head -5 | tr '\n' ' ')
set +e
verify=$(cd "$REPO" && "$VPY" -m format.inspect verify "$FINAL/var/lib/zerolake/lake" 2>&1)
verify_status=$?
set -e
echo "$verify" | tail -3
chunks=$(find "$FINAL/var/lib/zerolake/lake/games" -name '*.tfrecord.zst' 2>/dev/null | wc -l)
size_mb=$(du -sm "$FINAL/opt/zerolake" | cut -f1)
ok=false
[[ $worker_status == 0 && $verify_status == 0 && $chunks -gt 0 && $compiler == false && $apt_lists == false \
   && $pip_cache == false && $code_writable == false && -z "$outside" ]] && ok=true
echo "{\"check\": \"image\", \"ok\": $ok, \"build_exit\": $build_status, \"worker_exit\": $worker_status," \
     "\"verify_exit\": $verify_status, \"chunks\": $chunks, \"compiler_in_final\": $compiler," \
     "\"apt_lists_in_final\": $apt_lists, \"pip_cache_in_final\": $pip_cache," \
     "\"code_writable_by_role\": $code_writable, \"written_outside_volume\": \"$outside\"," \
     "\"opt_zerolake_mb\": $size_mb, \"base_s\": $((t_base - t0)), \"build_s\": $((t_build - t_base))," \
     "\"final_s\": $((t_done - t_build))}"
$ok

#!/usr/bin/env bash
# Check the worker VM start-up script on a fresh Debian, as far as this machine allows.
#
#   scripts/check_vm_startup.sh [WORKDIR]      (as root; ~10 minutes the first time)
#
# 1. debootstrap --variant=minbase bookworm: a fresh, minimal Debian 12 root
#    (the debian-12 image family of the CPU VMs; reused if WORKDIR has one);
# 2. copy in what a real VM image carries itself: the CA bundle, /etc/pip.conf
#    (this workplace's package registry) and resolv.conf;
# 3. build the sdist from this checkout, start fake-gcs-server on 127.0.0.1
#    (tests/gcs_emulators.py) and upload the sdist to it, as the deploy plan
#    uploads it to the bucket, but only UPLOAD_DELAY_S (20) seconds after the
#    start-up script has begun: its first download fails, as one does on a
#    real VM whose network or bucket is not ready, and it must try again
#    rather than leave the VM idle;
# 4. run operations/vm/startup.sh inside `chroot` as the worker role, with its
#    settings in ZEROLAKE_* variables instead of instance metadata and
#    ZEROLAKE_FOREGROUND=1 (systemd does not run in a chroot), bounded by
#    --max-games; it installs everything (apt, pip, TensorFlow, the Cython
#    build) and plays;
# 5. verify the chunks in the emulator bucket with `format.inspect verify`.
# Prints one JSON line at the end: {"check": "vm_startup", "ok": ..., timings,
# "install_failures": N}; ok needs N >= 1 failed try, then chunks that verify.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/zerolake-vm-check}"
ROOTFS="$WORK/rootfs"
VPY="$REPO/.venv/bin/python"
mkdir -p "$WORK"
[[ "$(id -u)" == 0 ]] || { echo "check_vm_startup.sh: run as root (debootstrap, chroot)" >&2; exit 2; }
log() { echo "[vm-check $(date +%H:%M:%S)] $*"; }
t0=$(date +%s)

if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [[ ! -x "$ROOTFS/usr/bin/apt-get" ]]; then
    log "debootstrap --variant=minbase bookworm $ROOTFS"
    rm -rf "$ROOTFS"
    debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log"; exit 1; }
fi
t_root=$(date +%s)
mkdir -p "$ROOTFS/etc/ssl/certs" "$ROOTFS/etc/zerolake-check"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
# startup.sh installs Debian's ca-certificates, which rewrites that bundle from
# Debian's own list; pip keeps using this machine's bundle (PIP_CERT below).
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/zerolake-check/ca-bundle.crt"
[[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$ROOTFS/etc/pip.conf"
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
for fs in proc sys dev; do
    mountpoint -q "$ROOTFS/$fs" || mount --bind "/$fs" "$ROOTFS/$fs"
done
EMULATOR_PID=""
cleanup() {
    [[ -n "$EMULATOR_PID" ]] && kill "$EMULATOR_PID" 2>/dev/null && wait "$EMULATOR_PID" 2>/dev/null
    for fs in dev sys proc; do mountpoint -q "$ROOTFS/$fs" && umount -l "$ROOTFS/$fs"; done
    return 0
}
trap cleanup EXIT

log "building the sdist"
rm -rf "$WORK/dist" && "$VPY" - "$REPO" "$WORK/dist" <<'PY'
import pathlib, shutil, subprocess, sys, tempfile
repo, dist = pathlib.Path(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:   # a copy, so the checkout's build/ is left alone
    copy = pathlib.Path(tmp) / "src"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.so", "*.egg-info",
                                                              "__pycache__", "lake", "cluster-state"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist], cwd=copy, check=True,
                   stdout=subprocess.DEVNULL)
PY
SDIST=$(ls "$WORK"/dist/zerolake-*.tar.gz)

UPLOAD_DELAY_S=20
log "starting fake-gcs-server on 127.0.0.1; the sdist goes up ${UPLOAD_DELAY_S}s later"
rm -f "$WORK/emulator.json"
(cd "$REPO" && exec "$VPY" - "$WORK" "$SDIST" "$UPLOAD_DELAY_S" <<'PY'
import json, pathlib, signal, sys, threading
from tests.gcs_emulators import running_emulator
work, sdist, delay = pathlib.Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
with running_emulator("fake-gcs-server", work / "emulator") as server:
    (work / "emulator.json").write_text(json.dumps({**server.env, "BUCKET": server.bucket}))
    if not stop.wait(delay):
        server.client().bucket(server.bucket).blob("zerolake-deploy/check/zerolake.tar.gz").upload_from_filename(sdist)
        print(f"[vm-check] the sdist is in the bucket now, {delay:.0f}s after the start", flush=True)
    stop.wait()
PY
) &
EMULATOR_PID=$!
for _ in $(seq 100); do [[ -s "$WORK/emulator.json" ]] && break; sleep 0.2; done
[[ -s "$WORK/emulator.json" ]] || { echo "check_vm_startup.sh: the emulator did not start" >&2; exit 1; }
field() { "$VPY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$WORK/emulator.json" "$1"; }
BUCKET=$(field BUCKET)
ENDPOINT=$(field STORAGE_EMULATOR_HOST)
cp "$(field GOOGLE_APPLICATION_CREDENTIALS)" "$ROOTFS/etc/zerolake-check/sa.json"
LAKE="gs://$BUCKET/vm-check-$(date +%s)"
cp "$REPO/operations/vm/startup.sh" "$ROOTFS/startup.sh"

log "running startup.sh in the chroot (worker, foreground, 8 games)"
t_start=$(date +%s)
set +e
chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LANG=C.UTF-8 PIP_CONFIG_FILE=/etc/pip.conf PIP_CERT=/etc/zerolake-check/ca-bundle.crt \
    STORAGE_EMULATOR_HOST="$ENDPOINT" GOOGLE_CLOUD_PROJECT=zerolake-test \
    GOOGLE_APPLICATION_CREDENTIALS=/etc/zerolake-check/sa.json \
    ZEROLAKE_ROLE=worker ZEROLAKE_ROOT="$LAKE" ZEROLAKE_ACCELERATOR=cpu ZEROLAKE_PROCESSES=1 \
    ZEROLAKE_PACKAGE="gs://$BUCKET/zerolake-deploy/check/zerolake.tar.gz" ZEROLAKE_FOREGROUND=1 \
    ZEROLAKE_RELEASE_SHA256="$(sha256sum "$SDIST" | cut -d' ' -f1)" \
    ZEROLAKE_INSTALL_RETRY_SECONDS=5 \
    ZEROLAKE_ARGS="--max-games 8 --games 8 --visits 4 --fast-visits 2 --chunk-games 4 --board-size 9" \
    bash /startup.sh > "$WORK/startup.log" 2>&1
status=$?
set -e
grep -v '"schema": "zerolake.event"' "$WORK/startup.log" | grep -m3 -B1 "installing the package failed" || true
grep -v '"schema": "zerolake.event"' "$WORK/startup.log" | tail -25
install_failures=$(grep -c "installing the package failed" "$WORK/startup.log" || true)
t_done=$(date +%s)

log "verifying the chunks in $LAKE"
set +e
verify=$(cd "$REPO" && STORAGE_EMULATOR_HOST="$ENDPOINT" GOOGLE_CLOUD_PROJECT=zerolake-test \
    GOOGLE_APPLICATION_CREDENTIALS="$(field GOOGLE_APPLICATION_CREDENTIALS)" \
    "$VPY" -m format.inspect verify "$LAKE" 2>&1)
verify_status=$?
set -e
echo "$verify" | tail -5
chunks=$(cd "$REPO" && STORAGE_EMULATOR_HOST="$ENDPOINT" "$VPY" - "$LAKE" <<'PY'
import sys
from cloud.storage import open_storage
from format import layout
storage = open_storage(sys.argv[1])
print(sum(1 for i in storage.list(layout.games_prefix()) if layout.parse_chunk_path(i.path)))
PY
)
ok=false
[[ $status == 0 && $verify_status == 0 && $chunks -gt 0 && $install_failures -ge 1 ]] && ok=true
echo "{\"check\": \"vm_startup\", \"ok\": $ok, \"startup_exit\": $status, \"verify_exit\": $verify_status, \"chunks\": $chunks, \"install_failures\": $install_failures, \"debootstrap_s\": $((t_root - t0)), \"startup_s\": $((t_done - t_start)), \"total_s\": $((t_done - t0))}"
$ok

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
# shellcheck source=scripts/vm_check_lib.sh
source "$REPO/scripts/vm_check_lib.sh"
log() { vm_log "$@"; }
t0=$(date +%s)

vm_root "$ROOTFS" "$WORK/debootstrap.log"
t_root=$(date +%s)
vm_host_config "$ROOTFS"
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
SDIST=$(vm_sdist "$WORK/dist")

UPLOAD_DELAY_S=20
log "starting fake-gcs-server on 127.0.0.1; the sdist goes up ${UPLOAD_DELAY_S}s later"
vm_emulator "$WORK" "$SDIST" zerolake-deploy/check/zerolake.tar.gz "$UPLOAD_DELAY_S"
field() { vm_field "$WORK" "$1"; }
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
vm_verify "$WORK" "$LAKE"
verify_status=$VERIFY_STATUS
chunks=$CHUNKS
ok=false
[[ $status == 0 && $verify_status == 0 && $chunks -gt 0 && $install_failures -ge 1 ]] && ok=true
echo "{\"check\": \"vm_startup\", \"ok\": $ok, \"startup_exit\": $status, \"verify_exit\": $verify_status, \"chunks\": $chunks, \"install_failures\": $install_failures, \"debootstrap_s\": $((t_root - t0)), \"startup_s\": $((t_done - t_start)), \"total_s\": $((t_done - t0))}"
$ok

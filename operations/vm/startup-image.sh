#!/usr/bin/env bash
# Start-up script of every Compute Engine VM that runs the release's image (instance metadata
# `startup-script`, set by `python -m operations.deploy plan`): the workers, the shuffle follower and a GPU
# or CPU trainer.  The TPU trainer keeps operations/vm/startup.sh (pip at boot): a TPU VM boots a TPU
# runtime image, and running the role in a container there is not what Google's TPU pages document.
#
# Why an image: startup.sh installed TensorFlow from PyPI at every boot (gigabytes of CUDA wheels and a
# Cython build on a GPU worker, at every scale-up, stalled by any registry outage).  Here nothing is
# installed: the plan builds the release's image once (Cloud Build, from the release object), and every
# VM pulls it by digest from the deployment's Artifact Registry repository.  It runs as root at every
# boot:
#
#   1. read the settings: each from ZEROLAKE_<NAME> if set, else the metadata attribute zerolake-<name>:
#        ROLE            worker | shuffle | trainer
#        ROOT            the lake, gs://BUCKET/RUN
#        IMAGE           REGION-docker.pkg.dev/PROJECT/REPO/NAME@sha256:DIGEST: the release's image, by
#                        digest only (a tag can be moved by whoever can push; a digest cannot)
#        RELEASE_SHA256  the release that image was built from (logged; the digest is what is checked)
#        ACCELERATOR     cpu | gpu
#        HEALTH_PORT     workers: the port of the group's health check (worker process 0 answers it)
#        PROCESSES, ARGS, as startup.sh (run-role.sh in the image reads them)
#   then refuse, in one line, a guest attribute and exit 4, a VM without Docker (every VM boots
#   Container-Optimized OS, which has it): the worker group's health check then recreates it;
#   2. mount the worker group's stateful disk zerolake-spool at /var/lib/zerolake, as startup.sh does, and
#      give that folder to the image's user (uid 10001, the Dockerfile's USER);
#   3. on a GPU VM, install the NVIDIA driver as Container-Optimized OS documents it
#      (https://cloud.google.com/container-optimized-os/docs/how-to/run-gpus: `cos-extensions install gpu`,
#      /var/lib/nvidia bind-mounted onto itself and remounted exec, nvidia-smi to check), tried 3 times;
#      no cos-extensions, no driver or no GPU seen is one line, a guest attribute and exit 4;
#   4. authenticate Docker to the repository's registry with the VM's service account:
#      docker-credential-gcr on Container-Optimized OS (preinstalled there, Google's recommended way),
#      else `gcloud auth configure-docker` (an image with gcloud, given as --cpu-image or --gpu-image);
#   5. pull IMAGE (retried, 30 s doubling to 10 minutes: a registry error delays a VM, never idles it) and
#      refuse, in one line and exit 3, an image whose RepoDigests do not hold IMAGE's digest: a pull by
#      digest cannot return anything else, and this makes that a check rather than an assumption; on a
#      GPU VM, run nvidia-smi inside the image with the GPU flags of step 6 (exit 4 if it sees no GPU);
#   6. run the role as the image runs it (its ENTRYPOINT, run-role.sh, with ROLE and the process index):
#      one container per process, `--restart=always` (Docker restarts a role that exits, as systemd's
#      Restart=always did), `--stop-timeout` per role as the systemd units' TimeoutStopSec gave it
#      (STOP_SECONDS: a worker 25 s, a spot VM's ~30 s notice, to upload its spool; the follower 90 s to
#      cancel its Dataflow job, delete its pieces and release its claim; the trainer 120 s to upload a
#      checkpoint), the state folder bind-mounted at /var/lib/zerolake (the image's VOLUME), the host's
#      network, and on GPU VMs the devices and the driver's libraries and tools as the page above passes
#      them (/dev/nvidia*, /var/lib/nvidia/lib64 and bin at /usr/local/nvidia/, LD_LIBRARY_PATH).  The
#      role's output (the JSON events) is written by Docker's json-file driver, which Container-Optimized
#      OS's logging agent (on with the metadata google-logging-enabled=true, set by the plan) ships to Cloud
#      Logging under the log cos_containers, a JSON line's fields as jsonPayload fields, while LOGGING
#      (metadata zerolake-logging) is on or all; with off, Docker's local driver keeps it on the VM only.
#      `docker logs` reads either.
# The containers are run by Docker directly, not by systemd units: Container-Optimized OS keeps /etc on a
# tmpfs and this script runs at every boot anyway, and Docker's restart policy is what restarts a role.
# The containers of an earlier boot are stopped first (Docker would restart them with their old image), so new
# metadata (an update) takes effect at the next boot or at a rerun of this script.
# Progress goes to the guest attribute zerolake/state (installing-gpu-driver, pulling, pull-failed,
# running; and the failures no-docker, no-gpu-runtime, gpu-driver-failed, no-gpu, image-refused, gpu-unusable).
set -euo pipefail

STATE="${ZEROLAKE_STATE:-/var/lib/zerolake}"
IMAGE_UID=10001
METADATA=http://metadata.google.internal/computeMetadata/v1/instance

log() { echo "[zerolake-startup-image $(date +%H:%M:%S)] $*"; }

report() {   # report STATE: the guest attribute zerolake/state (nothing where there is none)
    curl -fsS --max-time 5 -X PUT --data "$1" -H 'Metadata-Flavor: Google' \
        "$METADATA/guest-attributes/zerolake/state" >/dev/null 2>&1 || true
}

setting() {   # setting NAME [DEFAULT]
    local var value
    var="ZEROLAKE_$(echo "$1" | tr 'a-z-' 'A-Z_')"
    if [[ -n "${!var+x}" ]]; then
        printf '%s' "${!var}"
    elif value=$(curl -fsS --max-time 5 -H 'Metadata-Flavor: Google' "$METADATA/attributes/zerolake-$1" 2>/dev/null); then
        printf '%s' "$value"
    else
        printf '%s' "${2-}"
    fi
}

ROLE=$(setting role)
ROOT=$(setting root)
IMAGE=$(setting image "")
RELEASE_SHA256=$(setting release-sha256 "")
ACCELERATOR=$(setting accelerator cpu)
PROCESSES=$(setting processes 1)
ARGS=$(setting args "")
LOGGING=$(setting logging on)
HEALTH_PORT=$(setting health-port "")
NVIDIA="${ZEROLAKE_NVIDIA_DIR:-/var/lib/nvidia}"
DEVICES="${ZEROLAKE_DEVICE_DIR:-/dev}"
case "$ROLE" in worker|shuffle|trainer) ;; *) echo "startup-image.sh: role '$ROLE' is not worker, shuffle or trainer (metadata zerolake-role)" >&2; exit 2 ;; esac
# Seconds each role's container has after SIGTERM (processes.children.STOP_GRACE_SECONDS, the units'
# TimeoutStopSec): `update` and `down` stop the containers, and a shorter wait kills the stop mid-way.
case "$ROLE" in worker) STOP_SECONDS=25 ;; shuffle) STOP_SECONDS=90 ;; trainer) STOP_SECONDS=120 ;; esac
[[ -n "$ROOT" ]] || { echo "startup-image.sh: root is not set (metadata zerolake-root)" >&2; exit 2; }
[[ "$PROCESSES" =~ ^[1-9][0-9]*$ ]] || { echo "startup-image.sh: processes '$PROCESSES' is not a positive number (metadata zerolake-processes)" >&2; exit 2; }
# json-file is what Container-Optimized OS's logging agent reads; local stays on the VM.
case "$LOGGING" in on|all) log_flags=(--log-driver=json-file --log-opt max-size=50m --log-opt max-file=4) ;; off) log_flags=(--log-driver=local) ;; *) echo "startup-image.sh: logging '$LOGGING' is not on, all or off (metadata zerolake-logging)" >&2; exit 2 ;; esac
[[ -z "$HEALTH_PORT" || "$HEALTH_PORT" =~ ^[1-9][0-9]{0,4}$ ]] || { echo "startup-image.sh: health port '$HEALTH_PORT' is not a port number (metadata zerolake-health-port)" >&2; exit 2; }
case "$ACCELERATOR" in cpu|gpu) ;; *) echo "startup-image.sh: accelerator '$ACCELERATOR' is not cpu or gpu (metadata zerolake-accelerator; a TPU VM runs startup.sh)" >&2; exit 2 ;; esac
# By digest only, from an Artifact Registry Docker repository: REGION-docker.pkg.dev/PROJECT/REPO/NAME@sha256:HEX.
if [[ ! "$IMAGE" =~ ^([a-z0-9-]+-docker\.pkg\.dev)/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$ ]]; then
    echo "startup-image.sh: image '$IMAGE' is not REGION-docker.pkg.dev/PROJECT/REPO/NAME@sha256:DIGEST (metadata zerolake-image): refusing an image nobody pinned" >&2
    exit 2
fi
REGISTRY="${BASH_REMATCH[1]}"

fail() {   # fail STATE LINE: the one line, the guest attribute, exit 4 (the group's health check sees no worker)
    report "$1"
    echo "startup-image.sh: $2" >&2
    exit 4
}
command -v docker >/dev/null || fail no-docker "this VM has no docker: every VM boots Container-Optimized OS (--cpu-image, --gpu-image cos-cloud/cos-stable), which has it"
DIGEST="${IMAGE##*@}"
REPOSITORY="${IMAGE%@*}"

mount_spool_disk() {   # the group's stateful disk at $STATE, formatted on its first boot only (as startup.sh)
    local device="${ZEROLAKE_SPOOL_DEVICE:-/dev/disk/by-id/google-zerolake-spool}"
    [[ -e "$device" ]] || return 0
    mkdir -p "$STATE"
    if mountpoint -q "$STATE"; then return 0; fi
    if ! blkid "$device" >/dev/null 2>&1; then
        log "formatting the new spool disk $device"
        mkfs.ext4 -q -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$device" || return 1
    fi
    mount -o discard,defaults "$device" "$STATE" || return 1
    log "spool disk $device mounted at $STATE"
}

# Docker starts a --restart=always container again when its VM reboots on the same boot disk (the follower and
# the trainer after `update`'s stop and start), with the image it had: stop them first (SIGTERM, the role's
# STOP_SECONDS), so an old release never runs beside the new one while the new image is pulled.
old_containers=$(docker ps -aq --filter 'name=^zerolake-' 2>/dev/null) || old_containers=""
for container in $old_containers; do
    log "stopping the container $container of an earlier boot"
    docker stop --time="$STOP_SECONDS" "$container" >/dev/null || true
    docker rm -f "$container" >/dev/null 2>&1 || true
done

if ! mount_spool_disk; then
    log "WARNING: the spool disk could not be mounted at $STATE (see above); the spool is on the boot disk"
fi
mkdir -p "$STATE"
# The image's user writes its spools, model caches and stage folder there (the image runs as uid 10001).
chown "$IMAGE_UID:$IMAGE_UID" "$STATE" 2>/dev/null || log "WARNING: could not give $STATE to uid $IMAGE_UID"
log "role $ROLE, root $ROOT, accelerator $ACCELERATOR, image $IMAGE (release $RELEASE_SHA256)"

gpu_flags=()
if [[ "$ACCELERATOR" == gpu ]]; then
    command -v cos-extensions >/dev/null \
        || fail no-gpu-runtime "no cos-extensions on this GPU VM: it boots Container-Optimized OS (--gpu-image cos-cloud/cos-stable), whose cos-extensions installs the NVIDIA driver"
    report installing-gpu-driver
    for attempt in 1 2 3; do
        log "installing the NVIDIA driver (cos-extensions install gpu, attempt $attempt of 3)"
        cos-extensions install gpu && break
        (( attempt < 3 )) || fail gpu-driver-failed "cos-extensions install gpu failed 3 times (see above): no NVIDIA driver"
        sleep "${ZEROLAKE_DRIVER_RETRY_SECONDS:-30}"
    done
    # Container-Optimized OS mounts /var noexec: the driver's folder is bind-mounted onto itself and
    # remounted exec, so its nvidia-smi and libraries run (the run-gpus page's steps).
    mountpoint -q "$NVIDIA" || mount --bind "$NVIDIA" "$NVIDIA"
    mount -o remount,exec "$NVIDIA"
    gpus=$("$NVIDIA/bin/nvidia-smi" -L 2>&1) || true
    if ! grep -q '^GPU' <<< "$gpus"; then
        fail no-gpu "the NVIDIA driver is installed but $NVIDIA/bin/nvidia-smi -L sees no GPU: $(head -n 1 <<< "$gpus")"
    fi
    log "$(grep -c '^GPU' <<< "$gpus") GPU(s): $(head -n 1 <<< "$gpus")"
    # What the container needs (the page's docker run): the device files, the driver's libraries and tools.
    gpu_flags=(--volume "$NVIDIA/lib64:/usr/local/nvidia/lib64" --volume "$NVIDIA/bin:/usr/local/nvidia/bin"
               --env LD_LIBRARY_PATH=/usr/local/nvidia/lib64
               --env PATH=/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
    for device in "$DEVICES"/nvidia[0-9]* "$DEVICES/nvidiactl" "$DEVICES/nvidia-uvm" "$DEVICES/nvidia-uvm-tools"; do
        [[ -e "$device" ]] && gpu_flags+=(--device "$device:/dev/${device##*/}")
    done
fi

# Docker's credentials for the registry, in a writable home: Container-Optimized OS mounts / read-only,
# and /var is writable and kept across reboots.
export HOME="${ZEROLAKE_DOCKER_HOME:-/var/lib/zerolake-docker}"
mkdir -p "$HOME"
authenticate() {
    if command -v docker-credential-gcr >/dev/null; then
        docker-credential-gcr configure-docker --registries="$REGISTRY"
    else
        gcloud auth configure-docker "$REGISTRY" --quiet
    fi
}

report pulling
attempt=1
wait="${ZEROLAKE_PULL_RETRY_SECONDS:-30}"
until authenticate && docker pull "$IMAGE"; do
    report pull-failed
    log "pulling $IMAGE failed (attempt $attempt, see above); trying again in ${wait}s"
    sleep "$wait"
    attempt=$((attempt + 1))
    wait=$(( wait * 2 > 600 ? 600 : wait * 2 ))
done
digests=$(docker image inspect --format '{{join .RepoDigests " "}}' "$IMAGE") || digests=""
if [[ " $digests " != *" $REPOSITORY@$DIGEST "* ]]; then
    report image-refused
    echo "startup-image.sh: refused the pulled image: its digests are '$digests', and the image this VM runs (metadata zerolake-image) is $IMAGE" >&2
    exit 3
fi

if [[ "$ACCELERATOR" == gpu ]]; then
    # The GPU as the role will see it: nvidia-smi inside the image, with the flags the role gets.
    seen=$(docker run --rm "${gpu_flags[@]}" --entrypoint nvidia-smi "$IMAGE" -L 2>&1) || true
    if ! grep -q '^GPU' <<< "$seen"; then
        fail gpu-unusable "the image's container sees no GPU (nvidia-smi -L inside $IMAGE: $(head -n 1 <<< "$seen"))"
    fi
fi

case "$ROLE" in worker) count="$PROCESSES" ;; *) count=1 ;; esac
health=()
[[ "$ROLE" == worker && -n "$HEALTH_PORT" ]] && health=(--env ZEROLAKE_HEALTH_PORT="$HEALTH_PORT")
names=()
for ((i = 0; i < count; i++)); do
    name="zerolake-$ROLE-$i"
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker run -d --name "$name" --restart=always --stop-timeout="$STOP_SECONDS" --network=host "${log_flags[@]}" \
        "${gpu_flags[@]}" "${health[@]}" --volume "$STATE:/var/lib/zerolake" \
        --env ZEROLAKE_ROOT="$ROOT" --env ZEROLAKE_ACCELERATOR="$ACCELERATOR" \
        --env ZEROLAKE_ARGS="$ARGS" --env ZEROLAKE_PROCESSES="$PROCESSES" \
        "$IMAGE" "$ROLE" "$i" >/dev/null
    names+=("$name")
done
log "started ${names[*]} from $IMAGE: docker logs -f ${names[0]}"
report running

#!/usr/bin/env bash
# Run one zerolake role process: what the systemd units (operations/vm/systemd/),
# startup.sh's foreground mode and the Docker image start.
#
#   run-role.sh worker INDEX | shuffle | trainer
#
# From the environment (systemd: /etc/zerolake/zerolake.env): ZEROLAKE_ROOT,
# ZEROLAKE_ACCELERATOR (cpu|gpu|tpu), ZEROLAKE_TPU_GENERATION (with tpu: the
# generation's row of operations/deploy/zones.py), ZEROLAKE_ARGS (extra flags, split on
# spaces), ZEROLAKE_PROCESSES (worker processes on this VM, default 1: on a
# CPU VM they split the cores between their int8 networks), ZEROLAKE_PREFIX (default /opt/zerolake), ZEROLAKE_STATE (default
# /var/lib/zerolake: spools, model caches, the trainer's stage folder), ZEROLAKE_HEALTH_PORT (worker
# process 0 answers the group's health check there: selfplay/health.py).
# The role replaces this shell (exec), so systemd's SIGTERM reaches it: the
# worker uploads its spool, the follower releases its claim, the trainer
# checkpoints and releases its lease.  Events go to stdout (the journal).
set -euo pipefail
ROLE="${1:-}"
INDEX="${2:-0}"
PREFIX="${ZEROLAKE_PREFIX:-/opt/zerolake}"
STATE="${ZEROLAKE_STATE:-/var/lib/zerolake}"
PY="$PREFIX/venv/bin/python"
: "${ZEROLAKE_ROOT:?run-role.sh: ZEROLAKE_ROOT is not set (/etc/zerolake/zerolake.env)}"
read -r -a EXTRA <<< "${ZEROLAKE_ARGS:-}"
mkdir -p "$STATE"

# On a TPU VM the role's TensorFlow (tensorflow-tpu from pip, on the PJRT runtime) sees the TPU only
# when its environment is set before TensorFlow is imported: PJRT_DEVICE, NEXT_PLUGGABLE_DEVICE_USE_C_API
# and TF_PLUGGABLE_DEVICE_LIBRARY_PATH (this venv's libtpu).  The installed package prints the
# generation's row of its one table (operations/deploy/zones.py), so this script holds no second copy.
if [[ "${ZEROLAKE_ACCELERATOR:-cpu}" == tpu ]]; then
    : "${ZEROLAKE_TPU_GENERATION:?run-role.sh: ZEROLAKE_TPU_GENERATION is not set (metadata zerolake-tpu-generation)}"
    tpu_env=$("$PY" -m operations.deploy.zones environment "$ZEROLAKE_TPU_GENERATION") || exit 2
    while IFS= read -r line; do
        [[ -n "$line" ]] && export "${line?}"
    done <<< "$tpu_env"
fi

case "$ROLE" in
    worker)
        case "${ZEROLAKE_ACCELERATOR:-cpu}" in
            gpu) gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
                 device="gpu:$((INDEX % (gpus > 0 ? gpus : 1)))" ;;   # processes spread over the GPUs
            tpu) device=tpu ;;
            *) device=cpu
               # Each process's int8 network gets its share of the cores, not all of them.
               threads=$(( $(nproc) / ${ZEROLAKE_PROCESSES:-1} ))
               EXTRA=(--inference-threads "$(( threads > 0 ? threads : 1 ))" "${EXTRA[@]}") ;;
        esac
        # One process per VM answers the group's health probe (selfplay/health.py): the first.
        if [[ -n "${ZEROLAKE_HEALTH_PORT:-}" && "$INDEX" == 0 ]]; then
            EXTRA=(--health-port "$ZEROLAKE_HEALTH_PORT" "${EXTRA[@]}")
        fi
        exec "$PY" -m selfplay.worker --root "$ZEROLAKE_ROOT" --device "$device" \
            --spool-dir "$STATE/spool-$INDEX" --model-cache "$STATE/models-$INDEX" --events - "${EXTRA[@]}" ;;
    shuffle)
        exec "$PY" -m pipeline.shuffle --root "$ZEROLAKE_ROOT" --follow --workers "$(nproc)" --events - "${EXTRA[@]}" ;;
    trainer)
        # On a TPU or GPU VM, --strategy tpu or gpu: an accelerator that does not come up is one clear
        # error (inference.devices.AcceleratorMissing) and the unit restarts, rather than training on
        # the host's CPU while the accelerator is billed.
        case "${ZEROLAKE_ACCELERATOR:-cpu}" in
            tpu|gpu) EXTRA=(--strategy "$ZEROLAKE_ACCELERATOR" "${EXTRA[@]}") ;;
        esac
        exec "$PY" -m model.train --root "$ZEROLAKE_ROOT" --follow --stage-dir "$STATE/stage" --events - "${EXTRA[@]}" ;;
    *)
        echo "run-role.sh: role '$ROLE' is not worker, shuffle or trainer" >&2; exit 2 ;;
esac

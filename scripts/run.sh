#!/usr/bin/env bash
# The main job on embedded defaults: set up (idempotent, fast build), then run
# the one-machine loop against ./lake.  Extra arguments go to the job.
#
# A run that will play GNU Go (--hours H, or --final-gnugo-games N > 0) gets it
# installed now, at set-up, not discovered missing after hours of training.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_flags=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --hours|--final-gnugo-games|--final_gnugo_games) value="${args[i+1]:-0}" ;;
        --hours=*|--final-gnugo-games=*|--final_gnugo_games=*) value="${args[i]#*=}" ;;
        *) continue ;;
    esac
    # 0 is off for both; -1 is --final-gnugo-games' "auto" (none without --hours).
    if [[ "$value" =~ ^[0-9.]+$ ]] && [[ ! "$value" =~ ^0*\.?0*$ ]]; then
        setup_flags=(--gnugo)
    fi
done
scripts/setup.sh ${setup_flags[@]+"${setup_flags[@]}"}
export PATH="$PATH:/usr/games"
exec .venv/bin/python -m operations.loop --root ./lake "$@"

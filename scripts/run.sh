#!/usr/bin/env bash
# The main job on embedded defaults: set up (idempotent, fast build), then run
# the one-machine loop against ./lake.  Extra arguments go to the job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pipeline.loop --root ./lake "$@"

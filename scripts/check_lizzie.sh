#!/usr/bin/env bash
# The real-Lizzie check: Debian's Lizzie 0.7.4 on a virtual display, analysing with
# `python -m arena.gtp` as docs/gui.md tells a user to set it up.
#
#   scripts/check_lizzie.sh [MODEL_DIR]      # MODEL_DIR: ROOT/models/<generation> (default: a fresh
#                                            # untrained model, testdata.models, of LIZZIE_BOARD_SIZE)
#
# It installs liblizzie-java, a JRE, Xvfb and the X tools with apt-get (root or sudo),
# writes Lizzie's config (Debian's Lizzie reads ${user.home}/.config/leela-zero/lizzie-config.txt;
# user.home is a scratch folder here), starts Lizzie with the engine behind a wrapper that logs
# the GTP traffic, waits for analysis lines, keeps a screenshot, and fails when a dialog is
# open, when no `info` line reached Lizzie, or when the board is not the model's size (the
# `boardsize` Lizzie sent, which its board is drawn from, and the grid counted on the screenshot).
# Ends with one JSON line; the files stay in $LIZZIE_CHECK_DIR (default: a new /tmp folder).
#
# Environment: PYTHON (default: the repository's .venv, else python3), LIZZIE_BOARD_SIZE (9, for the
# untrained model; a given model's size is its manifest's),
# LIZZIE_WAIT_SECONDS (180: the longest wait for the first analysis line), LIZZIE_SKIP_INSTALL=1.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PYTHON" ] || PYTHON=$(command -v python3)
SIZE=${LIZZIE_BOARD_SIZE:-9}
WAIT=${LIZZIE_WAIT_SECONDS:-180}
WORK=${LIZZIE_CHECK_DIR:-$(mktemp -d /tmp/zerolake-lizzie.XXXXXX)}
MODEL=${1:-}
mkdir -p "$WORK"
STARTED=$(date +%s)
PIDS=()

finish() {   # finish STATUS PROBLEM: the JSON line, then the exit status
    local status=$1 problem=$2
    "$PYTHON" - "$status" "$problem" "$WORK" "$SIZE" "$(($(date +%s) - STARTED))" <<'EOF'
import json, os, sys
status, problem, work, size, seconds = sys.argv[1:]
def lines(name):
    path = os.path.join(work, name)
    return open(path, errors="replace").read().splitlines() if os.path.exists(path) else []
out = lines("gtp-out.log")
print(json.dumps({"check": "lizzie", "ok": status == "0", "problem": problem or None,
                  "board_size": int(size), "info_lines": sum(l.startswith("info ") for l in out),
                  "commands_sent": len(lines("gtp-in.log")), "windows": lines("windows.txt"),
                  "screenshot": os.path.join(work, "lizzie.png"), "gtp_in": os.path.join(work, "gtp-in.log"),
                  "gtp_out": os.path.join(work, "gtp-out.log"), "seconds": int(seconds)}))
EOF
    exit "$status"
}

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    if [ -n "${ENGINE_PGID:-}" ]; then
        pkill -TERM -g "$ENGINE_PGID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

if [ "${LIZZIE_SKIP_INSTALL:-0}" != 1 ]; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq >"$WORK/apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq liblizzie-java default-jre xvfb xdotool \
        imagemagick >>"$WORK/apt.log" 2>&1 || finish 1 "apt-get install failed: see $WORK/apt.log"
fi

if [ -z "$MODEL" ]; then
    (cd "$REPO" && "$PYTHON" -c "from testdata.models import publish_untrained_model
publish_untrained_model('$WORK/lake', 1, $SIZE, seed=1)") >"$WORK/publish.log" 2>&1 \
        || finish 1 "could not publish a model: see $WORK/publish.log"
    MODEL=$WORK/lake/models/000001
else                            # the network's own size, from its manifest
    SIZE=$(cd "$REPO" && "$PYTHON" -c "import sys
from cloud.storage import open_storage
from format.registry import read_manifest
from inference.loading import EvaluatorSource
source = EvaluatorSource.from_model_dir(sys.argv[1])
print(read_manifest(open_storage(source.model_root), source.generation).board_size)" "$MODEL") \
        || finish 1 "$MODEL is not a published model folder (ROOT/models/<generation>)"
fi

# The engine command Lizzie runs: the engine, its stdin and its output (stderr included, as
# Lizzie reads both) copied into the logs on the way.
cat >"$WORK/engine.sh" <<EOF
#!/bin/sh
cd "$REPO" || exit 1
tee -a "$WORK/gtp-in.log" | "$PYTHON" -m arena.gtp --model "$MODEL" 2>&1 | tee -a "$WORK/gtp-out.log"
EOF
chmod +x "$WORK/engine.sh"
mkdir -p "$WORK/home/.config/leela-zero"
cat >"$WORK/home/.config/leela-zero/lizzie-config.txt" <<EOF
{"ui": {"board-size": $SIZE, "resume-previous-game": false, "confirm-exit": false},
 "leelaz": {"engine-command": "$WORK/engine.sh", "analyze-update-interval-centisec": 10}}
EOF

DISPLAY_NUMBER=$((50 + RANDOM % 200))
Xvfb ":$DISPLAY_NUMBER" -screen 0 1280x900x24 -nolisten tcp >"$WORK/xvfb.log" 2>&1 &
PIDS+=($!)
export DISPLAY=":$DISPLAY_NUMBER"
sleep 2
setsid java -Duser.home="$WORK/home" -jar /usr/share/java/lizzie.jar >"$WORK/lizzie.log" 2>&1 &
LIZZIE_PID=$!
PIDS+=("$LIZZIE_PID")
ENGINE_PGID=$LIZZIE_PID        # setsid: Lizzie leads its own group, and its engine is in it

deadline=$(($(date +%s) + WAIT))
until grep -q '^info ' "$WORK/gtp-out.log" 2>/dev/null; do
    kill -0 "$LIZZIE_PID" 2>/dev/null || finish 1 "Lizzie exited: see $WORK/lizzie.log"
    [ "$(date +%s)" -lt "$deadline" ] || break
    if xdotool search --onlyvisible --name '^(Message|Lizzie - Error!)$' >/dev/null 2>&1; then
        break                   # a dialog: nothing more will come
    fi
    sleep 1
done
sleep 5                         # a few reports drawn
import -window root "$WORK/lizzie.png"

: >"$WORK/windows.txt"
for window in $(xdotool search --onlyvisible --name '.' 2>/dev/null || true); do
    xdotool getwindowname "$window" >>"$WORK/windows.txt" 2>/dev/null || true
done

# Besides Lizzie's own window ("Lizzie [ENGINE] ..." once the engine runs) Java shows only its
# helper windows; a JOptionPane dialog is "Message" (the version dialog) or "Lizzie - Error!".
if grep -qvE '^(Lizzie( \[.*)?|Lizzie - Leela Zero Interface|Content window|FocusProxy)$' "$WORK/windows.txt"; then
    finish 1 "a dialog is open: $(tr '\n' ';' <"$WORK/windows.txt")"
fi
grep -q '^info ' "$WORK/gtp-out.log" 2>/dev/null || finish 1 "no info line reached Lizzie in ${WAIT} s"
grep -qE "^[0-9]+ boardsize $SIZE\$" "$WORK/gtp-in.log" || finish 1 "Lizzie did not send boardsize $SIZE"
if grep -qE '^\?' "$WORK/gtp-out.log"; then
    finish 1 "the engine refused a command: $(grep -E '^\?' "$WORK/gtp-out.log" | head -3 | tr '\n' ';')"
fi
# The grid on the screenshot: the wood-coloured square, then in it the thin dark lines (darker
# than the pixels 3 px either side; stones, candidate circles and their numbers hide parts): the
# spacing of the clearest lines (seen in 45% of the rows or columns), then the lines on that lattice
# seen in at least 25%, counted out from the first clear one.
grid=$("$PYTHON" - "$WORK/lizzie.png" <<'PYEOF'
import sys
import numpy as np
from PIL import Image
pixels = np.asarray(Image.open(sys.argv[1]).convert("RGB")).astype(int)
red, green, blue = pixels[..., 0], pixels[..., 1], pixels[..., 2]
wood = (red > 150) & (green > 100) & (red - blue > 60)
columns, rows = np.flatnonzero(wood.mean(0) > 0.3), np.flatnonzero(wood.mean(1) > 0.3)
if len(columns) < 50 or len(rows) < 50:
    sys.exit("no board on the screenshot")
light = pixels[rows[0]:rows[-1] + 1, columns[0]:columns[-1] + 1].mean(2)
def lines(light):
    thin = (light[:, 3:-3] < np.minimum(light[:, :-6], light[:, 6:]) - 30).mean(0)
    strong = [i for i in range(1, len(thin) - 1) if thin[i] >= 0.45 and thin[i - 1] <= thin[i] > thin[i + 1]]
    if len(strong) < 2:
        return len(strong)
    step = min(np.diff(strong))
    def seen(x):
        return 0 <= x < len(thin) and thin[max(0, x - 3):x + 4].max() >= 0.25
    count, x = 1, strong[0] - step
    while seen(x):
        count, x = count + 1, x - step
    x = strong[0] + step
    while seen(x):
        count, x = count + 1, x + step
    return count
vertical, horizontal = lines(light), lines(light.T)
# Overlays only hide lines, never add one, and once in three clean runs an edge line was hidden in one
# direction (8x9 on a 9x9 board): the board is the larger count when the two agree within one.
print(max(vertical, horizontal) if abs(vertical - horizontal) <= 1 else f"{vertical}x{horizontal}")
PYEOF
) || finish 1 "no board found on the screenshot"
[ "$grid" = "$SIZE" ] || finish 1 "the board drawn has $grid lines, not $SIZE"
finish 0 ""

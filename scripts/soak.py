"""Soak check: do the long-lived roles stay small while windows go by?

    .venv/bin/python scripts/soak.py --minutes 30 --dir /tmp/soak

Runs ``python -m operations.cluster`` (one self-play worker, the shuffle
follower and the trainer, all at once on one local lake, as a deployment runs
them for weeks) for ``--minutes``, with tiny 9x9 settings so that many windows
and generations go by, and its own temporary folder (TMPDIR) so that what the
roles leave there can be counted.  Every ``--sample-seconds`` it reads, for
each role's process (found by its command line among the launcher's
descendants): resident memory (VmRSS), open file descriptors, and threads;
and for the run: files in the temporary folder, and the lake's leftovers
(objects under ``tmp/``, writers' temp files, lock files whose object is gone).  The follower's ``looked``
events say how many chunks each of its looks listed.

The first third of the run is warm-up (TensorFlow graphs, the first models
compiled, Beam's start).  For each role it reports the median resident memory
of the middle third and of the last third and the windows made between them,
and a verdict: no role's memory grew by more than ``--max-growth-mb`` from the
one to the other, no role's open files grew, and the temporary folder and the
lake's leftovers at the end (every role stopped) are no more than at the
quietest sample of the middle third (a window job's pieces are there while it
runs), and the follower's median listing per look in the last third is at most
1.5 times the middle third's (plus 8: a folder's chunks come in steps).  Human lines go to stderr; the last line
on stdout is one JSON object.  Not part of the timed suite: it takes as long
as ``--minutes`` says and both cores.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloud.base import TEMP_MARKER  # noqa: E402
from cloud.local import LOCK_MARKER  # noqa: E402
from format import layout  # noqa: E402

ROLES = {"worker": "selfplay.worker", "shuffle": "pipeline.shuffle", "trainer": "model.train"}
"""Role name -> the module its process runs (``python -m MODULE``)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the cluster runs (default: 30)")
    parser.add_argument("--dir", default="", help="working folder (lake, state, tmp); default: a new one "
                                                  "under the system temporary folder")
    parser.add_argument("--sample-seconds", type=float, default=20.0, help="seconds between samples")
    parser.add_argument("--max-growth-mb", type=float, default=32.0,
                        help="most a role's resident memory may grow from the middle third of the run to the "
                             "last (medians; default: 32)")
    args = parser.parse_args(argv)
    if not 1 <= args.minutes <= 24 * 60:
        parser.error("--minutes must be in [1, 1440]")
    if not 1 <= args.sample_seconds <= 600:
        parser.error("--sample-seconds must be in [1, 600]")
    return args


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc's children lists)."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as handle:
                children = [int(c) for c in handle.read().split()]
        except OSError:
            continue
        found += children
        queue += children
    return found


def process_figures(pid: int) -> dict | None:
    """{'rss_mb', 'fds', 'threads'} of a live process, or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "fds": fds,
            "threads": int(fields["Threads"])}


def role_processes(launcher_pid: int) -> dict[str, int]:
    """Role name -> the pid of the process running its module that the launcher started itself (the
    follower, not the window job it starts with the same module; pids wrap, so order says nothing)."""
    found = {}
    for pid in descendants(launcher_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        for role, module in ROLES.items():
            if module.encode() in argv and parent == launcher_pid:
                found[role] = pid
    return found


def count_files(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


def lake_leftovers(lake: Path) -> int:
    """Objects under the lake's tmp/, writers' temp files anywhere in it, and lock files whose object is gone."""
    count = 0
    for dirpath, _, files in os.walk(lake):
        inside_tmp = Path(dirpath).relative_to(lake).parts[:1] == (layout.tmp_prefix().rstrip("/"),)
        present = set(files)
        for name in files:
            if name.startswith(LOCK_MARKER):  # lives as long as its object (cloud.local)
                count += name[len(LOCK_MARKER):] not in present
            else:
                count += inside_tmp or name.startswith(TEMP_MARKER)
    return count


def newest_generation(lake: Path, prefix: str) -> int:
    """The highest generation under ``prefix`` (windows/ or models/) with its manifest, 0 if none
    (old windows are deleted as new ones come, so a count would not grow)."""
    folder = lake / prefix.rstrip("/")
    generations = [layout.parse_generation(p.parent.name) for p in folder.glob(f"*/{layout.MANIFEST}")] \
        if folder.is_dir() else []
    return max((g for g in generations if g is not None), default=0)


def listings(state: Path, started_wall: float) -> list[tuple[float, int]]:
    """(minutes since the start, chunks listed) of each look of the follower (its ``looked`` events)."""
    found = []
    try:
        lines = (state / "events" / "shuffle.jsonl").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if event.get("event") == "looked" and isinstance(event.get("listed"), int):
            found.append(((event["time"] - started_wall) / 60, event["listed"]))
    return found


WINDOW_CAP = 300_000
"""The window's most positions.  The tiny worker makes millions of positions an hour, and an uncapped
window grows with the lake (to 5 M in two hours), and with it what each role holds per window; capped,
the window is full within minutes, so what grows from the middle of the run on grows with windows."""


def cluster_command(lake: Path, state: Path, minutes: float) -> list[str]:
    """Tiny 9x9 settings: a window every minute or two, so a half-hour run sees many."""
    return [sys.executable, "-m", "operations.cluster", "--root", str(lake), "--state-dir", str(state),
            "--workers", "1", "--minutes", str(minutes), "--child-threads", "1", "--worker-nice", "10",
            "--status-seconds", "30", "--poll-seconds", "2",
            "--worker-games", "32", "--worker-visits", "8", "--worker-chunk-games", "16",
            "--shuffle-window-min-positions", "2000", "--shuffle-window-max-positions", str(WINDOW_CAP),
            "--shuffle-follow-new-positions", "2000",
            "--shuffle-workers", "1",
            "--train-blocks", "1", "--train-filters", "16", "--train-value-hidden", "16",
            "--train-batch-size", "64", "--train-steps-per-window", "100", "--train-log-every", "50",
            "--train-checkpoint-every", "100"]


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(args.dir) if args.dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"zerolake-soak-{os.getpid()}"
    if work.exists() and any(work.iterdir()):
        print(f"scripts/soak.py: --dir {work} is not empty; give a new folder", file=sys.stderr)
        return 2
    lake, state, temp = work / "lake", work / "state", work / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TMPDIR=str(temp), PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    log = open(work / "cluster.log", "w")
    launcher = subprocess.Popen(cluster_command(lake, state, args.minutes), cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    series: dict[str, list] = {role: [] for role in ROLES}   # role -> [(minutes, windows, figures)]
    run_series = []                                          # [(minutes, windows, run figures)]
    started, started_wall = time.monotonic(), time.time()
    try:
        while launcher.poll() is None:
            time.sleep(args.sample_seconds)
            minutes = (time.monotonic() - started) / 60
            windows = newest_generation(lake, layout.windows_prefix())
            run = {"tmp_files": count_files(temp), "lake_leftovers": lake_leftovers(lake)}
            run_series.append((minutes, windows, run))
            shown = []
            for role, pid in sorted(role_processes(launcher.pid).items()):
                figures = process_figures(pid)
                if figures is not None:
                    series[role].append((minutes, windows, dict(figures, pid=pid)))
                    shown.append(f"{role} {figures['rss_mb']:.0f} MB/{figures['fds']} fds")
            print(f"[soak] {minutes:5.1f} min  windows {windows}  tmp files {run['tmp_files']}  lake leftovers "
                  f"{run['lake_leftovers']}  " + "  ".join(shown), file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(timeout=120)
    end_run = {"tmp_files": count_files(temp), "lake_leftovers": lake_leftovers(lake)}
    log.close()
    total = (time.monotonic() - started) / 60
    report = {"bench": "soak", "minutes": round(total, 1), "samples": len(run_series),
              "launcher_exit": launcher.returncode, "windows": newest_generation(lake, layout.windows_prefix()),
              "generations": newest_generation(lake, layout.models_prefix())}
    problems = []
    # The first third is warm-up (TensorFlow graphs, the first models compiled, Beam's start);
    # growth is the middle third's median against the last third's, which a spike cannot move.
    middle, late = (lambda t: total / 3 <= t < 2 * total / 3), (lambda t: t >= 2 * total / 3)
    for role in ROLES:
        mid = [(w, f) for t, w, f in series[role] if middle(t)]
        end = [(w, f) for t, w, f in series[role] if late(t)]
        if not mid or not end:
            problems.append(f"{role}: not seen running in both the middle and the last third of the run")
            continue
        rss_mid = float(np.median([f["rss_mb"] for _, f in mid]))
        rss_late = float(np.median([f["rss_mb"] for _, f in end]))
        windows_between = int(np.median([w for w, _ in end]) - np.median([w for w, _ in mid]))
        fds_mid, fds_late = max(f["fds"] for _, f in mid), max(f["fds"] for _, f in end)
        report.update({f"{role}_rss_mb_mid": round(rss_mid, 1), f"{role}_rss_mb_late": round(rss_late, 1),
                       f"{role}_rss_mb_growth": round(rss_late - rss_mid, 1),
                       f"{role}_windows_mid_to_late": windows_between,
                       f"{role}_fds_mid": fds_mid, f"{role}_fds_late": fds_late,
                       f"{role}_restarted": len({f["pid"] for _, _, f in series[role]}) > 1})
        if rss_late - rss_mid > args.max_growth_mb:
            problems.append(f"{role}: resident memory grew {rss_late - rss_mid:.0f} MB over {windows_between} windows")
        if fds_late > fds_mid + 16:
            problems.append(f"{role}: open files grew from {fds_mid} to {fds_late}")
    # A window job's pieces and model copy are there while it runs: compare the quietest sample
    # of the middle third with the end (after every role stopped), where nothing should be left
    # that the middle did not already hold.
    for key in ("tmp_files", "lake_leftovers"):
        floor = min((r[key] for t, _, r in run_series if middle(t)), default=end_run[key])
        report[f"{key}_floor_mid"], report[f"{key}_end"] = floor, end_run[key]
        if end_run[key] > floor:
            problems.append(f"{key}: {end_run[key]} at the end against {floor} in the middle of the run")
    looks = listings(state, started_wall)
    listed_mid = [n for t, n in looks if middle(t)]
    listed_late = [n for t, n in looks if late(t)]
    if listed_mid and listed_late:
        mid_median, late_median = float(np.median(listed_mid)), float(np.median(listed_late))
        report.update({"follower_listed_per_look_mid": mid_median, "follower_listed_per_look_late": late_median})
        if late_median > 1.5 * mid_median + 8:
            problems.append(f"the follower's listing per look grew from {mid_median:.0f} to {late_median:.0f} chunks")
    else:
        problems.append("the follower's looks (its looked events with 'listed') not seen in both thirds")
    report["problems"] = problems
    report["bounded"] = not problems
    for problem in problems:
        print(f"[soak] PROBLEM {problem}", file=sys.stderr)
    print(f"[soak] lake, state and logs kept in {work}", file=sys.stderr)
    print(json.dumps(report))
    if args.dir == "":
        shutil.rmtree(temp, ignore_errors=True)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())

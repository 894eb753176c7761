"""Soak check: do the long-lived roles stay small while windows go by?

    .venv/bin/python scripts/soak.py --minutes 30 --dir /tmp/soak

Runs ``python -m pipeline.cluster`` (one self-play worker, the shuffle
follower and the trainer, all at once on one local lake, as a deployment runs
them for weeks) for ``--minutes``, with tiny 9x9 settings so that many windows
and generations go by, and its own temporary folder (TMPDIR) so that what the
roles leave there can be counted.  Every ``--sample-seconds`` it reads, for
each role's process (found by its command line among the launcher's
descendants): resident memory (VmRSS), open file descriptors, and threads;
and for the run: files in the temporary folder, and the lake's leftovers
(objects under ``tmp/`` and writers' temp files).

It reports each role's figures at its first sample after generation 2 is
published (warm: every role has loaded TensorFlow or Beam and a network) and
at the end, with the
number of windows between them, and a verdict: each role's memory grew by at
most ``--max-growth-mb`` over the run, and the temporary folder and the lake's
leftovers did not grow with the number of windows (their end is at most their
warm count plus one window's worth).  Human lines go to stderr; the last line
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cloud.base import TEMP_MARKER  # noqa: E402
from format import layout  # noqa: E402

WARM_GENERATION = 2
"""Figures count as warm from the first sample after this generation is published: by then the trainer
has trained and published, the worker plays a network, and the shuffle job has labelled with one."""
ROLES = {"worker": "selfplay.worker", "shuffle": "pipeline.shuffle", "trainer": "model.train"}
"""Role name -> the module its process runs (``python -m MODULE``)."""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/soak.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the cluster runs (default: 30)")
    parser.add_argument("--dir", default="", help="working folder (lake, state, tmp); default: a new one "
                                                  "under the system temporary folder")
    parser.add_argument("--sample-seconds", type=float, default=20.0, help="seconds between samples")
    parser.add_argument("--max-growth-mb", type=float, default=64.0,
                        help="most a role's resident memory may grow from warm to the end (default: 64)")
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
    """Role name -> the pid of the process running its module (the topmost one, not Beam's workers)."""
    found = {}
    for pid in sorted(descendants(launcher_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for role, module in ROLES.items():
            if role not in found and module.encode() in argv:
                found[role] = pid
    return found


def count_files(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


def lake_leftovers(lake: Path) -> int:
    """Objects under the lake's tmp/ plus writers' temp files anywhere in it."""
    count = 0
    for dirpath, _, files in os.walk(lake):
        inside_tmp = Path(dirpath).relative_to(lake).parts[:1] == (layout.tmp_prefix().rstrip("/"),)
        count += sum(1 for name in files if inside_tmp or name.startswith(TEMP_MARKER))
    return count


def newest_generation(lake: Path, prefix: str) -> int:
    """The highest generation under ``prefix`` (windows/ or models/) with its manifest, 0 if none
    (old windows are deleted as new ones come, so a count would not grow)."""
    folder = lake / prefix.rstrip("/")
    generations = [layout.parse_generation(p.parent.name) for p in folder.glob(f"*/{layout.MANIFEST}")] \
        if folder.is_dir() else []
    return max((g for g in generations if g is not None), default=0)


def cluster_command(lake: Path, state: Path, minutes: float) -> list[str]:
    """Tiny 9x9 settings: a window every minute or two, so a half-hour run sees many."""
    return [sys.executable, "-m", "pipeline.cluster", "--root", str(lake), "--state-dir", str(state),
            "--workers", "1", "--minutes", str(minutes), "--child-threads", "1", "--worker-nice", "10",
            "--status-seconds", "30", "--poll-seconds", "2",
            "--worker-games", "32", "--worker-visits", "8", "--worker-chunk-games", "16",
            "--shuffle-window-min-positions", "2000", "--shuffle-follow-new-positions", "2000",
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
    warm, last, samples = {}, {}, 0
    warm_run = None
    started = time.monotonic()
    try:
        while launcher.poll() is None:
            time.sleep(args.sample_seconds)
            windows = newest_generation(lake, layout.windows_prefix())
            warmed = newest_generation(lake, layout.models_prefix()) >= WARM_GENERATION
            run = {"windows": windows, "tmp_files": count_files(temp), "lake_leftovers": lake_leftovers(lake)}
            for role, pid in role_processes(launcher.pid).items():
                figures = process_figures(pid)
                if figures is None:
                    continue
                figures.update(pid=pid, windows=windows)
                if warmed and role not in warm:
                    warm[role] = figures
                last[role] = figures
            if warmed and warm_run is None:
                warm_run = run
            samples += 1
            minutes = (time.monotonic() - started) / 60
            print(f"[soak] {minutes:5.1f} min  windows {windows}  tmp files {run['tmp_files']}  lake leftovers "
                  f"{run['lake_leftovers']}  " + "  ".join(f"{r} {f['rss_mb']:.0f} MB/{f['fds']} fds"
                                                           for r, f in sorted(last.items())),
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        os.killpg(launcher.pid, signal.SIGTERM)
        launcher.wait(timeout=120)
    end_run = {"windows": newest_generation(lake, layout.windows_prefix()), "tmp_files": count_files(temp),
               "lake_leftovers": lake_leftovers(lake)}
    log.close()
    report = {"bench": "soak", "minutes": round((time.monotonic() - started) / 60, 1), "samples": samples,
              "launcher_exit": launcher.returncode, "windows": end_run["windows"],
              "generations": newest_generation(lake, layout.models_prefix())}
    problems = []
    for role in ROLES:
        if role not in warm:
            problems.append(f"{role}: never seen running after generation {WARM_GENERATION} was published")
            continue
        start, end = warm[role], last[role]
        growth = end["rss_mb"] - start["rss_mb"]
        report[f"{role}_rss_mb_warm"], report[f"{role}_rss_mb_end"] = start["rss_mb"], end["rss_mb"]
        report[f"{role}_fds_warm"], report[f"{role}_fds_end"] = start["fds"], end["fds"]
        report[f"{role}_windows_between"] = end["windows"] - start["windows"]
        report[f"{role}_restarted"] = start["pid"] != end["pid"]
        if growth > args.max_growth_mb:
            problems.append(f"{role}: resident memory grew {growth:.0f} MB over "
                            f"{end['windows'] - start['windows']} windows")
        if end["fds"] > start["fds"] + 16:
            problems.append(f"{role}: open files grew from {start['fds']} to {end['fds']}")
    warm_run = warm_run or end_run
    for key in ("tmp_files", "lake_leftovers"):
        report[f"{key}_warm"], report[f"{key}_end"] = warm_run[key], end_run[key]
    # What one window's job holds in flight (its pieces, one model copy) may be there at any
    # sample; what grows with the number of windows is a leak.
    per_window_slack = 64
    for key in ("tmp_files", "lake_leftovers"):
        if end_run[key] > warm_run[key] + per_window_slack:
            problems.append(f"{key} grew from {warm_run[key]} to {end_run[key]}")
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

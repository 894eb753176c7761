"""Bench scripts that would otherwise rot unnoticed, run at tiny settings: they finish and end with their JSON keys.

A smoke run measures nothing worth quoting; it checks that the script still
runs against the code as it is and reports every key its docstring names.
bench/train.py (about 20 s at its smallest), bench/pipeline.py (about 50 s)
and bench/cluster.py (minutes) cost more than the suite can spend on them:
they are run by hand with the figures they report.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_bench(name: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, str(REPO / "bench" / name), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gpu_feed_search_side_reports_its_keys():
    result = run_bench("gpu_feed.py", "--skip-network", "--seconds", "0.2", "--processes", "1")
    assert result["bench"] == "gpu_feed"
    assert set(result) >= {"search_games", "search_visits", "search_sims_per_s_9", "search_sims_per_s_19"}
    assert result["search_sims_per_s_9"]["1"] > 0 and result["search_sims_per_s_19"]["1"] > 0

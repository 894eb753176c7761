"""bench/run_records.py counts what a run's chunks and trainer events hold, game by game."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from format import schema
from tests.pipeline.support import engine_game, write_chunk, write_run_json

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "bench", "run_records.py")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *argv], cwd=REPO, capture_output=True, text=True)


def test_resignations_their_rows_and_false_resignations_are_counted(tmp_path):
    root = str(tmp_path / "lake")
    rng = np.random.default_rng(4)
    write_run_json(root, 9)
    plain = [engine_game(rng, 9, generation=1) for _ in range(3)]
    finished = engine_game(rng, 9, generation=1)
    # Resigned at move 10 by the side the played-out board favours: the ending disagrees with the label.
    against = dataclasses.replace(finished, end_reason=schema.END_RESIGN, accelerated_from=10,
                                  winner=-int(np.sign(finished.score)))
    agreeing = dataclasses.replace(engine_game(rng, 9, generation=2), end_reason=schema.END_RESIGN,
                                   accelerated_from=20)
    agreeing = dataclasses.replace(agreeing, winner=int(np.sign(agreeing.score)))
    unplayed = dataclasses.replace(engine_game(rng, 9, generation=2), end_reason=schema.END_RESIGN, score=float("nan"),
                                   accelerated_from=-1, ownership=None, ownership_source=schema.OWNERSHIP_NONE)
    base = engine_game(rng, 9, generation=2)
    wrong = dataclasses.replace(base, resign_enabled=False, would_resign=int(base.winner))     # then won
    right = dataclasses.replace(base, game_id="x", resign_enabled=False, would_resign=-int(base.winner))
    quiet = dataclasses.replace(base, game_id="y", resign_enabled=False, would_resign=0)
    write_chunk(root, 0, [engine_game(rng, 9, generation=0)], 0)          # generation 0: not read by default
    write_chunk(root, 1, [*plain, against], 1)
    write_chunk(root, 2, [agreeing, unplayed, wrong, right, quiet], 2)
    events = tmp_path / "train.jsonl"
    lines = [{"role": "train", "event": "window_started", "time": 100.0, "generation": 1, "steps": 10},
             {"role": "train", "event": "published", "time": 160.0, "generation": 1, "step": 10},
             {"role": "train", "event": "window_started", "time": 200.0, "generation": 2, "steps": 10},
             {"role": "train", "event": "published", "time": 230.0, "generation": 2, "step": 20}]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))

    done = _run("--root", root, "--events", str(events))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    games = [*plain, against, agreeing, unplayed, wrong, right, quiet]
    assert result["games"] == 9 and result["positions"] == sum(g.num_positions for g in games)
    assert result["resigned_games"] == 3 and result["resigned_played_out"] == 2
    assert result["played_out_against_resignation"] == 1
    assert result["rows_after_resignation"] == (against.num_positions - 10) + (agreeing.num_positions - 20)
    assert result["resign_disabled_games"] == 3 and result["would_resign_games"] == 2
    assert result["false_resignations"] == 1 and result["false_resignation_rate"] == 0.5
    assert set(result["positions_by_generation"]) == {"1", "2"}
    assert result["trainer"] == {"windows": 2, "last_step": 20, "training_s": 90.0, "waiting_s": 40.0,
                                 "waiting_share": round(40 / 130, 4)}


def test_an_empty_lake_and_a_bad_events_line_are_refused_in_one_line(tmp_path):
    root = str(tmp_path / "lake")
    write_run_json(root, 9)
    empty = _run("--root", root)
    assert empty.returncode == 2 and "holds no chunks of generation 1 or later" in empty.stderr
    write_chunk(root, 1, [engine_game(np.random.default_rng(0), 9, generation=1)], 0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    refused = _run("--root", root, "--events", str(bad))
    assert refused.returncode != 0 and f"{bad}:1 is not a JSON event line" in refused.stderr
    assert "Traceback" not in refused.stderr

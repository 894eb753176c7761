"""The whole shuffle job on a local lake: python -m pipeline.shuffle's main().

One lake exercises everything at once (each Beam run costs seconds):
three generations of synthetic games, a chunk uploaded twice, a chunk of
real engine games (finished and resigned), and four chunks the job must
skip: a flipped byte, a truncated file, 19x19 games in a 9x9 run and an
unknown format version.
"""
from __future__ import annotations

import collections
import json
import math
import os
import shutil

import numpy as np
import pytest

from format import layout
from format import codec
from format import schema
from testdata.synthetic_games import synthetic_game
from pipeline import labels as L
from pipeline.shuffle import main
from tests.pipeline.support import (
    engine_game, read_window, resigned_copy, write_chunk, write_run_json)

GAMES_PER_CHUNK = 12
CAP = 5
REUSE = 1.5


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    write_run_json(root, 9)
    rng = np.random.default_rng(2024)
    seq = 0
    for gen in range(3):
        for _ in range(4):
            games = [synthetic_game(rng, 9, visits=30, generation=gen, full_search_fraction=0.5)
                     for _ in range(GAMES_PER_CHUNK)]
            last = write_chunk(root, gen, games, seq)
            seq += 1
    # The last chunk uploaded a second time under another name.
    duplicate = layout.chunk_path(2, "w2", 1_700_000_000_999, 0)
    os.makedirs(os.path.dirname(os.path.join(root, duplicate)), exist_ok=True)
    shutil.copy(os.path.join(root, last), os.path.join(root, duplicate))
    # Real games: finished ones and resigned copies of others.
    finished = [engine_game(rng, 9, generation=2) for _ in range(6)]
    resigned = [resigned_copy(engine_game(rng, 9, generation=2), 0.85) for _ in range(6)]
    engine_chunk = write_chunk(root, 2, finished + resigned, seq)
    seq += 1
    bad = {}
    good_bytes = codec.encode_chunk([synthetic_game(rng, 9, visits=10, generation=1) for _ in range(3)])
    flipped = bytearray(good_bytes)
    flipped[len(flipped) // 2] ^= 0x40
    truncated = good_bytes[: len(good_bytes) * 2 // 3]
    foreign = codec.encode_chunk([synthetic_game(rng, 19, visits=10, generation=1)])
    future = synthetic_game(rng, 9, visits=10, generation=1)
    future.version = 99
    unknown_version = codec.encode_chunk([future])
    for kind, data in (("flipped", bytes(flipped)), ("truncated", truncated), ("foreign", foreign),
                       ("version", unknown_version)):
        path = layout.chunk_path(1, "bad", 1_600_000_000_000 + seq, seq)
        seq += 1
        with open(os.path.join(root, path), "wb") as f:
            f.write(data)
        bad[kind] = path
    code = main(["--root", root, "--window-min-positions", "1000000", "--shard-positions", "4000",
                 "--reuse", str(REUSE), "--position-cap", str(CAP), "--dedup-max-move", "8",
                 "--bundle-positions", "2000", "--random-playouts", "32", "--workers", "2", "--seed", "7"])
    assert code == 0
    manifest, shards = read_window(root, 1)
    return {"root": root, "manifest": manifest, "shards": shards, "bad": bad, "finished": finished,
            "resigned": resigned, "engine_chunk": engine_chunk, "duplicate": duplicate}


def _all_records(shards):
    return [(name, rec) for name, records in shards.items() for rec in records]


def test_damaged_and_foreign_chunks_are_skipped_and_named(lake):
    skipped = {s["chunk"]: s["reason"] for s in lake["manifest"]["chunks_skipped"]}
    assert set(skipped) == set(lake["bad"].values())
    assert "CRC" in skipped[lake["bad"]["flipped"]] or "zstd" in skipped[lake["bad"]["flipped"]]
    assert "truncated" in skipped[lake["bad"]["truncated"]]
    assert "19x19" in skipped[lake["bad"]["foreign"]]
    assert "version 99" in skipped[lake["bad"]["version"]]
    assert lake["manifest"]["input"]["chunks_skipped"] == 4
    assert lake["manifest"]["input"]["chunks_read"] == 12 + 1 + 1


def test_a_chunk_uploaded_twice_yields_each_game_once(lake):
    manifest = lake["manifest"]
    assert manifest["dedup"]["duplicate_games"] == GAMES_PER_CHUNK
    copies = collections.Counter((rec.game_id, rec.move_number) for _, rec in _all_records(lake["shards"]))
    # Uncapped positions appear floor(r) or ceil(r) times, never twice as often.
    late = [c for (gid, move), c in copies.items() if move >= 8]
    assert set(late) <= {1, 2}


def test_reuse_matches_the_configured_value(lake):
    copies = collections.Counter((rec.game_id, rec.move_number) for _, rec in _all_records(lake["shards"]))
    late = np.array([c for (gid, move), c in copies.items() if move >= 8])
    # Every uncapped position of every good game is present at least once.
    games = lake["manifest"]["input"]["games_read"] - GAMES_PER_CHUNK
    assert len({gid for gid, _ in copies}) == games
    assert abs(late.mean() - REUSE) < 0.03, late.mean()


def test_an_opening_in_every_game_is_capped_with_merged_targets(lake):
    records = [rec for _, rec in _all_records(lake["shards"])]
    empty_board = [rec for rec in records if rec.move_number == 0]
    # Every game starts from the empty board: one key, kept CAP times, each kept copy reused.
    assert len({(r.game_id, r.move_number) for r in empty_board}) == CAP
    assert CAP <= len(empty_board) <= 2 * CAP
    # Kept copies carry the merged (mean) targets: all identical.
    policies = {tuple(np.round(r.policy_prob, 5)) for r in empty_board}
    assert len(policies) == 1
    assert lake["manifest"]["dedup"]["capped_keys"] >= 1
    unique_games = lake["manifest"]["input"]["games_read"] - GAMES_PER_CHUNK
    assert lake["manifest"]["dedup"]["capped_positions_removed"] >= unique_games - CAP


def test_positions_of_a_game_are_spread_over_the_shards(lake):
    shards = lake["shards"]
    assert len(shards) >= 6
    per_game = collections.defaultdict(collections.Counter)
    for name, rec in _all_records(shards):
        if rec.move_number >= 8:
            per_game[rec.game_id][name] += 1
    for counts in per_game.values():
        total = sum(counts.values())
        assert max(counts.values()) <= math.ceil(total / len(shards)) + 1


def test_each_shard_has_the_window_generation_mix(lake):
    manifest = lake["manifest"]
    window = {int(g): c for g, c in manifest["generations"].items()}
    total = sum(window.values())
    for name, records in lake["shards"].items():
        gens = collections.Counter(r.generation for r in records)
        n = len(records)
        assert n == manifest["shard_positions"][name]
        for g, c in window.items():
            p = c / total
            assert abs(gens[g] / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 0.01, (name, g)


def test_engine_games_get_exact_or_played_out_labels(lake):
    by_game = collections.defaultdict(list)
    for _, rec in _all_records(lake["shards"]):
        if rec.move_number >= 8:  # earlier positions may carry merged targets (capped openings)
            by_game[rec.game_id].append(rec)
    for game in lake["finished"]:
        assert by_game[game.game_id]
        final = L.replay(game).ownership().astype(np.float32)
        for rec in by_game[game.game_id]:
            assert np.allclose(rec.ownership, final * rec.to_play)
            assert rec.ownership_weight == 1.0 and rec.value == game.winner * rec.to_play
    for game in lake["resigned"]:
        assert by_game[game.game_id]
        for rec in by_game[game.game_id]:
            assert rec.ownership_weight == 0.5 and rec.value == game.winner * rec.to_play
    labels = lake["manifest"]["labels"]
    assert labels["played_out_random"] == len(lake["resigned"])
    # Synthetic games are not legal Go (their captures are random): they do not
    # replay, so their recorded final board is scored instead.
    assert labels["final_board"] == lake["manifest"]["input"]["games_read"] - len(lake["resigned"])
    assert labels["replay_failed"] >= 1 and labels["unlabelled"] == 0


def test_manifest_is_complete_and_temporaries_are_gone(lake):
    manifest = lake["manifest"]
    assert manifest["target_generation"] == 1 and manifest["board_size"] == 9
    assert manifest["positions"] == sum(len(r) for r in lake["shards"].values())
    assert all(name.startswith(manifest["attempt"]) and name.endswith(schema.SHARD_SUFFIX)
               for name in manifest["shards"])
    leftovers = [f for _, _, files in os.walk(os.path.join(lake["root"], "tmp")) for f in files]
    assert leftovers == []
    # Nor empty folders (tmp/shuffle-*/parts/..., shards/...): deletes prune them, as an object store has none.
    empty = [d for d, folders, files in os.walk(os.path.join(lake["root"], "tmp")) if not folders and not files]
    assert empty == []


def test_a_finished_window_is_not_redone(lake, capsys):
    folder = os.path.join(lake["root"], layout.WINDOWS_DIR, layout.generation_dir(1))
    before = sorted(os.listdir(folder))
    assert main(["--root", lake["root"], "--workers", "1"]) == 0
    assert sorted(os.listdir(folder)) == before
    assert "already has a manifest" in capsys.readouterr().out


def test_a_mismatching_board_flag_is_refused(lake, capsys):
    assert main(["--root", lake["root"], "--board-size", "19"]) == 2
    err = capsys.readouterr().err
    assert "--board-size 19" in err and layout.RUN_CONFIG in err


def test_a_root_without_run_json_is_refused(tmp_path, capsys):
    assert main(["--root", str(tmp_path)]) == 2
    assert layout.RUN_CONFIG in capsys.readouterr().err


def test_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--window-exponent", "--position-cap", "--reuse", "--shard-gzip-level", "--playout-labels"):
        assert flag in out


def test_only_the_two_known_beam_warnings_are_silenced():
    import logging
    from pipeline.shuffle import _DropHarmlessBeamWarnings

    keep = _DropHarmlessBeamWarnings().filter

    def record(message, *args):
        return logging.LogRecord("beam", logging.WARNING, __file__, 1, message, args, None)

    # The runner forwards worker logs as 'Worker: %s' with the entry as an argument.
    assert not keep(record("Worker: %s", 'severity: WARN message: "No semi_persistent_directory found: ..."'))
    assert not keep(record("If direct_num_workers is not equal to 1, direct_running_mode should be ..."))
    assert keep(record("Worker: severity: ERROR message: \"Error processing instruction bundle_3\""))


def test_a_lake_of_only_skipped_chunks_is_one_line_and_no_manifest(tmp_path, capsys):
    root = str(tmp_path)
    write_run_json(root, 9)
    # Chunks that decode but belong to another run (19x19 games in a 9x9 lake):
    # the job skips every one of them, so the window would be empty.
    rng = np.random.default_rng(1)
    for seq in range(2):
        write_chunk(root, 0, [synthetic_game(rng, 19, visits=10, generation=0)], seq)
    assert main(["--root", root, "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "would hold no positions" in err and "Traceback" not in err
    assert not os.path.exists(os.path.join(root, layout.window_manifest(1)))


def test_a_write_that_fails_mid_job_is_one_line_naming_the_object(tmp_path):
    """The disk refuses a shard (a file stands where the window's folder must be made): one line that
    names the shard and why, exit 2, no traceback, from the driver or from either worker process
    (two workers: Beam then sends their errors back as text)."""
    import subprocess
    import sys

    root = tmp_path / "lake"
    write_run_json(str(root), 9)
    rng = np.random.default_rng(3)
    write_chunk(str(root), 0, [synthetic_game(rng, 9, visits=8, generation=0) for _ in range(6)], 0)
    (root / layout.WINDOWS_DIR).mkdir()
    (root / layout.window_dir(1)).write_bytes(b"")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-m", "pipeline.shuffle", "--root", str(root), "--workers", "2",
                           "--random-playouts", "4"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write "), done.stderr
    assert str(root / layout.window_dir(1)) + "/" in lines[0]
    assert not (root / layout.TMP_DIR).exists()            # its temporary pieces removed all the same


def test_value_only_rows_zero_writes_only_rows_with_a_policy_target(tmp_path):
    # In-process runner, one worker: a few seconds.  Every record of the window then teaches
    # the policy, the manifest counts the rows dropped, and reuse still copies what is kept.
    root = str(tmp_path)
    write_run_json(root, 9)
    rng = np.random.default_rng(6)
    games = [synthetic_game(rng, 9, visits=20, generation=0, full_search_fraction=0.25) for _ in range(12)]
    write_chunk(root, 0, games, 0)
    assert main(["--root", root, "--workers", "1", "--random-playouts", "4", "--reuse", "1",
                 "--dedup-max-move", "0", "--value-only-rows", "0"]) == 0
    manifest, shards = read_window(root, 1)
    records = [rec for recs in shards.values() for rec in recs]
    with_target = sum(int(np.count_nonzero(g.full_search)) for g in games)
    assert len(records) == with_target and all(rec.policy_weight > 0 for rec in records)
    assert manifest["input"]["value_only_rows_dropped"] == sum(g.num_positions for g in games) - with_target


def test_sample_games_decodes_a_share_of_the_games_for_the_same_rows(tmp_path):
    # 40 games in 4 chunks at --reuse 0.25: every game decoded, or a half (0.25 x 2) with their
    # positions kept at 0.5; the rows stay about the same, the games in the window halve.
    rng = np.random.default_rng(8)
    games = [synthetic_game(rng, 9, visits=20, generation=0, full_search_fraction=0.25) for _ in range(40)]
    positions = sum(g.num_positions for g in games)
    windows = {}
    for sample in ("0", "2"):
        root = str(tmp_path / sample)
        write_run_json(root, 9)
        for seq in range(4):
            write_chunk(root, 0, games[10 * seq:10 * seq + 10], seq)
        assert main(["--root", root, "--workers", "1", "--random-playouts", "4", "--reuse", "0.25",
                     "--dedup-max-move", "0", "--sample-games", sample, "--seed", "3"]) == 0
        manifest, shards = read_window(root, 1)
        windows[sample] = (manifest, [rec for recs in shards.values() for rec in recs])
    every, sampled = windows["0"], windows["2"]
    assert len(every[0]["games"]) == 40 and 8 <= len(sampled[0]["games"]) <= 32
    assert sampled[0]["input"]["positions_read"] < positions == every[0]["input"]["positions_read"]
    for _, records in (every, sampled):
        expected = 0.25 * positions
        assert abs(len(records) - expected) < 5 * np.sqrt(expected)
    # Each sampled game gives about twice the rows of a game when every game is decoded.
    per_game = {k: len(w[1]) / len(w[0]["games"]) for k, w in windows.items()}
    assert per_game["2"] > 1.4 * per_game["0"]

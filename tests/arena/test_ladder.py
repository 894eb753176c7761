"""arena.ladder: schedule, resume from the results file, SGF, report and plots on a tiny lake.

The lake: a 7x7 run.json, a few synthetic self-play chunks of generations 0 and
1, and two untrained 1-block models published as generations 1 and 2 with
the metadata a trainer writes (creation time, the window's training metrics).
Budgets are tiny (4 visits, 2 games a pairing) so the file runs in seconds;
the GNU Go test plays two level-1 games.
"""
import dataclasses
import json
import os
import time

import numpy as np
import pytest

from cloud.storage import open_storage
from format import codec, layout
from format.match_record import ClosingRecord
from format import schema
from format.run_config import RunConfig, ensure_run_config
from format.sgf import game_from_sgf
from engine.board import Board
from arena.elo import elo_gap
from arena.ladder import (ANCHOR_GAMES_DIR, CLI, STORE_MADE, STORE_RESULTS, Ladder, LadderConfig, anchor_chain,
                          distinct_games, game_digest, ladder_conditions, main, pair_records, read_results,
                          read_stored_games, run, store_folder, write_results)
from arena.ladder_report import chunk_counts
from arena.match import GameResult, sgf_bytes, summarize
from testdata.models import publish_untrained_model
from testdata.synthetic_games import synthetic_game

import tensorflow  # noqa: F401  (a required dependency: a broken install must fail, not skip)

N = 7
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def publish_model(root, generation, created_unix, metrics):
    publish_untrained_model(root, generation, N, metadata={"created_unix": created_unix,
                                                          "training_metrics": metrics})


@pytest.fixture(scope="module")
def lake_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ladder") / "lake")
    storage = open_storage(root)
    ensure_run_config(storage, RunConfig(board_size=N))
    rng = np.random.default_rng(5)
    start_ms = int(time.time() * 1000) - 3_600_000          # the run started an hour ago
    for generation, chunks in ((0, 2), (1, 1)):
        for seq in range(chunks):
            games = [synthetic_game(rng, N, visits=8) for _ in range(3)]
            path = layout.chunk_path(generation, "w", start_ms + 1000 * generation + seq, seq)
            storage.write_new(path, codec.encode_chunk(games))
    publish_model(root, 1, start_ms / 1000 + 1800, {"policy_loss": 3.5, "value_loss": 0.9,
                                                    "occupied_policy_mass": 0.4})
    publish_model(root, 2, start_ms / 1000 + 3600, {"policy_loss": 3.1, "value_loss": 0.8,
                                                    "occupied_policy_mass": 0.2})
    return root


def config(root, **overrides):
    values = dict(root=root, anchors="random,playouts:2", games=2, visits=4, opening_moves=2,
                  parallel_games=4, give_up_score=-1.0)   # every generation meets every anchor
    values.update(overrides)
    return LadderConfig(**values)


def test_the_ladder_plays_its_schedule_then_only_missing_games(lake_root, tmp_path):
    storage = open_storage(lake_root)
    report = run(config(lake_root), log=lambda line: None)
    games = read_results(storage)
    pairings = sorted({g.pairing for g in games})
    assert pairings == sorted(["playouts-2_vs_random", "gen-1_vs_random", "gen-1_vs_playouts-2",
                               "gen-2_vs_random", "gen-2_vs_playouts-2", "gen-2_vs_gen-1"])
    assert len(games) == 12 and report["games_played_now"] == 12
    for game in games:
        # Colours alternate: a is Black in even-numbered games.
        assert (game.black, game.white) == ((game.a, game.b) if game.index % 2 == 0 else (game.b, game.a))
        size, komi, moves, result = game_from_sgf(storage.read(game.sgf))
        assert (size, komi, len(moves)) == (N, 7.5, game.moves)
        board = Board(N, komi)
        for move in moves:
            board.play(move)
        if game.end_reason == "two-passes":
            assert np.sign(board.area_score()) == game.winner
    assert set(report["ratings"]) == {"random", "playouts:2", "gen:1", "gen:2"}
    # The default anchor, gnugo:1, did not play: one of the ladder's own anchors is 0 instead.
    assert report["anchor"] in ("random", "playouts:2") and "gnugo:1 has no games" in report["anchor_reason"]
    assert report["ratings"][report["anchor"]]["elo"] == 0.0
    assert report["duplicate_games_dropped"] == 0 and all(g.digest for g in games)

    # Same settings: nothing is replayed.  One more game a pairing: one new game each,
    # index 2 with a as Black again.
    assert run(config(lake_root), log=lambda line: None)["games_played_now"] == 0
    more = run(config(lake_root, games=3), log=lambda line: None)
    # Two games of untrained networks can repeat (the fit counts them once), so 18 less the repeats.
    assert more["games_played_now"] == 6 and more["games_in_fit"] == 18 - more["duplicate_games_dropped"]
    games = read_results(storage)
    for pairing in pairings:
        mine = sorted(g.index for g in games if g.pairing == pairing)
        assert mine == [0, 1, 2]
    assert all(g.black == g.a for g in games if g.index == 2)
    # Other conditions start their own set and do not mix into the fit.
    other = run(config(lake_root, visits=3, generations="2", adjacent=False), log=lambda line: None)
    assert other["games_in_fit"] == other["games_played_now"] == 6
    assert "gen:1" not in other["ratings"]
    # --give-up-score: a generation climbs past an anchor only if it scored more than that.
    run(config(lake_root, visits=5, generations="1", adjacent=False, games=1, give_up_score=0.99),
        log=lambda line: None)
    mine = {g.pairing: g for g in read_results(storage) if "visits 5 " in g.conditions}
    climbed = mine["gen-1_vs_random"].score_a == 1.0
    assert ("gen-1_vs_playouts-2" in mine) == climbed and len(mine) == 2 + climbed


def test_the_report_holds_the_table_json_and_plots(lake_root, monkeypatch):
    from arena import ladder_report

    storage = open_storage(lake_root)
    titles = []
    real_png = ladder_report._png
    monkeypatch.setattr(ladder_report, "_png", lambda figure: titles.append(
        (figure.axes[0].get_title(), figure.axes[0].get_xlabel())) or real_png(figure))
    report = run(config(lake_root), log=lambda line: None)
    # Each rating plot is titled and labelled by its axis (a point's label once overwrote both).
    for axis in ("hours", "games", "positions"):
        assert any(axis in xlabel and axis in title for title, xlabel in titles), titles
    for name in ("rating-vs-hours.png", "rating-vs-games.png", "rating-vs-positions.png",
                 "training-losses.png", "illegal-move-mass.png"):
        assert storage.read(layout.report_path(name)).startswith(PNG_MAGIC), name
    assert "gen:2" in storage.read(layout.report_path("ratings.txt")).decode()
    document = json.loads(storage.read(layout.report_path("ratings.json")))
    counts = chunk_counts(storage)
    gen0_positions = sum(c[1] for p, c in counts.items() if layout.parse_chunk_path(p).generation == 0)
    assert document["generations"]["1"]["games"] == 6 and document["generations"]["1"]["positions"] == gen0_positions
    assert document["generations"]["2"]["games"] == 9
    assert document["generations"]["2"]["hours"] == pytest.approx(1.0, abs=0.01)
    assert document["generations"]["2"]["training_metrics"]["occupied_policy_mass"] == 0.2
    assert report["table"].splitlines()[0].startswith("Elo (")


def test_bad_flags_and_lakes_are_refused_with_the_flag_named(lake_root, tmp_path, capsys):
    for argv, named in ((["--anchor", "uniform"], "--anchor: 'uniform' is not a fixed anchor"),
                        (["--anchor", "gnugo:x"], "--anchor: "),
                        (["--anchors", "random,model:x"], "not a fixed anchor"),
                        (["--games", "0"], "--games"),
                        (["--generations", "1,x"], "--generations")):
        with pytest.raises(SystemExit) as exc:
            CLI.parse(["--root", lake_root, *argv])
        assert exc.value.code == 2 and named in capsys.readouterr().err
    assert main(["--root", lake_root, "--generations", "7"]) == 2
    assert "--generations: [7] not published" in capsys.readouterr().err
    assert main(["--root", str(tmp_path / "empty")]) == 2
    assert "run.json does not exist" in capsys.readouterr().err
    open_storage(lake_root).write_replace(layout.ladder_results(), b'{"version": 1, "pairing": 3}\n')
    with pytest.raises(ValueError, match="results.jsonl line 1"):
        Ladder(config(lake_root))
    open_storage(lake_root).delete(layout.ladder_results())


@pytest.mark.gnugo
def test_gnugo_anchors_play_through_the_match_players(tmp_path):
    root = str(tmp_path / "lake")
    ensure_run_config(open_storage(root), RunConfig(board_size=9))
    report = run(LadderConfig(root=root, anchors="random,gnugo:1", games=2, plots=False), log=lambda line: None)
    games = read_results(open_storage(root))
    assert [g.pairing for g in games] == ["gnugo-1_vs_random"] * 2
    assert all(g.score_a == 1.0 for g in games)                  # GNU Go beats random moves
    assert games[0].winner == schema.BLACK
    # gnugo:1 is the anchor; random, which lost every game, has no estimate, only an upper bound:
    # where losing both games had a 2.5% chance, so two games bound it only at +290.
    assert report["anchor"] == "gnugo:1" and report["ratings"]["gnugo:1"]["elo"] == 0.0
    random = report["ratings"]["random"]
    assert random["elo"] is None and random["low"] is None
    assert random["high"] == pytest.approx(elo_gap(1 - 0.025 ** 0.5), abs=1e-6)
    assert random["estimate"] == f"<= {random['high']:.0f}"


def test_repeated_games_count_once_and_old_lines_get_their_digest_from_the_sgf(lake_root):
    """A pairing whose results hold the same game twice (as two fresh deterministic engines
    would play it) is fitted with it once; lines written before digests were kept get them
    from their SGF, and the file is saved with them."""
    storage = open_storage(lake_root)
    cfg = config(lake_root, visits=6, generations="2", adjacent=False)
    run(cfg, log=lambda line: None)
    mine = [g for g in read_results(storage) if " visits 6 " in g.conditions]
    others = [g for g in read_results(storage) if " visits 6 " not in g.conditions]
    repeat = dataclasses.replace(mine[0], index=len(mine), digest=None)
    without_digests = [dataclasses.replace(g, digest=None) for g in mine] + [repeat]
    write_results(storage, others + without_digests)
    report = run(cfg, log=lambda line: None)
    assert report["games_played_now"] == 0
    assert report["duplicate_games_dropped"] == 1 and report["games_in_fit"] == len(mine)
    assert "1 repeated games" in report["table"]
    saved = [g for g in read_results(storage) if " visits 6 " in g.conditions]
    assert [g.digest for g in saved] == [g.digest for g in mine] + [mine[0].digest]
    kept, dropped = distinct_games(saved, saved[0].conditions)
    assert dropped == 1 and len(pair_records(saved, saved[0].conditions)) == len(mine)


def test_the_report_says_what_the_fit_is_and_how_much_the_prior_moves_it(lake_root):
    report = run(config(lake_root, plots=False), log=lambda line: None)
    lines = report["table"].splitlines()
    assert "maximum likelihood (no prior)" in lines[0] and "profile-likelihood" in lines[0]
    assert lines[1].startswith("anchor: ")
    assert any(line.startswith("prior sensitivity: with 2 instead of 0 virtual draws") for line in lines)
    assert report["prior_sensitivity"]["compared_prior_draws"] == 2.0
    with_prior = run(config(lake_root, plots=False, prior_draws=2.0), log=lambda line: None)
    assert "2 virtual draws per pairing" in with_prior["table"].splitlines()[0]
    assert with_prior["prior_sensitivity"]["compared_prior_draws"] == 0.0
    assert all(r["elo"] is not None for r in with_prior["ratings"].values())   # the prior makes all finite


# --- stored anchor games and the loop's closing match --------------------------------------------

def anchors_only(root, **overrides):
    """A ladder of two anchors only (the roots below publish no generation)."""
    values = dict(root=root, anchors="random,playouts:2", games=2, visits=4, opening_moves=2, parallel_games=4,
                  plots=False)
    values.update(overrides)
    return LadderConfig(**values)


def test_stored_anchor_games_are_recorded_once_then_counted_instead_of_replayed(tmp_path):
    store = str(tmp_path / "store")
    quiet = dict(log=lambda line: None, anchor_store=store)
    # Recording: a fresh root gets the default run.json; the chain is played there and copied to the store.
    recording = str(tmp_path / "recording")
    report = run(anchors_only(recording, record_anchor_games=True), command="python -m arena.ladder ...", **quiet)
    assert report["games_played_now"] == 2 and report["stored_anchor_games"]["held"] == 2
    conditions = read_results(open_storage(recording))[0].conditions
    assert conditions == "9x9 komi 7.5 visits 4 opening 2 cap 0"
    folder = open_storage(store_folder(store, conditions))
    stored = read_results(folder, STORE_RESULTS)
    assert [(g.pairing, g.index) for g in stored] == [("playouts-2_vs_random", 0), ("playouts-2_vs_random", 1)]
    assert all(game_from_sgf(folder.read(g.sgf))[0] == 9 for g in stored)
    made = json.loads(folder.read(STORE_MADE))
    assert made["conditions"] == conditions and made["sessions"][0]["command"] == "python -m arena.ladder ..."
    assert made["sessions"][0]["games_added"] == {"playouts-2_vs_random": 2}
    # Recording again adds nothing: the lake's games are the store's (counted once, not replayed).
    again = run(anchors_only(recording, record_anchor_games=True), **quiet)
    assert again["games_played_now"] == 0 and len(json.loads(folder.read(STORE_MADE))["sessions"]) == 1

    # Another lake of the same conditions plays no anchor game and fits the stored ones.
    lake = str(tmp_path / "lake")
    ensure_run_config(open_storage(lake), RunConfig(board_size=9))
    report = run(anchors_only(lake), **quiet)
    assert report["games_played_now"] == 0 and read_results(open_storage(lake)) == []
    assert report["games_in_fit"] == 2 and report["stored_anchor_games"]["in_fit"] == 2
    assert "2 distinct games in the fit (2 stored anchor games)" in report["table"]
    assert set(report["ratings"]) == {"random", "playouts:2"}
    # One more game a pairing than the store holds: only that one is played in the lake, as index 2 (a Black).
    more = run(anchors_only(lake, games=3), **quiet)
    assert more["games_played_now"] == 1 and more["games_in_fit"] == 3
    [new] = read_results(open_storage(lake))
    assert (new.index, new.black) == (2, "playouts:2")
    # Other conditions: the store holds nothing for them, so the lake plays the chain.
    other = run(anchors_only(lake, visits=3), **quiet)
    assert other["games_played_now"] == 2 and other["stored_anchor_games"]["held"] == 0
    # --no-stored-anchor-games: the store is not read.
    alone = run(anchors_only(lake, stored_anchor_games=False, games=3), **quiet)
    assert alone["games_played_now"] == 2 and alone["stored_anchor_games"] is None


def test_a_stored_game_that_is_not_an_anchor_game_of_its_folder_is_refused(tmp_path):
    store = str(tmp_path / "store")
    lake = str(tmp_path / "lake")
    ensure_run_config(open_storage(lake), RunConfig(board_size=9))
    run(anchors_only(lake), log=lambda line: None, anchor_store=str(tmp_path / "none"))
    [game, *_] = read_results(open_storage(lake))
    folder = open_storage(store_folder(store, game.conditions))
    write_results(folder, [dataclasses.replace(game, conditions="9x9 komi 7.5 visits 5 opening 2 cap 0")],
                  STORE_RESULTS)
    with pytest.raises(ValueError, match="results.jsonl: playouts-2_vs_random game 0 is of other conditions"):
        Ladder(anchors_only(lake), anchor_store=store)
    write_results(folder, [dataclasses.replace(game, a="gen:1", pairing="gen-1_vs_random")], STORE_RESULTS)
    with pytest.raises(ValueError, match="is not between fixed anchors"):
        Ladder(anchors_only(lake), anchor_store=store)


def write_closing_match(storage, generation, outcomes, *, per_game=True, visits=256):
    """``loop/final-<G>.json`` as operations.loop writes it: ``vs_gnugo_1``, the match's JSON (A is the
    network, Black in even-numbered games) with its visits, each game's SGF in the lake.  ``outcomes``:
    per game, whether the network won and its moves."""
    results = []
    for index, (won, moves) in enumerate(outcomes):
        a_black = index % 2 == 0
        winner = schema.BLACK if won == a_black else schema.WHITE
        result = GameResult(index, "model-g" if a_black else "gnugo-l1", "gnugo-l1" if a_black else "model-g",
                            tuple(moves), winner, None, "resign")
        path = layout.loop_marker(f"final-{layout.generation_dir(generation)}-gnugo-1/{index:05d}.sgf")
        storage.write_replace(path, sgf_bytes(result, N, 7.5))
        results.append(dataclasses.replace(result, sgf_path=path))
    match = summarize("model-g", "gnugo-l1", N, 7.5, results, 1.0).to_record()
    totals = dataclasses.replace(match, game_results=None)
    closing = ClosingRecord(vs_random=totals, vs_generation_0=totals,   # not what the ladder reads
                            vs_gnugo_1=dataclasses.replace(match if per_game else totals, visits=visits))
    storage.write_new(layout.loop_marker(f"final-{layout.generation_dir(generation)}.json"), closing.to_bytes())


def test_the_loops_closing_games_are_their_own_player_in_the_fit(tmp_path):
    lake = str(tmp_path / "lake")
    storage = open_storage(lake)
    ensure_run_config(storage, RunConfig(board_size=N))
    # Generation 2's network won 3 of 4 distinct games (game 4 repeats game 0), generation 3's 1 of 4;
    # generation 4's result was written by an older loop, without per-game results: 1 of 2.
    write_closing_match(storage, 2, [(True, [1, 2]), (True, [3, 4]), (False, [5, 6]), (True, [7, 8]),
                                     (True, [1, 2])])
    write_closing_match(storage, 3, [(False, [1, 2]), (False, [3, 4]), (True, [5, 6]), (False, [7, 8])])
    write_closing_match(storage, 4, [(True, [1]), (False, [2])], per_game=False)
    report = run(anchors_only(lake, plots=True), log=lambda line: None, anchor_store=str(tmp_path / "none"))
    assert storage.read(layout.report_path("rating-vs-games.png")).startswith(PNG_MAGIC)   # crosses drawn
    ratings = report["ratings"]
    assert report["anchor"] == "gnugo:1" and ratings["gnugo:1"]["elo"] == 0.0
    assert ratings["gen:2@256"]["elo"] > 0 and ratings["gen:2@256"]["elo"] == pytest.approx(elo_gap(3 / 4), abs=0.5)
    assert ratings["gen:3@256"]["elo"] < 0 and ratings["gen:3@256"]["elo"] == pytest.approx(elo_gap(1 / 4), abs=0.5)
    assert ratings["gen:4@256"]["elo"] == pytest.approx(0.0, abs=0.5)
    assert ratings["gen:2@256"]["games"] == 4                         # the repeat counts once
    closing = {m["player"]: m for m in report["closing_matches"]}
    assert (closing["gen:2@256"]["games"], closing["gen:2@256"]["distinct"], closing["gen:2@256"]["repeats"]) == (5, 4, 1)
    assert closing["gen:4@256"]["per_game"] is False and closing["gen:4@256"]["distinct"] == 2
    assert report["games_in_fit"] == 2 + 4 + 4 + 2 and report["duplicate_games_dropped"] == 1
    assert "gen:2@256: generation 2's network at 256 visits a move in the loop's closing match" in report["table"]
    assert "(2 stored anchor games" not in report["table"] and "10 closing-match games" in report["table"]


def test_the_shipped_store_covers_the_default_ladders_anchor_chain():
    """arena/anchor_games holds, for the default conditions, at least --games' default of distinct games a
    pairing of the default anchor chain; each line's digest is its SGF's game."""
    defaults = LadderConfig(root="unused")
    conditions = ladder_conditions(9, 7.5, defaults.visits, defaults.opening_moves, defaults.max_moves)
    stored = read_stored_games(ANCHOR_GAMES_DIR, conditions, defaults.anchor_names())
    folder = open_storage(store_folder(ANCHOR_GAMES_DIR, conditions))
    for pairing in anchor_chain(defaults.anchor_names()):
        kept, _ = distinct_games([g for g in stored if g.pairing == pairing.name], conditions)
        assert len(kept) >= defaults.games, pairing.name
    for game in stored:
        _, _, moves, _ = game_from_sgf(folder.read(game.sgf))
        assert game_digest(game.black, game.white, moves, game.winner, game.end_reason) == game.digest
    # The shipped store was recorded before the ladder moved to arena/ (its made.json keeps that command).
    command = json.loads(folder.read(STORE_MADE))["sessions"][0]["command"]
    assert command.startswith(("python -m arena.ladder ", "python -m selfplay.ladder "))

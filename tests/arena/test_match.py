"""Tests of match evaluation (`arena.match`) and the players it runs.

Covers the Wilson interval against published values, the counting of a
match from A's side, that search makes a player stronger (MCTS with
playout values beats random moves on 9x9, judged by binomial bounds with
stated error rates), that matches are reproducible from their seeds,
that SGF files round-trip through sgfmill, and a game against GNU Go.
"""
import dataclasses
import json
import math
import os

import pytest
from sgfmill import sgf

from format import schema
from engine.board import Board
from arena.match import (
    END_ILLEGAL, END_RESIGN, END_TWO_PASSES, GameResult, PlayerSpec, evaluate, main, play_games,
    summarize, wilson_interval,
)
from inference.evaluator import UniformEvaluator
from arena.gtp_client import GnuGoNotFound, find_gnugo
from inference.loading import PlayoutEvaluator
from arena.player import (RESIGN, BasePlayer, MctsConfig, MctsPlayer, Player, RandomPlayer, SearchBudget,
                          gnugo_player)
from testdata.models import publish_untrained_model


# ---- win-rate arithmetic ---------------------------------------------------

@pytest.mark.parametrize("successes, trials, low, high", [
    (8, 10, 0.4902, 0.9433),      # Wilson (1927) / Newcombe (1998) worked values
    (0, 10, 0.0, 0.2775),
    (10, 10, 0.7225, 1.0),
    (50, 100, 0.4038, 0.5962),
    (81, 263, 0.2553, 0.3662),    # Newcombe (1998), Table I example
])
def test_wilson_interval_matches_published_values(successes, trials, low, high):
    got = wilson_interval(successes, trials)
    assert got == pytest.approx((low, high), abs=5e-4)


def test_wilson_interval_properties():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(3, 10)
    assert (1 - high, 1 - low) == pytest.approx(wilson_interval(7, 10))     # symmetric
    widths = [high - low for low, high in (wilson_interval(n // 2, n) for n in (10, 100, 1000))]
    assert widths[0] > widths[1] > widths[2]
    low, high = wilson_interval(2.5, 5)            # draws count half: fractional successes
    assert (low + high) / 2 == pytest.approx(0.5) and 0 < low < high < 1
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def make_game(index, winner, moves=3):
    black, white = ("A", "B") if index % 2 == 0 else ("B", "A")
    return GameResult(index, black, white, tuple(range(moves)), winner,
                      None if winner == schema.EMPTY else 1.5 * winner, END_TWO_PASSES)


def test_summarize_counts_from_a_side_with_colours_and_draws():
    games = [make_game(0, schema.BLACK), make_game(1, schema.WHITE), make_game(2, schema.WHITE),
             make_game(3, schema.EMPTY), make_game(4, schema.BLACK, moves=7)]
    # A is Black in 0, 2, 4: wins 0 and 4; White in 1, 3: wins 1, draws 3.
    result = summarize("A", "B", 9, 7.5, games, seconds=1.0)
    assert (result.wins, result.losses, result.draws) == (3, 1, 1)
    assert (result.wins_as_black, result.wins_as_white) == (2, 1)
    assert result.win_rate == pytest.approx(3.5 / 5)
    assert (result.ci_low, result.ci_high) == pytest.approx(wilson_interval(3.5, 5))
    assert result.mean_moves == pytest.approx(19 / 5)
    text = json.dumps(result.to_json_dict())
    assert json.loads(text)["game_results"][3]["result"] == "0"


def test_result_text():
    assert make_game(0, schema.BLACK).result_text == "B+1.5"
    assert make_game(0, schema.WHITE).result_text == "W+1.5"
    resigned = GameResult(0, "A", "B", (), schema.WHITE, None, END_RESIGN)
    assert resigned.result_text == "W+R"
    assert GameResult(0, "A", "B", (), schema.BLACK, None, END_ILLEGAL).result_text == "B+F"


def test_player_specs():
    assert PlayerSpec.parse("model:gs://bucket/run@12") == PlayerSpec("model", "gs://bucket/run", 12)
    assert PlayerSpec.parse("model:/data/run") == PlayerSpec("model", "/data/run", None)
    assert PlayerSpec.parse("gnugo:5") == PlayerSpec("gnugo", level=5)
    assert PlayerSpec.parse("gnugo").level == 1
    assert PlayerSpec.parse("playouts:4").playouts == 4
    for bad in ("model:", "model:/x@", "model:/x@g2", "gnugo:11", "gnugo:x", "playouts:0", "alphago"):
        with pytest.raises(ValueError, match="player"):
            PlayerSpec.parse(bad)


# ---- playing ----------------------------------------------------------------

def mcts(evaluator, visits, seed=0, name=None, leaves_per_game=8):
    config = MctsConfig(budget=SearchBudget(visits), seed=seed, leaves_per_game=leaves_per_game)
    return MctsPlayer(evaluator, config, name=name)


def test_players_follow_the_protocol():
    for player in (RandomPlayer(), mcts(UniformEvaluator(9), 4)):
        assert isinstance(player, Player)


def binomial_cdf(k, n, p):
    """P(X <= k) for X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


STRENGTH_GAMES = 32
"""One lockstep batch of games (evaluate's parallel_games), 16 with each colour."""
MIN_WINS, MIN_WINS_PER_COLOUR = 24, 10
ASSUMED_WIN_RATE = 0.9
"""A conservative floor under the measured strength: 136 wins in 138 games over
five seed sets (32/32 with this test's seeds; 31/32, 31/32, 32/32 and 10/10 with
others), whose Wilson 95% interval is 0.949..0.996."""


def test_strength_bounds_have_the_stated_error_rates():
    # False failure, if the true win rate is at least ASSUMED_WIN_RATE:
    #   P(wins < 24 of 32) = 0.0033, P(wins < 10 of 16) = 0.0005 per colour: <= 0.0044 in all.
    false_failure = (binomial_cdf(MIN_WINS - 1, STRENGTH_GAMES, ASSUMED_WIN_RATE)
                     + 2 * binomial_cdf(MIN_WINS_PER_COLOUR - 1, STRENGTH_GAMES // 2, ASSUMED_WIN_RATE))
    assert false_failure < 0.005
    # False pass: a player no better than random moves (win rate 0.5) reaches 24 of 32 with P = 0.0035.
    assert 1 - binomial_cdf(MIN_WINS - 1, STRENGTH_GAMES, 0.5) < 0.004


def test_search_beats_random_moves_on_9x9():
    """MCTS whose values come from random playouts wins most games against
    random moves.  The thresholds are binomial bounds fixed in advance
    (test_strength_bounds_have_the_stated_error_rates), not tuned to seeds:
    a player as strong as measured fails with probability below 0.5%, a
    player no stronger than random passes with probability below 0.4%,
    whatever the seeds."""
    strong = mcts(PlayoutEvaluator(9, 7.5, playouts=8, seed=1), 48, seed=1, name="playouts",
                  leaves_per_game=4)
    result = evaluate(strong, RandomPlayer(seed=2), games=STRENGTH_GAMES, board_size=9, komi=7.5)
    assert result.games == STRENGTH_GAMES and result.draws == 0, result.summary()   # komi 7.5: no draws
    assert result.wins >= MIN_WINS, result.summary()
    assert min(result.wins_as_black, result.wins_as_white) >= MIN_WINS_PER_COLOUR, result.summary()


def test_matches_are_reproducible_from_their_seeds():
    def match(seed):
        a = mcts(UniformEvaluator(9), 8, seed=seed, name="uniform")
        b = RandomPlayer(seed=seed + 100)
        return play_games(a, b, games=4, board_size=9, komi=7.5, parallel_games=4)

    first, again, other = match(5), match(5), match(6)
    assert [g.moves for g in first] == [g.moves for g in again]
    assert [g.moves for g in first] != [g.moves for g in other]
    assert [(g.black, g.white) for g in first] == [("uniform", "random"), ("random", "uniform")] * 2
    for game in first:     # every game is a legal game that ended as recorded
        board = Board(9, 7.5)
        for move in game.moves:
            board.play(move)
        assert board.is_over and board.area_score() == game.score


def test_lockstep_games_share_evaluator_batches():
    """With several games at once, each search step of an MCTS player is one
    evaluator call for all the games where it is to move."""
    calls = {}
    for parallel in (1, 6):
        player = mcts(UniformEvaluator(9), 8, name="uniform")
        results = play_games(player, RandomPlayer(3), games=6, board_size=9, komi=7.5,
                             parallel_games=parallel)
        assert sorted(g.index for g in results) == list(range(6))
        calls[parallel] = player.evaluator_calls
    assert calls[6] < 0.5 * calls[1], calls


class Resigner(BasePlayer):
    name = "resigner"

    def select_move(self, board):
        return RESIGN


class Cheater(BasePlayer):
    name = "cheater"

    def select_move(self, board):
        return 0          # A9 every time: illegal once occupied


def test_resignation_and_illegal_moves_end_the_game():
    results = play_games(Resigner(), RandomPlayer(), games=2, board_size=9, komi=7.5)
    assert [g.result_text for g in results] == ["W+R", "B+R"]
    assert [len(g.moves) for g in results] == [0, 1]
    results = play_games(Cheater(), RandomPlayer(), games=1, board_size=9, komi=7.5)
    assert results[0].end_reason == END_ILLEGAL and results[0].winner == schema.WHITE


class Passer(BasePlayer):
    name = "passer"

    def select_move(self, board):
        return board.pass_move


@pytest.mark.parametrize("size", [9, 19])
def test_with_the_pass_rule_a_player_answers_a_pass_once_it_is_ahead(size):
    """A player that passes every move: with the pass rule the searcher ends the game as
    soon as the board as it stands wins for it (Black after one stone, White at once by
    komi); without it, the searcher must fill its whole area first."""
    pass_move = size * size
    for rule in (True, False):
        # Uniform priors: PUCT tries PASS, the last child, once it has tried the others.
        visits = size * size + 20 if rule else 4
        config = MctsConfig(budget=SearchBudget(visits), seed=3, pass_when_winning=rule)
        games = play_games(MctsPlayer(UniformEvaluator(size), config, name="searcher"), Passer(), games=2,
                           board_size=size, komi=7.5, parallel_games=2)
        assert [g.winner for g in games] == [schema.BLACK, schema.WHITE]
        assert all(g.end_reason == END_TWO_PASSES for g in games)
        if rule:
            black_game, white_game = games
            assert len(black_game.moves) == 3 and black_game.moves[1:] == (pass_move, pass_move)
            assert black_game.score == size * size - 7.5
            assert white_game.moves == (pass_move, pass_move) and white_game.score == -7.5
        else:
            assert min(len(g.moves) for g in games) > size * size // 2


def test_the_match_passes_its_pass_rule_to_its_search_players(monkeypatch):
    import arena.match as match_module
    from arena.match import MatchConfig, run

    seen = []
    original = match_module.build_player
    monkeypatch.setattr(match_module, "build_player",
                        lambda spec, size, komi, mcts, seed, loaded=None:
                        seen.append(mcts.pass_when_winning) or original(spec, size, komi, mcts, seed, loaded))
    for rule in (False, True):
        run(MatchConfig(PlayerSpec.parse("uniform"), PlayerSpec.parse("random"), games=1, visits=2,
                        board_size=5, pass_when_winning=rule))
    assert seen == [False, False, True, True]
    assert match_module.CLI.parse(["uniform", "random", "--pass-when-winning"])[0].pass_when_winning


def test_sgf_files_are_written_and_readable(tmp_path):
    result = evaluate(RandomPlayer(1, name="alpha"), RandomPlayer(2, name="beta"), games=2,
                      board_size=9, komi=6.5, sgf_dir=str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["00000-alpha-vs-beta.sgf", "00001-beta-vs-alpha.sgf"]
    for game in result.played:
        with open(game.sgf_path, "rb") as handle:
            parsed = sgf.Sgf_game.from_bytes(handle.read())
        root = parsed.get_root()
        assert parsed.get_size() == 9 and parsed.get_komi() == 6.5
        assert (root.get("PB"), root.get("PW")) == (game.black, game.white)
        assert root.get("RE") == game.result_text
        moves = []
        for node in parsed.get_main_sequence():
            colour, point = node.get_move()
            if colour is not None:
                assert colour == "bw"[len(moves) % 2]
                moves.append(81 if point is None else (8 - point[0]) * 9 + point[1])
        assert tuple(moves) == game.moves


def test_cli_json_output(capsys, tmp_path):
    code = main(["random", "uniform", "--games", "2", "--visits", "4", "--board-size", "7",
                 "--json", "--sgf-dir", str(tmp_path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["games"] == 2 and out["board_size"] == 7
    assert out["wins"] + out["losses"] + out["draws"] == 2
    assert out["player_a"] == "random" and out["player_b"] == "uniform"
    assert len(os.listdir(tmp_path)) == 2


def test_the_match_reports_its_games_and_result_as_events_like_every_role(capsys, tmp_path):
    # The loop reads an evaluation's result from these events, as it reads every other role's progress.
    from format.events import read_events

    events = tmp_path / "match.jsonl"
    assert main(["random", "uniform", "--games", "3", "--visits", "4", "--board-size", "7", "--json",
                 "--events", str(events)]) == 0
    printed = json.loads(capsys.readouterr().out)
    seen = list(read_events(str(events)))
    assert [e["event"] for e in seen if e["event"] != "game_finished"] == ["started", "result", "stopped"]
    assert sorted(e["index"] for e in seen if e["event"] == "game_finished") == [0, 1, 2]
    assert next(e["result"] for e in seen if e["event"] == "result") == printed
    assert seen[0]["player_a"] == "random" and seen[-1]["reason"] == "done"


def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["random", "alphago"])
    assert exc.value.code == 2 and "alphago" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["random", "random", "--games", "0"])
    assert "--games" in capsys.readouterr().err


def test_gnugo_player_plays_a_game():
    try:
        find_gnugo()
    except GnuGoNotFound as exc:
        pytest.fail(f"{exc}; run scripts/setup.sh --test")
    with gnugo_player(level=1) as gnugo:
        result = evaluate(gnugo, RandomPlayer(7), games=2, board_size=9, komi=7.5, parallel_games=8)
    assert result.games == 2 and result.wins == 2, result.summary()
    assert all(g.end_reason in (END_TWO_PASSES, END_RESIGN) for g in result.played)


# ---- a published model ------------------------------------------------------

def publish_tiny_model(root, generation=1, board_size=9):
    """Publish an untrained one-block network as ``generation`` (LATEST moves to it)."""
    publish_untrained_model(root, generation, board_size)


def test_model_spec_plays_a_published_generation(tmp_path):
    from arena.match import MatchConfig, run

    root = str(tmp_path / "lake")
    publish_tiny_model(root, generation=3)
    config = MatchConfig(PlayerSpec.parse(f"model:{root}"), PlayerSpec.parse("random"),
                            games=4, visits=8, parallel_games=4, sgf_dir=str(tmp_path / "sgf"))
    result = run(config)
    assert (result.player_a, result.player_b, result.board_size) == ("model-g3", "random", 9)
    assert result.games == 4 and len(os.listdir(tmp_path / "sgf")) == 4
    for game in result.played:
        board = Board(9, 7.5)
        for move in game.moves:
            board.play(move)
        assert game.end_reason == END_TWO_PASSES or board.move_number == board.max_moves
    with pytest.raises(Exception, match="not published"):
        run(dataclasses.replace(config, player_a=PlayerSpec.parse(f"model:{root}@2")))


def test_paired_openings_play_each_opening_with_both_colours_and_repeats_count_once(capsys):
    from arena.match import random_openings

    openings = random_openings(3, 4, 9, 7.5, seed=11)
    assert len({o for o in openings}) == 3 and all(len(o) == 4 for o in openings)
    assert random_openings(3, 4, 9, 7.5, seed=11) == openings          # from the seed alone
    a = mcts(UniformEvaluator(9), 8, seed=1, name="uniform")
    b = RandomPlayer(seed=2)
    games = play_games(a, b, games=6, board_size=9, komi=7.5, parallel_games=3, openings=openings)
    for k, opening in enumerate(openings):
        first, second = games[2 * k], games[2 * k + 1]
        assert first.moves[:4] == second.moves[:4] == opening
        assert (first.black, first.white) == (second.white, second.black)
    # Deterministic players repeat a game exactly: a repeat is not a distinct game.

    class Passer(BasePlayer):
        def __init__(self, name):
            self.name = name

        def select_move(self, board):
            return board.N * board.N

    result = evaluate(Passer("p"), Passer("q"), 4, 9, 7.5)
    assert result.games == 4 and result.distinct_games == 2
    result = evaluate(Passer("p"), Passer("q"), 4, 9, 7.5, openings=random_openings(2, 3, 9, 7.5, seed=1))
    assert result.distinct_games == 4
    code = main(["random", "uniform", "--games", "2", "--visits", "2", "--paired-openings", "3",
                 "--board-size", "7", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["distinct_games"] == 2

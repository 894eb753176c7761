"""Cross-check the engine's rules against GNU Go over GTP.

GNU Go runs with ``--chinese-rules --positional-superko`` (area scoring,
positional superko, suicide illegal: our rules) through arena.gtp_client.
Random games are played with the engine's playout policy (uniform over legal
moves that don't fill the mover's own eye) on 9x9 and 19x19, in a seeded
random order, over one GNU Go process reset with ``clear_board``.  On every
turn:

* the candidate moves are judged the same way by both engines: the move to be
  played, a random occupied point, a few random empty points, and every empty
  point the engine calls illegal (suicides and ko/superko recaptures), up to a
  handful; GNU Go answers ``is_legal``, and one illegal candidate per turn is
  also sent as ``play`` and must be refused with ``? illegal move``;
* after the move, ``list_stones black`` / ``list_stones white`` equal our
  stones.

All of a turn's commands go in one batch (GTP answers in order), so a turn
costs one pipe round trip.

Scoring.  GNU Go's ``final_score`` is not a Tromp-Taylor count: it first
judges life and death and removes stones it thinks dead.  Random games with
the eye rule end when both sides have only eyes (and illegal points) left, so
usually every group has two eyes and Tromp-Taylor area is the honest score;
we compare ``final_score`` with our area score exactly when GNU Go reports
``final_status_list dead`` *and* ``final_status_list seki`` empty, i.e. when
it agrees that no stone comes off and no region is shared.  The test also
asserts that this holds for most finished games, so the comparison can't
quietly cover nothing.

The pass rule (``--pass-when-winning``) ends games on boards that are not
filled: the last test plays games under it and checks that GNU Go's own
score of each finished board (dead stones removed) names the winner that
the Tromp-Taylor score as it stands names.

If GNU Go is missing the module fails (not skips) and says how to install it.
"""
import random
import time

import numpy as np
import pytest

from engine.board import Board
from format.coords import gtp_to_move, move_to_gtp
from arena.gtp_client import GnuGo, GnuGoNotFound

pytestmark = pytest.mark.gnugo

GAMES_9 = 500
GAMES_19 = 100
KOMI = 7.5
RANDOM_EMPTY_PROBES = 2
MAX_ILLEGAL_PROBES = 4


@pytest.fixture(scope="module")
def gnugo():
    try:
        engine = GnuGo(level=0)
    except GnuGoNotFound as err:
        pytest.fail(f"GNU Go is required for the rules cross-check: {err}. "
                    "Run scripts/setup.sh --test", pytrace=False)
    yield engine
    engine.close()


def _parse_vertices(text, size):
    return {gtp_to_move(v, size) for v in text.split()}


def _colour_name(to_play):
    return "black" if to_play == 1 else "white"


def _candidates(board, rng, move):
    """Moves to judge this turn, besides the one to be played."""
    size = board.size
    stones = board.stones().reshape(-1)
    mask = board.legal_mask()
    occupied = np.flatnonzero(stones != 0)
    empty_illegal = np.flatnonzero((stones == 0) & (mask[:-1] == 0))
    empty_legal = np.flatnonzero(mask[:-1] == 1)
    probes = [move]
    if len(occupied):
        probes.append(int(rng.choice(occupied)))
    probes += [int(p) for p in rng.sample(list(empty_illegal), min(MAX_ILLEGAL_PROBES, len(empty_illegal)))]
    probes += [int(p) for p in rng.sample(list(empty_legal), min(RANDOM_EMPTY_PROBES, len(empty_legal)))]
    return probes, [int(p) for p in empty_illegal]


def _play_one_game(gnugo, size, seed, stats):
    rng = random.Random(seed)
    board = Board(size, KOMI)
    replies = gnugo.send_many([f"boardsize {size}", "clear_board", f"komi {KOMI}"])
    assert all(r.ok for r in replies), replies
    turn = 0
    while not board.is_over:
        colour = _colour_name(board.to_play)
        move = board.playout_policy_move(rng.getrandbits(64))
        probes, empty_illegal = _candidates(board, rng, move)
        commands = [f"is_legal {colour} {move_to_gtp(p, size)}" for p in probes if p != size * size]
        refused = empty_illegal[0] if empty_illegal else None
        if refused is not None:
            commands.append(f"play {colour} {move_to_gtp(refused, size)}")
        commands += [f"play {colour} {move_to_gtp(move, size)}", "list_stones black", "list_stones white"]
        replies = gnugo.send_many(commands)
        where = f"{size}x{size} game seed {seed}, move {board.move_number} ({colour})"
        answers = iter(replies)
        for p in probes:
            if p == size * size:
                continue
            reply = next(answers)
            assert reply.ok, f"{where}: is_legal {move_to_gtp(p, size)} failed: {reply.text}"
            ours = board.is_legal(p)
            assert ours == (reply.text == "1"), (
                f"{where}: {move_to_gtp(p, size)} is {'legal' if ours else board.illegal_reason(p)} "
                f"for us, GNU Go says is_legal={reply.text}\n{board.to_ascii()}")
            stats["probes"] += 1
            stats["illegal_probes"] += not ours
        if refused is not None:
            reply = next(answers)
            assert not reply.ok and "illegal" in reply.text, (
                f"{where}: GNU Go accepted {move_to_gtp(refused, size)}, which we call "
                f"{board.illegal_reason(refused)}\n{board.to_ascii()}")
            stats["reasons"][board.illegal_reason(refused)] += 1
        reply = next(answers)
        assert reply.ok, f"{where}: GNU Go refused our legal move {move_to_gtp(move, size)}: {reply.text}"
        before = board.stones()
        board.play(move)
        stats["captures"] += int(((before != 0) & (board.stones() == 0)).sum())
        black = _parse_vertices(next(answers).text, size)
        white = _parse_vertices(next(answers).text, size)
        stones = board.stones().reshape(-1)
        assert black == set(np.flatnonzero(stones == 1).tolist()), f"{where}: black stones differ\n{board.to_ascii()}"
        assert white == set(np.flatnonzero(stones == -1).tolist()), f"{where}: white stones differ\n{board.to_ascii()}"
        turn += 1
    stats["moves"] += turn
    if board.consecutive_passes < 2:
        stats["capped"] += 1
        return
    dead, seki, score = gnugo.send_many(["final_status_list dead", "final_status_list seki", "final_score"])
    if dead.text or seki.text:
        stats["not_compared"] += 1
        return
    ours = board.area_score()
    expected = "0" if ours == 0 else (f"B+{ours:.1f}" if ours > 0 else f"W+{-ours:.1f}")
    assert score.text == expected, (
        f"{size}x{size} game seed {seed}: final_score {score.text}, our area score {ours}\n{board.to_ascii()}")
    stats["scored"] += 1


def test_random_games_agree_with_gnugo(gnugo):
    from collections import Counter
    order = [(9, seed) for seed in range(GAMES_9)] + [(19, 10_000 + seed) for seed in range(GAMES_19)]
    random.Random(2026).shuffle(order)
    stats = Counter()
    stats["reasons"] = Counter()
    start = time.perf_counter()
    for size, seed in order:
        _play_one_game(gnugo, size, seed, stats)
    elapsed = time.perf_counter() - start
    print(f"\n{len(order)} games, {stats['moves']} moves, {stats['probes']} legality probes "
          f"({stats['illegal_probes']} illegal), refusals {dict(stats['reasons'])}, "
          f"{stats['captures']} stones captured, {stats['scored']} scores compared, "
          f"{stats['not_compared']} not compared (dead/seki), {stats['capped']} capped, {elapsed:.0f} s")
    finished = stats["scored"] + stats["not_compared"]
    assert stats["scored"] >= 0.8 * finished, f"only {stats['scored']} of {finished} finished games were scored"
    assert stats["reasons"]["suicide"] > 0 and stats["reasons"]["superko"] > 0
    assert stats["captures"] > 0


# ---- the pass rule's finished boards --------------------------------------

PASS_RULE_GAMES_9 = 8
PASS_RULE_GAMES_19 = 2


def _gnugo_score(gnugo, size, moves):
    """GNU Go's final_score (it removes the stones it judges dead) after `moves`, Black first."""
    colours = ("b", "w")
    commands = [f"boardsize {size}", "clear_board", f"komi {KOMI}"]
    commands += [f"play {colours[i % 2]} {move_to_gtp(move, size)}" for i, move in enumerate(moves)]
    replies = gnugo.send_many(commands + ["final_score"])
    assert all(r.ok for r in replies), [r.text for r in replies if not r.ok]
    text = replies[-1].text
    return 0.0 if text == "0" else (1 if text[0] == "B" else -1) * float(text[2:])


def _ended_by_the_rule(size, moves):
    """Whether one of the game's two closing passes was one the sensible rule alone would not offer."""
    board = Board(size, KOMI)
    offered = []
    for move in moves:
        if len(moves) - board.move_number <= 2:
            offered.append(bool(board.sensible_mask()[-1]))
        board.play(move)
    return not all(offered)


def test_games_ended_by_the_pass_rule_are_won_by_whom_gnugo_says(gnugo):
    """Under the pass rule a game ends when a player ahead on the board as it stands
    answers a pass with a pass.  On such finished boards the Tromp-Taylor score as it
    stands must name the same winner as GNU Go's own score, which judges dead stones
    and seki.  9x9: searches valued by random playouts on both sides; 19x19: uniform
    draws from the candidate moves (PASS, once a side is ahead, one draw among many)."""
    from arena.match import END_TWO_PASSES, play_games
    from inference.loading import PlayoutEvaluator
    from arena.player import MctsConfig, MctsPlayer, SearchBudget

    finished = []
    players = [MctsPlayer(PlayoutEvaluator(9, KOMI, playouts=2, seed=side),
                          MctsConfig(budget=SearchBudget(24), seed=side, pass_when_winning=True), name=f"p{side}")
               for side in (0, 1)]
    for game in play_games(*players, games=PASS_RULE_GAMES_9, board_size=9, komi=KOMI, parallel_games=8):
        assert game.end_reason == END_TWO_PASSES
        finished.append((9, game.moves, game.score))
    rng = np.random.default_rng(19)
    for _ in range(PASS_RULE_GAMES_19):
        board, moves = Board(19, KOMI), []
        while not board.is_over:
            moves.append(int(rng.choice(np.flatnonzero(board.candidate_mask(pass_when_winning=True)))))
            board.play(moves[-1])
        assert board.consecutive_passes == 2
        finished.append((19, tuple(moves), board.area_score()))
    early = 0
    for size, moves, ours in finished:
        theirs = _gnugo_score(gnugo, size, moves)
        assert np.sign(theirs) == np.sign(ours), (
            f"{size}x{size}: GNU Go scores {theirs}, Tromp-Taylor as it stands {ours}; moves {moves}")
        early += _ended_by_the_rule(size, moves)
    print(f"\n{len(finished)} games under the pass rule, {early} ended by it; "
          f"lengths {[len(m) for _, m, _ in finished]}")
    assert early >= 3, "the rule ended too few games for the check to mean much"

"""Every builder of the network's input agrees with format/planes.py, bit for bit.

The same positions -- every position of random legal games
(`testdata.random_games.engine_game`: captures, passes, both colours to move,
9x9 and 19x19 in one run) -- are built by `format.planes.input_planes` from
the game record's boards (the *reference*) and by each builder the project
runs, and must come out identical:

* inference: `Board.features` of the game replayed on the engine; the search
  driver's leaf batch (what an `MctsPlayer`'s evaluator receives for the root
  and its children); the labeller's model playouts (`model_playout_labels`'s
  policy_fn);
* training: chunk (`codec.encode_chunk`) -> decoded games -> the Beam job's
  position builder (`pipeline.positions.games_positions`, whose compiled
  `history_planes` the dedup keys hash) -> serialized records ->
  `codec.decode_records` and tf.data's `GroupDecoder` (history planes
  rebuilt from the board, the last moves and their captures, ownership
  gathered from the window's game table) under every one of the 8
  symmetries, compared with `format.symmetry` applied to the reference; and
  once through the real `pipeline.shuffle` job (which writes the records
  and their game table) on a tiny lake and `tfdata.training_dataset`;
* `PlayoutEvaluator`, which reads the position back out of the planes.

Each builder that serves a model builds both widths a model may take (17
and 22 channels, `schema.INPUT_PLANE_CHOICES`), checked against the
reference's first 17 and all 22 channels.

`test_the_games_tell_every_channel_apart` makes sure the data can catch a
layout slip: every two channels differ on some position, so a builder that
swaps, shifts or drops any plane fails here; and the games hold what the
position planes must get right (every liberty count, suicide points and ko
recaptures that the LEGAL plane must leave out).  format/planes.pxd (the compiled
builders' constants) is checked against format/planes.py.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import tensorflow as tf

from arena.player import MctsConfig, MctsPlayer, SearchBudget
from engine.board import Board
from engine.playouts import positions_from_planes
from format import layout
from format import codec
from format import planes
from format import schema
from format.symmetry import NUM_SYMMETRIES, apply_symmetry_nhwc
from format.tfrecord import decompress_for, iter_framed_records
from inference.loading import PlayoutEvaluator
from model.tfdata import GroupDecoder, training_dataset
from pipeline import labels as L
from pipeline import positions as P
from pipeline.shuffle import main as shuffle_main
from testdata.random_games import engine_game, resigned_copy

BOARD_SIZES = (9, 19)
WIDTHS = schema.INPUT_PLANE_CHOICES
"""The input widths a model may take: every serving builder is checked at each."""
FINISHED_GAMES = {9: 6, 19: 2}
"""Games per size: ~115 positions each on 9x9, ~450 on 19x19."""


# --- the positions and their reference planes -------------------------------------


def _to_play(move_number: int) -> int:
    return schema.BLACK if move_number % 2 == 0 else schema.WHITE


def recorded_boards(game: codec.GameRecord) -> np.ndarray:
    """int8 [M, N, N] in schema colours: the board of every position, from the record."""
    return game.planes[:, 0].astype(np.int8) * schema.BLACK + game.planes[:, 1].astype(np.int8) * schema.WHITE


def reference_planes(game: codec.GameRecord) -> np.ndarray:
    """float32 [M, N, N, 22]: `format.planes.input_planes` of every position of ``game``, full width
    (a 17-channel builder is compared with the first 17 channels).

    Built from the record's own boards (what self-play saw at each move),
    not by the engine's history ring, so each builder is checked against an
    independent source.
    """
    boards = recorded_boards(game)
    return np.stack([planes.input_planes(boards[i::-1], _to_play(i), planes.INPUT_PLANES)  # newest first
                     for i in range(game.num_positions)])


@pytest.fixture(scope="module")
def games():
    """{board size: [GameRecord]}: finished games plus one cut short (resigned)."""
    rng = np.random.default_rng(17)
    out = {}
    for n in BOARD_SIZES:
        finished = [engine_game(rng, n) for _ in range(FINISHED_GAMES[n])]
        out[n] = finished + [resigned_copy(engine_game(rng, n), 0.6)]
    return out


@pytest.fixture(scope="module")
def references(games):
    """{board size: [float32 [M, N, N, 22] per game]}."""
    return {n: [reference_planes(g) for g in games[n]] for n in BOARD_SIZES}


def assert_same_planes(actual, expected, where: str) -> None:
    """Bit-for-bit equality of float32 [..., N, N, C] planes with the reference's first C channels
    (``expected`` may be wider); names the first bad channel."""
    actual = np.asarray(actual)
    expected = expected[..., :actual.shape[-1]] if actual.ndim == expected.ndim else expected
    assert actual.dtype == np.float32 and actual.shape == expected.shape, (
        f"{where}: got {actual.dtype} {actual.shape}, expected float32 {expected.shape}")
    if actual.tobytes() == expected.tobytes():
        return
    wrong = np.argwhere(actual != expected)[0]
    channel = int(wrong[-1])
    pytest.fail(f"{where}: channel {channel} ({planes.channel_name(channel)}) differs at index "
                f"{tuple(int(i) for i in wrong)}: got {actual[tuple(wrong)]}, expected {expected[tuple(wrong)]}")


def reference_record_planes(game: codec.GameRecord) -> list[np.ndarray]:
    """uint8 [16, N, N] per position: `format.planes.record_planes`, what a position record stores."""
    boards = recorded_boards(game)
    return [planes.record_planes(boards[i::-1], _to_play(i)) for i in range(game.num_positions)]


def assert_same_record_planes(actual, expected, where: str) -> None:
    """Bit-for-bit equality of a record's uint8 [16, N, N] planes; names the first bad channel."""
    assert actual.dtype == np.uint8 and actual.shape == expected.shape, (
        f"{where}: got {actual.dtype} {actual.shape}, expected uint8 {expected.shape}")
    assert_same_planes(np.moveaxis(actual, 0, -1).astype(np.float32),
                       np.moveaxis(expected, 0, -1).astype(np.float32), where)


def _replay(game: codec.GameRecord, upto: int) -> Board:
    board = Board(game.board_size, game.komi)
    for move in game.moves[:upto].tolist():
        board.play(move)
    return board


# --- the data can catch a layout slip ----------------------------------------------


def test_the_games_tell_every_channel_apart(games, references):
    """Every two channels differ on some position, and the games hold what
    history planes must get right: captures, passes, both colours to move."""
    for n in BOARD_SIZES:
        stacked = np.concatenate(references[n])
        flat = stacked.reshape(-1, planes.INPUT_PLANES)
        for c in range(planes.INPUT_PLANES):
            for d in range(c + 1, planes.INPUT_PLANES):
                assert (flat[:, c] != flat[:, d]).any(), f"{n}x{n}: channels {c} and {d} never differ"
        moves = np.concatenate([g.moves[:-1] for g in games[n]])
        assert (moves == n * n).any(), f"{n}x{n}: no position follows a pass"
        assert set(np.unique(stacked[..., planes.COLOUR_PLANE]).tolist()) == {0.0, 1.0}
        # The opponent's move t-1 -> t captured some of the mover's stones.
        own_now, own_before = stacked[..., planes.OWN_STONES], stacked[..., planes.OWN_STONES + 1]
        assert (own_before > own_now).any(), f"{n}x{n}: no capture in the games"
        # Chains of each liberty class, and empty points the LEGAL plane must leave out.
        for c in range(planes.LIBERTIES_1, planes.LEGAL):
            assert stacked[..., c].any(), f"{n}x{n}: no stone of the class {planes.channel_name(c)}"
        empty = (stacked[..., planes.OWN_STONES] + stacked[..., planes.OPPONENT_STONES]) == 0
        assert (empty & (stacked[..., planes.LEGAL] == 0)).any(), f"{n}x{n}: no illegal empty point"
    # A ko recapture the LEGAL plane must ban (9x9's games are long enough to hold some).
    bans = [planes.ko_ban(b[i], b[i - 1], _to_play(i)) for g in games[9]
            for b in [recorded_boards(g)] for i in range(1, g.num_positions)]
    assert any(ban is not None for ban in bans), "9x9: no ko recapture in the games"


def test_the_compiled_layout_matches_format_planes():
    """format/planes.pxd states the same numbers as format/planes.py."""
    path = os.path.join(os.path.dirname(planes.__file__), "planes.pxd")
    with open(path) as f:
        entries = re.findall(r"^\s+([A-Z][A-Z_0-9]*)\s*=\s*([^#\n]+)", f.read(), flags=re.MULTILINE)
    values: dict = {}
    for name, expression in entries:
        values[name] = eval(expression, {}, dict(values))  # the enum's own constant expressions
    assert values == {name: getattr(planes, name) for name in values}
    assert set(values) >= {"HISTORY_LENGTH", "OWN_STONES", "OPPONENT_STONES", "COLOUR_PLANE",
                           "PACKED_PLANES", "BASIC_INPUT_PLANES", "ON_BOARD", "LIBERTIES_1", "LEGAL",
                           "INPUT_PLANES", "COLOUR_PLANE_SIDE"}


# --- inference ----------------------------------------------------------------------


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", BOARD_SIZES)
def test_board_features_match_the_reference(n, width, games, references):
    for g, (game, expected) in enumerate(zip(games[n], references[n])):
        board = Board(n, game.komi)
        for i, move in enumerate(game.moves.tolist()):
            assert board.to_play == _to_play(i)
            assert_same_planes(board.features(width), expected[i], f"{n}x{n} game {g} move {i}: Board.features")
            board.play(move)


class _RecordingEvaluator:
    """Uniform priors and value 0, for ``input_planes`` channels; keeps every batch of planes it is given."""

    def __init__(self, input_planes: int = planes.BASIC_INPUT_PLANES):
        self.input_planes = input_planes
        self.calls = []

    def __call__(self, batch):
        self.calls.append(np.array(batch))
        rows, n = batch.shape[0], batch.shape[1]
        return np.zeros((rows, n * n + 1), np.float32), np.zeros(rows, np.float32)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", BOARD_SIZES)
def test_the_search_driver_batches_the_root_and_its_children_like_the_reference(n, width, games, references):
    """GameBatch writes leaves from scratch boards (copy of the root + moves):
    its first batch is the root, its second the root's children, as wide as the evaluator's input."""
    game, expected = games[n][0], references[n][0]
    evaluator = _RecordingEvaluator(width)
    player = MctsPlayer(evaluator, MctsConfig(budget=SearchBudget(visits=8), tree_reuse=False))
    for i in range(0, game.num_positions - 2, max(1, game.num_positions // 6)):
        board = _replay(game, i)
        evaluator.calls.clear()
        player.select_move(board)
        root_batch, children_batch = evaluator.calls[0], evaluator.calls[1]
        assert len(root_batch) == 1 and len(children_batch) >= 1
        assert_same_planes(root_batch[0], expected[i], f"{n}x{n} move {i}: search root")
        history = list(recorded_boards(game)[i::-1])  # the root's boards, newest first
        children = set()
        for move in np.flatnonzero(board.legal_mask()).tolist():
            child = board.copy()
            child.play(move)
            children.add(planes.input_planes([child.stones()] + history, child.to_play, width).tobytes())
        for row, leaf in enumerate(children_batch):
            assert leaf.tobytes() in children, f"{n}x{n} move {i}: leaf row {row} is no child of the root"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", BOARD_SIZES)
def test_the_labellers_model_playouts_see_the_reference_planes(n, width, games, references):
    seen = []

    class Model:
        input_planes = width   # as inference.model_files.LoadedModel says it

        def __call__(self, features):
            seen.append(np.array(features))
            return {"policy_logits": np.zeros((len(features), n * n + 1), np.float32)}

    policy_fn = Model()

    picks = [(g, i) for g, game in enumerate(games[n]) for i in (0, 1, game.num_positions // 2)]
    boards = [_replay(games[n][g], i) for g, i in picks]
    L.model_playout_labels(boards, policy_fn, max_moves=1, temperature=1.0,
                           rng=np.random.default_rng(0), weight=0.5)
    for row, (g, i) in enumerate(picks):
        assert_same_planes(seen[0][row], references[n][g][i], f"{n}x{n} game {g} move {i}: labeller")


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_playout_evaluator_plays_out_the_position_the_planes_encode(n, games, references):
    """The evaluator rebuilds each leaf from its planes (engine.playouts.positions_from_planes, the reading
    playout_values uses): the stones at t and the side to move."""
    game, expected = games[n][0], references[n][0]
    rows = np.arange(0, game.num_positions, 7)
    basic = np.ascontiguousarray(expected[rows][..., :planes.BASIC_INPUT_PLANES])
    stones, sides = positions_from_planes(basic)
    boards = recorded_boards(game)
    for k, i in enumerate(rows.tolist()):
        assert sides[k] == _to_play(i), f"move {i}"
        np.testing.assert_array_equal(stones[k], boards[i], err_msg=f"{n}x{n} move {i}: position rebuilt from planes")
    values = PlayoutEvaluator(n, game.komi, playouts=1, seed=3)(basic)[1]
    assert values.shape == (len(rows),) and set(np.unique(values)) <= {-1.0, 0.0, 1.0}


# --- training: chunk -> positions -> records -> tf.data ----------------------------


def _labels(games):
    """Endstate labels as the job makes them (exact for finished games, played out for the cut one)."""
    return L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                         playout_weight=0.5, rng=np.random.default_rng(0), stats=L.empty_stats())


def game_table(games, labels) -> codec.GameTable:
    """The window game table of ``games`` (row g = game g, as the job's instance order makes it)."""
    return codec.GameTable(board_size=games[0].board_size, generation=[g.generation for g in games],
                           ownership=P.game_label_rows(labels))


@pytest.fixture(scope="module")
def position_records(games):
    """{board size: (serialized records, PositionBatch, game table, fresh planes uint8[P, 2, NN])} built the
    way the Beam job's DoFn does."""
    out = {}
    for n in BOARD_SIZES:
        decoded = codec.read_chunk(codec.encode_chunk(games[n]), f"chunk-{n}{schema.CHUNK_SUFFIX}")  # suffix: zstd
        labels = _labels(decoded)
        batch = P.games_positions(decoded, labels, list(range(len(decoded))), dedup_max_move=0)
        fresh = np.concatenate([g.planes.reshape(g.num_positions, 2, -1) for g in decoded])
        table = game_table(decoded, labels)
        out[n] = (batch.encode(None, table), batch, table, fresh)  # instance = game index = the table's row
    return out


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_the_compiled_history_kernel_builds_the_reference_record_planes(n, games, position_records):
    """`pipeline.positions.history_planes` (pipeline/_history.pyx), whose bits the dedup keys hash."""
    _, batch, _, fresh = position_records[n]
    packed = P.history_planes(fresh, batch.move_number)
    expected = [planes_i for game in games[n] for planes_i in reference_record_planes(game)]
    assert len(packed) == len(expected)
    for row, planes_i in enumerate(expected):
        bits = np.unpackbits(packed[row], count=planes_i.size, bitorder="big").reshape(planes_i.shape)
        assert_same_record_planes(bits, planes_i, f"{n}x{n} position {row}: history_planes")


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_position_records_hold_the_reference_planes(n, games, position_records):
    records, batch, table, _ = position_records[n]
    expected = [planes_i for game in games[n] for planes_i in reference_record_planes(game)]
    decoded = [position for record in records for position in codec.decode_records(record, table=table)]
    assert len(decoded) == len(expected) == len(batch)
    assert len(records) == -(-len(expected) // schema.POSITION_GROUP)
    for row, rec in enumerate(decoded):
        where = f"{n}x{n} position {row} (move {batch.move_number[row]}): codec.decode_records"
        assert rec.to_play == _to_play(batch.move_number[row]) == batch.to_play[row], where
        assert_same_record_planes(rec.planes, expected[row], where)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", BOARD_SIZES)
def test_tfdata_decodes_the_reference_planes_under_every_symmetry(n, width, references, position_records):
    """tf.data's augmented planes == format.symmetry applied to the reference (engine side)."""
    records, batch, table, _ = position_records[n]
    expected = np.concatenate(references[n])[..., :width]
    decoder = GroupDecoder(n, table=table, input_planes=width)  # XLA-compiled, as training_dataset builds it
    symmetries = np.arange(len(batch), dtype=np.int32) % NUM_SYMMETRIES
    for shift in (0, 3):  # every position under two symmetries, every symmetry on ~M/4 positions
        ks = (symmetries + shift) % NUM_SYMMETRIES
        decoded = decoder.decode(tf.constant(records), tf.constant(ks))["planes"].numpy()
        assert decoded.shape[0] == len(expected)
        for row, k in enumerate(ks.tolist()):
            assert_same_planes(decoded[row], apply_symmetry_nhwc(expected[row], k),
                               f"{n}x{n} {width} planes, position {row}, symmetry {k}: tfdata")


# --- once through the real shuffle job ------------------------------------------------


def _canonical(position: np.ndarray) -> bytes:
    """The same bytes for a position's planes under any of the 8 symmetries."""
    return min(apply_symmetry_nhwc(position, k).tobytes() for k in range(NUM_SYMMETRIES))


def test_the_shuffle_job_and_training_dataset_deliver_the_reference_planes(tmp_path, games, references):
    from tests.pipeline.support import write_chunk, write_run_json

    n, root = 9, str(tmp_path / "lake")
    write_run_json(root, n)
    write_chunk(root, 0, games[n], 0)
    code = shuffle_main(["--root", root, "--window-min-positions", "1000000", "--reuse", "1",
                         "--dedup-max-move", "0", "--random-playouts", "2", "--shard-positions", "300",
                         "--workers", "1", "--seed", "5"])
    assert code == 0
    expected = {(g.game_id, i): ref[i] for g, ref in zip(games[n], references[n]) for i in range(len(ref))}
    expected_records = {(g.game_id, i): planes_i for g in games[n]
                        for i, planes_i in enumerate(reference_record_planes(g))}
    windows = os.path.join(root, layout.WINDOWS_DIR)
    (window,) = os.listdir(windows)
    shard_paths = sorted(os.path.join(windows, window, name) for name in os.listdir(os.path.join(windows, window))
                         if name.endswith(schema.SHARD_SUFFIX))
    (table_name,) = [name for name in os.listdir(os.path.join(windows, window))
                     if name.endswith(schema.GAME_TABLE_SUFFIX)]
    with open(os.path.join(windows, window, table_name), "rb") as f:
        table = codec.decode_game_table(f.read(), table_name, board_size=n, games=len(games[n]))
    # The shards hold every position once (records keep no game id:
    # compare the multisets of record planes), with the reference planes.
    shard_planes = []
    for path in shard_paths:
        with open(path, "rb") as f:
            for record in iter_framed_records(decompress_for(path, f.read()), path):
                for rec in codec.decode_records(record, table=table):
                    shard_planes.append((rec.planes.tobytes(), rec.to_play))
    assert sorted(shard_planes) == sorted((planes_i.tobytes(), _to_play(key[1]))
                                          for key, planes_i in expected_records.items())
    # The trainer's stream is shuffled and each example gets a random symmetry,
    # so compare the multisets of positions up to symmetry (the exact symmetry
    # is checked in test_tfdata_decodes_the_reference_planes_under_every_symmetry).
    # The dataset finds the window's game table beside the shards, as the trainer's does.
    dataset = training_dataset(shard_paths, board_size=n, batch_size=1, seed=11, augment=True, repeat=False,
                               input_planes=planes.INPUT_PLANES)
    streamed = sorted(_canonical(batch["planes"].numpy()[0]) for batch in dataset)
    assert streamed == sorted(_canonical(position) for position in expected.values())


@pytest.mark.parametrize("board_size", [9, 19])
def test_a_stored_positions_planes_turn_back_into_the_network_input(board_size):
    """`input_from_record_planes` undoes `record_planes` (what the trainer's int8 calibration reads)."""
    from format.planes import input_from_record_planes, input_planes, record_planes

    rng = np.random.default_rng(board_size)
    for to_play in (schema.BLACK, schema.WHITE):
        boards = [rng.integers(-1, 2, (board_size, board_size)).astype(np.int8) for _ in range(5)]
        for width in WIDTHS:
            expected = input_planes(boards, to_play, width)
            np.testing.assert_array_equal(
                input_from_record_planes(record_planes(boards, to_play), to_play, width), expected)
    with pytest.raises(ValueError, match="record planes must be"):
        input_from_record_planes(np.zeros((17, board_size, board_size), np.uint8), schema.BLACK)

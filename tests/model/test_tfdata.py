"""model.tfdata: what the trainer decodes is what the Beam job encoded.

Records are written with the shuffle job's own code (`pipeline.positions`,
`format.codec`) from random legal games, and read back through the tf.data
pipeline, on 9x9 and 19x19 in the same run.  The numpy decoder
(`codec.decode_records`) is the reference: every key of the training batch
matches it, and under each of the 8 symmetries the policy and ownership
match ``format.symmetry`` applied to it (the planes are checked under every
symmetry in tests/format/test_planes.py).  The stream is reproducible and a
resumed one skips to the same batches.
"""
import numpy as np
import pytest
import tensorflow as tf

from format import codec
from format import layout
from format import schema
from format.symmetry import apply_symmetry_nhwc, apply_symmetry_to_policy
from model.tfdata import GroupDecoder, plane_expander, training_dataset
from pipeline import labels as L
from pipeline import positions as P
from testdata.random_games import engine_game, resigned_copy

BOARD_SIZES = [9, 19]


@pytest.fixture(scope="module")
def windows():
    """{N: (records, PositionBatch, GameTable)} of finished games and a resigned one (a played-out label)."""
    rng = np.random.default_rng(31)
    out = {}
    for n, count in ((9, 3), (19, 1)):
        games = [engine_game(rng, n, visits=40, full_search_fraction=0.5) for _ in range(count)]
        games.append(resigned_copy(engine_game(rng, n), 0.5))
        labels = L.label_games(games, policy_fn=None, random_playouts=3, model_playout_moves=0, temperature=1.0,
                               playout_weight=0.5, rng=rng, stats=L.empty_stats())
        batch = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=0)
        batch = batch.take(rng.permutation(len(batch)))  # a shard's shuffled order
        table = codec.GameTable(board_size=n, generation=[g.generation for g in games],
                                ownership=P.game_label_rows(labels))
        out[n] = (batch.encode(None, table), batch, table)  # instance = game index = the table's row
    return out


def reference(records, table) -> dict:
    """The numpy decoder's batch (codec.decode_records), keyed as tf.data's, without symmetry."""
    positions = [p for r in records for p in codec.decode_records(r, "s#0", table=table)]
    n = table.board_size
    planes, policy = [], np.zeros((len(positions), schema.num_actions(n)), np.float32)
    for i, p in enumerate(positions):
        colour = np.full((1, n, n), 1 if p.to_play == schema.BLACK else 0, np.uint8)
        planes.append(np.moveaxis(np.concatenate([p.planes, colour]), 0, -1).astype(np.float32))
        policy[i, p.policy_index] = p.policy_prob
    out = {"planes": np.stack(planes), "policy": policy, "ownership": np.stack([p.ownership for p in positions])}
    for key in ("value", "score", "policy_weight", "value_weight", "ownership_weight", "score_weight"):
        out[key] = np.array([getattr(p, key) for p in positions], np.float32)
    return out


def write_window(folder, records, table, shards: int = 1) -> list[str]:
    """Shard files of ``records`` (split in order) with the game table beside them."""
    paths = []
    for shard, part in enumerate(np.array_split(np.arange(len(records)), shards)):
        path = folder / layout.shard_name("t", shard, shards)
        path.write_bytes(codec.encode_shard([records[i] for i in part]))
        paths.append(str(path))
    (folder / layout.game_table_name("t")).write_bytes(codec.encode_game_table(table))
    return paths


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_shard_round_trip_through_the_pipeline(tmp_path, n, windows):
    records, batch, table = windows[n]
    paths = write_window(tmp_path, records, table)
    dataset = training_dataset(paths, board_size=n, batch_size=16, seed=0, shuffle_buffer=0, augment=False,
                               repeat=False, reader_parallelism=1)
    streamed = list(dataset)
    assert len(streamed) == len(batch) // 16
    assert streamed[0]["planes"].shape == (16, n, n, schema.BASIC_INPUT_PLANES)
    want = reference(records, table)
    for key, expected in want.items():
        got = np.concatenate([b[key].numpy() for b in streamed])
        np.testing.assert_allclose(got, expected[:len(got)], rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_every_symmetry_moves_policy_and_ownership_as_the_numpy_reference(n, windows):
    records, batch, table = windows[n]
    want = reference(records, table)
    decoder = GroupDecoder(n, table=table, jit=False)
    ks = np.arange(len(batch), dtype=np.int32) % 8
    decoded = decoder.decode(tf.constant(records), tf.constant(ks))
    for i, k in enumerate(ks.tolist()):
        np.testing.assert_allclose(decoded["policy"][i].numpy(), apply_symmetry_to_policy(want["policy"][i], k),
                                   atol=1e-7, err_msg=f"position {i} symmetry {k}")
        ownership = apply_symmetry_nhwc(want["ownership"][i].reshape(n, n, 1), k).reshape(-1)
        np.testing.assert_allclose(decoded["ownership"][i].numpy(), ownership, atol=1e-7,
                                   err_msg=f"position {i} symmetry {k}")
    assert (want["policy"][:, n * n] > 0).any()  # pass is among the targets (and stays pass above)


def test_order_is_reproducible_and_skip_resumes_the_same_stream(tmp_path, windows):
    n = 9
    records, _, table = windows[n]
    paths = write_window(tmp_path, records, table, shards=2)

    def first_batches(skip, count):
        dataset = training_dataset(paths, board_size=n, batch_size=16, seed=7, shuffle_buffer=128,
                                   skip_batches=skip)
        return [batch for batch, _ in zip(dataset, range(count))]

    full = first_batches(0, 8)
    resumed = first_batches(5, 3)
    for a, b in zip(full[5:], resumed):
        for key in ("planes", "policy", "ownership", "value"):
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    # Augmentation is on: not every example of a batch came out untransformed.
    plain = training_dataset(paths, board_size=n, batch_size=16, seed=7, shuffle_buffer=128, augment=False)
    plain_first = next(iter(plain))
    assert not np.array_equal(plain_first["planes"].numpy(), full[0]["planes"].numpy())
    np.testing.assert_array_equal(plain_first["value"].numpy(), full[0]["value"].numpy())


def test_windows_of_one_board_shape_share_one_compiled_stage_2(tmp_path, windows):
    """A following trainer builds a dataset a window: each used to trace and XLA-compile its own stage 2,
    which TensorFlow's compilation cache kept for the life of the process (about 1 MB a window)."""
    n = 9
    records, _, table = windows[n]
    stage2 = plane_expander(n, schema.BASIC_INPUT_PLANES, True).stage2
    before = stage2.experimental_get_tracing_count()
    for window in ("a", "b"):
        folder = tmp_path / window
        folder.mkdir()
        dataset = training_dataset(write_window(folder, records, table), board_size=n, batch_size=40, seed=1)
        assert next(iter(dataset))["planes"].shape == (40, n, n, schema.BASIC_INPUT_PLANES)
    assert stage2.experimental_get_tracing_count() == before + 1


def test_wrong_board_size_is_refused_naming_the_field(windows):
    records, _, _ = windows[9]
    other = codec.GameTable(board_size=19, generation=[0], ownership=np.zeros((1, 361), np.int8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="board_size"):
        GroupDecoder(19, table=other, jit=False).decode(tf.constant(records[:1]),
                                                        tf.zeros([schema.POSITION_GROUP], tf.int32))

"""model.tfdata: what the trainer decodes is what the Beam job encoded.

Records are written with the project's codec (``format.codec``) and read back
through the tf.data pipeline, on 9x9 and 19x19 in the same run.  Symmetries
are checked against ``format.symmetry``'s numpy reference, and with a single
marked point that must move alike in planes, policy and ownership.
"""
import numpy as np
import pytest
import tensorflow as tf

from format import schema
from format.codec import encode_shard
from testdata.records_v1 import encode_position
from model.tfdata_version1 import PositionDecoder
from format.symmetry import apply_symmetry_nhwc, apply_symmetry_to_policy, symmetry_permutations
from model.tfdata import training_dataset

BOARD_SIZES = [9, 19]


def random_record(rng, n, *, to_play=None, policy_points=None):
    """(serialized record, expected decoded arrays) for a random position."""
    planes = (rng.random((schema.PACKED_PLANES, n, n)) < 0.3).astype(np.uint8)
    to_play = to_play if to_play is not None else int(rng.choice([schema.BLACK, schema.WHITE]))
    k = int(rng.integers(0, 6))
    index = rng.choice(n * n + 1, size=k, replace=False) if policy_points is None else policy_points
    prob = rng.dirichlet(np.ones(len(index))).astype(np.float32) if len(index) else np.zeros(0, np.float32)
    ownership = rng.integers(-127, 128, size=n * n).astype(np.int8)
    value, score = float(rng.choice([-1.0, 0.0, 1.0])), float(rng.normal() * 10)
    weights = rng.random(4).astype(np.float32)
    record = encode_position(
        board_size=n, planes_packed=np.packbits(planes.reshape(-1), bitorder="big").tobytes(),
        to_play=to_play, policy_index=[int(i) for i in index], policy_prob=prob.tolist(),
        value=value, score=score, ownership_int8=ownership.tobytes(),
        policy_weight=float(weights[0]), value_weight=float(weights[1]),
        ownership_weight=float(weights[2]), score_weight=float(weights[3]),
        game_id="test", move_number=3, generation=1)
    dense_policy = np.zeros(n * n + 1, np.float32)
    dense_policy[np.asarray(index, dtype=np.int64)] = prob
    nhwc = np.concatenate([np.transpose(planes, (1, 2, 0)),
                           np.full((n, n, 1), 1.0 if to_play == schema.BLACK else 0.0)], axis=-1)
    expected = {"planes": nhwc.astype(np.float32), "policy": dense_policy,
                "ownership": ownership.astype(np.float32) / schema.OWNERSHIP_SCALE,
                "value": value, "score": score, "policy_weight": weights[0],
                "value_weight": weights[1], "ownership_weight": weights[2], "score_weight": weights[3]}
    return record, expected


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_shard_round_trip_through_the_pipeline(tmp_path, n):
    rng = np.random.default_rng(n)
    pairs = [random_record(rng, n) for _ in range(24)]
    shard = tmp_path / "shard-00000-of-00001.tfrecord.gz"
    shard.write_bytes(encode_shard([record for record, _ in pairs]))
    dataset = training_dataset([str(shard)], board_size=n, batch_size=8, seed=0,
                               shuffle_buffer=0, augment=False, repeat=False)
    batches = list(dataset)
    assert len(batches) == 3
    assert batches[0]["planes"].shape == (8, n, n, schema.BASIC_INPUT_PLANES)
    assert batches[0]["policy"].shape == (8, n * n + 1)
    assert batches[0]["ownership"].shape == (8, n * n)
    for i, (_, expected) in enumerate(pairs):
        batch = batches[i // 8]
        for key, want in expected.items():
            np.testing.assert_allclose(batch[key][i % 8].numpy(), want, rtol=1e-6, atol=1e-7,
                                       err_msg=f"record {i} field {key}")


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_every_symmetry_matches_the_numpy_reference(n):
    rng = np.random.default_rng(100 + n)
    pairs = [random_record(rng, n) for _ in range(8)]
    decoder = PositionDecoder(n)
    serialized = tf.constant([record for record, _ in pairs])
    symmetries = tf.constant(np.arange(8), tf.int32)  # record k gets symmetry k
    decoded = decoder.decode(serialized, symmetries)
    for k, (_, expected) in enumerate(pairs):
        np.testing.assert_array_equal(decoded["planes"][k].numpy(),
                                      apply_symmetry_nhwc(expected["planes"], k))
        np.testing.assert_allclose(decoded["policy"][k].numpy(),
                                   apply_symmetry_to_policy(expected["policy"], k), atol=1e-7)
        ownership = apply_symmetry_nhwc(expected["ownership"].reshape(n, n, 1), k).reshape(-1)
        np.testing.assert_allclose(decoded["ownership"][k].numpy(), ownership, atol=1e-7)


@pytest.mark.parametrize("n", BOARD_SIZES)
def test_a_marked_point_moves_together_in_planes_policy_and_ownership(n):
    marked = n + 2  # row 1, col 2: lands somewhere different under every symmetry
    planes = np.zeros((schema.PACKED_PLANES, n * n), np.uint8)
    planes[3, marked] = 1
    ownership = np.zeros(n * n, np.int8)
    ownership[marked] = 127
    record = encode_position(
        board_size=n, planes_packed=np.packbits(planes.reshape(-1), bitorder="big").tobytes(),
        to_play=schema.WHITE, policy_index=[marked], policy_prob=[1.0], value=1.0, score=2.5,
        ownership_int8=ownership.tobytes(), policy_weight=1.0, value_weight=1.0,
        ownership_weight=1.0, score_weight=1.0, game_id="marked", move_number=0, generation=0)
    decoded = PositionDecoder(n).decode(tf.constant([record] * 8), tf.range(8, dtype=tf.int32))
    destinations = set()
    for k in range(8):
        planes_k = decoded["planes"][k].numpy().reshape(n * n, schema.BASIC_INPUT_PLANES)
        stone_at = np.flatnonzero(planes_k[:, 3])
        policy_at = np.flatnonzero(decoded["policy"][k].numpy())
        owned_at = np.flatnonzero(decoded["ownership"][k].numpy())
        assert list(stone_at) == list(policy_at) == list(owned_at) == [symmetry_permutations(n)[k][marked]]
        assert planes_k[:, 16].sum() == 0  # White to move: colour plane all zero
        destinations.add(int(stone_at[0]))
    assert len(destinations) == 8


def test_pass_stays_pass_under_every_symmetry():
    n = 9
    record, _ = random_record(np.random.default_rng(1), n, policy_points=np.array([n * n]))
    decoded = PositionDecoder(n).decode(tf.constant([record] * 8), tf.range(8, dtype=tf.int32))
    np.testing.assert_array_equal(decoded["policy"].numpy()[:, n * n], np.ones(8, np.float32))


def test_order_is_reproducible_and_skip_resumes_the_same_stream(tmp_path):
    n = 9
    rng = np.random.default_rng(5)
    for shard_index in range(2):
        records = [random_record(rng, n)[0] for _ in range(40)]
        (tmp_path / f"s{shard_index}.tfrecord.gz").write_bytes(encode_shard(records))
    paths = sorted(str(p) for p in tmp_path.iterdir())

    def first_batches(skip, count):
        dataset = training_dataset(paths, board_size=n, batch_size=16, seed=7,
                                   shuffle_buffer=32, skip_batches=skip)
        return [batch for batch, _ in zip(dataset, range(count))]

    full = first_batches(0, 8)
    resumed = first_batches(5, 3)
    for a, b in zip(full[5:], resumed):
        for key in ("planes", "policy", "ownership", "value"):
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
    # Augmentation is on: not every example of a batch came out untransformed.
    plain = training_dataset(paths, board_size=n, batch_size=16, seed=7, shuffle_buffer=32,
                             augment=False)
    plain_first = next(iter(plain))
    assert not np.array_equal(plain_first["planes"].numpy(), full[0]["planes"].numpy())
    np.testing.assert_array_equal(plain_first["value"].numpy(), full[0]["value"].numpy())


def test_wrong_board_size_is_refused_naming_the_field(tmp_path):
    record, _ = random_record(np.random.default_rng(2), 9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="board_size"):
        PositionDecoder(19).decode(tf.constant([record]), tf.zeros([1], tf.int32))

"""The record codec: round trips, validation errors, damage detection."""

import dataclasses
import math

import numpy as np
import pytest

from format import codec
from format import schema
from format.example_proto import Example
from format.tfrecord import RecordError, compress_zstd, frame_records
from testdata.synthetic_games import synthetic_game


def assert_games_equal(a: codec.GameRecord, b: codec.GameRecord):
    for field in dataclasses.fields(codec.GameRecord):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name in ("policy_indices", "policy_values"):
            assert len(x) == len(y)
            for u, v in zip(x, y):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
        elif field.name == "root_values":
            # int8 at rest: within half a quantization step.
            np.testing.assert_allclose(x, y, atol=0.5 / schema.ROOT_VALUE_SCALE + 1e-6)
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=field.name)
        elif isinstance(x, float) and math.isnan(x):
            assert math.isnan(y)
        else:
            assert x == y, field.name


@pytest.fixture(params=[9, 13, 19])
def game(request):
    rng = np.random.default_rng(request.param)
    return synthetic_game(rng, request.param, visits=100, full_search_fraction=0.5, generation=3)


def test_game_round_trip_every_field(game):
    back = codec.decode_game(codec.encode_game(game), "test")
    assert_games_equal(game, back)


def test_game_round_trip_optional_fields():
    rng = np.random.default_rng(5)
    game = synthetic_game(rng, 9, visits=50, full_search_fraction=0.0)
    game = dataclasses.replace(game, ownership=None, ownership_source=schema.OWNERSHIP_NONE, score=float("nan"),
                               end_reason=schema.END_RESIGN, winner=schema.WHITE, resign_enabled=False,
                               would_resign=schema.BLACK, accelerated_from=17)
    assert_games_equal(game, codec.decode_game(codec.encode_game(game), "t"))


def test_chunk_round_trip_many_games():
    rng = np.random.default_rng(1)
    games = [synthetic_game(rng, 9, visits=200) for _ in range(5)]
    back = codec.read_chunk(codec.encode_chunk(games), "c.tfrecord.zst")
    assert len(back) == 5
    for a, b in zip(games, back):
        assert_games_equal(a, b)


def test_the_spool_framing_and_encode_chunk_write_the_same_chunk():
    """The worker's spool frames records it encoded earlier (`frame_chunk`); `encode_chunk` frames
    GameRecords: one framing, so the same games make the same chunk, and `chunk_records` gives
    back the records as they were framed."""
    rng = np.random.default_rng(2)
    games = [synthetic_game(rng, 9, visits=20) for _ in range(3)]
    records = [codec.encode_game(g) for g in games]
    chunk = codec.frame_chunk(records)
    assert chunk == codec.encode_chunk(games)
    assert list(codec.chunk_records(chunk, "c.tfrecord.zst")) == records
    damaged = chunk[:len(chunk) // 2]
    with pytest.raises(RecordError, match="c.tfrecord.zst"):
        list(codec.chunk_records(damaged, "c.tfrecord.zst"))

def test_tensorflow_parses_our_example_bytes(game):
    import tensorflow as tf  # imported here: 5 s, and only these tests need it
    data = codec.encode_game(game)
    parsed = tf.io.parse_single_example(data, {
        schema.G_BOARD_SIZE: tf.io.FixedLenFeature([], tf.int64),
        schema.G_KOMI: tf.io.FixedLenFeature([], tf.float32),
        schema.G_MOVES: tf.io.FixedLenFeature([], tf.string),
        schema.G_POLICY_VALUE: tf.io.VarLenFeature(tf.int64),
    })
    assert int(parsed[schema.G_BOARD_SIZE]) == game.board_size
    assert float(parsed[schema.G_KOMI]) == game.komi
    moves = np.frombuffer(parsed[schema.G_MOVES].numpy(), dtype="<u2")
    np.testing.assert_array_equal(moves, game.moves)
    expected = np.concatenate([v for v in game.policy_values if len(v)])
    np.testing.assert_array_equal(parsed[schema.G_POLICY_VALUE].values.numpy(), expected)


def _tamper(data: bytes, name: str, mutate) -> bytes:
    example = Example()
    example.ParseFromString(data)
    mutate(example.features.feature[name])
    return example.SerializeToString()


def _replace_ints(values):
    def mutate(feature):
        del feature.int64_list.value[:]
        feature.int64_list.value.extend(values)
    return mutate


@pytest.mark.parametrize("name,mutate,field,words", [
    (schema.G_VERSION, _replace_ints([99]), schema.G_VERSION, "unknown format version 99"),
    (schema.G_BOARD_SIZE, _replace_ints([40]), schema.G_BOARD_SIZE, "impossible board size 40"),
    (schema.G_BOARD_SIZE, _replace_ints([19]), schema.G_PLANES, "expected"),
    (schema.G_POLICY_INDEX_DELTA, _replace_ints([500] * 1000), schema.G_POLICY_COUNT, "counts sum"),
    (schema.G_MOVES, lambda f: f.bytes_list.value.__setitem__(0, np.array([900], "<u2").tobytes()),
     schema.G_MOVES, "outside"),
    # 40000 as stored: as an int16 it would be negative and pass a check of the maximum alone.
    (schema.G_MOVES, lambda f: f.bytes_list.value.__setitem__(
        0, np.array([40000], "<u2").tobytes() + f.bytes_list.value[0][2:]), schema.G_MOVES, "move index 40000"),
])
def test_decode_names_the_bad_field(name, mutate, field, words):
    rng = np.random.default_rng(2)
    data = codec.encode_game(synthetic_game(rng, 9, visits=50))
    with pytest.raises(codec.FormatError) as err:
        codec.decode_game(_tamper(data, name, mutate), "lake/chunk-1.tfrecord.zst#4")
    assert err.value.field == field
    assert "lake/chunk-1.tfrecord.zst#4" in str(err.value)
    assert words in str(err.value)


def test_policy_index_out_of_range_and_sum_far_from_one():
    rng = np.random.default_rng(3)
    game = synthetic_game(rng, 9, visits=50, full_search_fraction=1.0)
    data = codec.encode_game(game)
    first = len(game.policy_indices[0])

    def bump_last_gap(feature):
        gaps = list(feature.int64_list.value)
        gaps[first - 1] += 200  # pushes position 0's last index past 81
        _replace_ints(gaps)(feature)

    with pytest.raises(codec.FormatError, match="outside 0..81") as err:
        codec.decode_game(_tamper(data, schema.G_POLICY_INDEX_DELTA, bump_last_gap), "f")
    assert err.value.field == schema.G_POLICY_INDEX_DELTA

    def double_denominator(feature):
        values = list(feature.int64_list.value)
        values[0] *= 2
        _replace_ints(values)(feature)

    with pytest.raises(codec.FormatError, match="far from 1") as err:
        codec.decode_game(_tamper(data, schema.G_POLICY_DENOMINATOR, double_denominator), "f")
    assert err.value.field == schema.G_POLICY_DENOMINATOR


def test_writer_refuses_what_readers_refuse():
    rng = np.random.default_rng(4)
    game = synthetic_game(rng, 9, visits=50)
    with pytest.raises(codec.FormatError, match="moves"):
        codec.encode_game(dataclasses.replace(game, moves=game.moves + 200))
    with pytest.raises(codec.FormatError, match="planes"):
        codec.encode_game(dataclasses.replace(game, planes=game.planes[:, :, :5]))


def _chunk(games=3, seed=6):
    rng = np.random.default_rng(seed)
    return codec.encode_chunk(synthetic_game(rng, 9, visits=80) for _ in range(games))


@pytest.mark.parametrize("damage", ["truncate", "flip", "not-tfrecord", "unknown-version"])
def test_chunk_damage_is_detected(damage):
    rng = np.random.default_rng(7)
    data = _chunk()
    if damage == "truncate":
        data = data[: int(rng.integers(1, len(data) - 1))]
    elif damage == "flip":
        pos = int(rng.integers(0, len(data)))
        data = data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1:]
    elif damage == "not-tfrecord":
        data = compress_zstd(b"hello, this is not a TFRecord file at all" * 10)
    else:
        record = codec.encode_game(synthetic_game(rng, 9, visits=10))
        record = _tamper(record, schema.G_VERSION, _replace_ints([2]))
        data = compress_zstd(frame_records([record]))
    items = list(codec.iter_chunk(data, "bad.tfrecord.zst"))
    errors = [i for i in items if isinstance(i, codec.FormatError)]
    assert errors, damage
    assert all("bad.tfrecord.zst" in str(e) for e in errors)
    with pytest.raises(codec.FormatError):
        codec.read_chunk(data, "bad.tfrecord.zst")


def test_bad_record_costs_only_itself():
    rng = np.random.default_rng(8)
    good = [codec.encode_game(synthetic_game(rng, 9, visits=10)) for _ in range(3)]
    bad = _tamper(good[1], schema.G_BOARD_SIZE, _replace_ints([3]))
    items = list(codec.iter_chunk(compress_zstd(frame_records([good[0], bad, good[2]])), "c.tfrecord.zst"))
    assert [isinstance(i, codec.FormatError) for i in items] == [False, True, False]
    assert "c.tfrecord.zst#1" in str(items[1])


def test_quantize_policy_sums_exactly_and_is_close():
    rng = np.random.default_rng(9)
    for _ in range(50):
        probs = rng.dirichlet(np.full(82, 0.3))
        idx, vals = codec.quantize_policy(probs, 1023)
        assert vals.sum() == 1023 and (vals > 0).all()
        dense = np.zeros(82)
        dense[idx] = vals / 1023
        assert np.abs(dense - probs).max() < 1 / 1023


def test_decoded_policies_behave_as_lists_of_arrays():
    game = synthetic_game(np.random.default_rng(8), 9, visits=30, full_search_fraction=0.5)
    decoded = codec.decode_game(codec.encode_game(game))
    segments = decoded.policy_indices
    assert isinstance(segments, codec.Segments) and len(segments) == game.num_positions
    as_list = [np.asarray(x) for x in game.policy_indices]
    for got, want in zip(segments, as_list):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(segments[-1], as_list[-1])
    assert len(segments[3:9]) == 6 and len(segments[5:2]) == 0 and len(segments[::2]) == len(as_list[::2])
    for got, want in zip(segments[3:9], as_list[3:9]):
        np.testing.assert_array_equal(got, want)
    flat, offsets = codec.flat_segments(segments[3:9])
    assert offsets[0] == 0 and len(offsets) == 7
    np.testing.assert_array_equal(flat, np.concatenate(as_list[3:9]))
    with pytest.raises(IndexError):
        segments[len(segments)]
    # A re-encoded decoded game is byte-identical.
    assert codec.encode_game(decoded) == codec.encode_game(game)


def test_shard_round_trip_and_tensorflow_reads_gzip(tmp_path):
    import tensorflow as tf  # imported here: 5 s, and only these tests need it
    from pipeline import labels as L
    from pipeline import positions as P

    game = synthetic_game(np.random.default_rng(11), 9, visits=30, full_search_fraction=0.5, generation=2)
    label = L.EndstateLabel(np.asarray(game.ownership, np.float32), game.score, schema.OWNERSHIP_FINAL_BOARD, 1.0)
    batch = P.games_positions([game], [label], [0], dedup_max_move=0)
    table = codec.GameTable(board_size=9, generation=[2], ownership=P.game_label_rows([label]))
    data = codec.encode_shard(batch.encode(None, table))
    records = codec.read_shard(data, "s.tfrecord.gz", table=table)
    assert len(records) == len(batch) == game.num_positions
    packed = P.history_planes(np.asarray(game.planes, np.uint8).reshape(len(batch), 2, -1), batch.move_number)
    np.testing.assert_array_equal(np.packbits(records[3].planes.ravel(), bitorder="big"), packed[3])
    np.testing.assert_allclose(records[5].ownership * schema.OWNERSHIP_SCALE, batch.ownership[5])
    path = tmp_path / "s.tfrecord.gz"
    path.write_bytes(data)
    count = sum(1 for _ in tf.data.TFRecordDataset(str(path), compression_type="GZIP"))
    assert count == -(-len(batch) // schema.POSITION_GROUP)

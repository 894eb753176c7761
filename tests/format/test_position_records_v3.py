"""Version-3 position records and the window game table (format/SPEC.md "Position records, version 3",
"Window game table").

Version 3 moves each position's ownership label and generation to one row per
game of the window's game table.  Here: on the same positions (finished games,
resigned games with fractional random-playout labels, and capped openings
whose kept copies carry a merged label of their own) version 3 decodes to
exactly what version 2 does, in numpy (`codec.decode_records`) and through
`model.tfdata.training_dataset` bit for bit; the table round-trips and is
refused, naming the file and the field, when it is damaged, missing or
disagrees with its window; and the manifest names the table and its reader
checks it is there.  The planes are cross-checked in tests/format/test_planes.py.
"""
from __future__ import annotations

import json
import os

import numpy as np
from google.protobuf.internal.encoder import _VarintBytes
import pytest
import tensorflow as tf

from cloud.storage import open_storage
from format import codec
from format import layout
from format.documents import ManifestError
from format.window_manifest import parse_window_manifest, read_window_manifest, window_manifest_bytes, WINDOW_MANIFEST_VERSION
from format import schema
from format.example_fields import set_bytes, set_int64
from format.example_proto import Example
from model.tfdata import GroupDecoder, shard_record_version, training_dataset
from format.tfrecord import compress_gzip, frame_records
from pipeline import labels as L
from pipeline import positions as P
from testdata.random_games import engine_game, resigned_copy

CAP = 2


@pytest.fixture(scope="module", params=(9, 19))
def window(request):
    """(PositionBatch after capping, game index per position, GameTable) of finished and resigned games."""
    n = request.param
    rng = np.random.default_rng(23)
    finished = [engine_game(rng, n, visits=40, full_search_fraction=0.5, generation=g % 2) for g in range(4)]
    resigned = [resigned_copy(engine_game(rng, n, generation=2), 0.5) for _ in range(2)]
    games = finished + resigned
    labels = L.label_games(games, policy_fn=None, random_playouts=16, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=3)
    batch, stats = P.cap_positions(batch, CAP)  # every game shares move 0: its kept copies get a merged label
    assert stats["capped_keys"] >= 1
    batch = batch.take(np.random.default_rng(1).permutation(len(batch)))  # a shard's shuffled order
    table = codec.GameTable(board_size=n, generation=[g.generation for g in games],
                            ownership=P.game_label_rows(labels))
    assert table.fine.any() and not table.fine.all()  # played-out (fractional) and exact labels
    return batch, batch.instance.astype(np.int64), table


def test_version_3_records_keep_no_label_or_generation_per_position(window):
    batch, game, table = window
    compact = batch.compact(game, table)
    assert compact.version == 3 and compact.ownership is None
    # Only the capped openings' kept copies keep their own row: at most CAP per capped key.
    assert 1 <= compact.fine.sum() <= CAP * 2
    black_view = batch.ownership * batch.to_play[:, None]
    np.testing.assert_array_equal(compact.fine, (black_view != table.ownership[game]).any(axis=1))
    ex = Example()
    ex.ParseFromString(codec.encode_position_groups(compact)[0])
    features = set(ex.features.feature)
    assert ex.features.feature[schema.P_VERSION].int64_list.value == [3]
    assert schema.P2_OWNERSHIP not in features and schema.P2_GENERATION not in features and schema.P2_GAME in features


def test_version_3_decodes_to_version_2s_positions(window):
    batch, game, table = window
    v2 = [p for r in batch.encode(game) for p in codec.decode_records(r, "v2#0")]
    v3 = [p for r in batch.encode(game, table) for p in codec.decode_records(r, "v3#0", table=table)]
    assert len(v2) == len(v3) == len(batch)
    for two, three in zip(v2, v3):
        assert three.version == 3 and two.version == 2
        assert three.ownership.tobytes() == two.ownership.tobytes()
        assert three.generation == two.generation and three.game == two.game
        assert three.planes.tobytes() == two.planes.tobytes()
        for field in ("to_play", "value", "score", "policy_weight", "value_weight", "ownership_weight",
                      "score_weight", "move_number"):
            assert getattr(three, field) == getattr(two, field), field
        np.testing.assert_array_equal(three.policy_index, two.policy_index)
        np.testing.assert_array_equal(three.policy_prob, two.policy_prob)
    for i, position in enumerate(v3):  # and both are what the batch holds
        np.testing.assert_array_equal(position.ownership, batch.ownership[i].astype(np.float32) / schema.OWNERSHIP_SCALE)
        assert position.generation == batch.generation[i]


def _write_window(folder, batch, game, table) -> dict:
    """{2: v2 shard paths, 3: v3 shard paths} of the same positions, the v3 table beside its shards."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for version, attempt in ((2, "two"), (3, "three")):
        paths = []
        for shard, rows in enumerate(np.array_split(np.arange(len(batch)), 2)):
            path = os.path.join(folder, layout.shard_name(attempt, shard, 2))
            with open(path, "wb") as f:
                f.write(codec.encode_shard(batch.take(rows).encode(game[rows], table if version == 3 else None)))
            paths.append(path)
        out[version] = paths
    with open(os.path.join(folder, layout.game_table_name("three")), "wb") as f:
        f.write(codec.encode_game_table(table))
    return out


def test_training_dataset_gives_version_2s_batches_bit_for_bit(tmp_path, window):
    """The trainer's stream of a version-3 window, its table found beside the shards, is version 2's."""
    batch, game, table = window
    paths = _write_window(str(tmp_path), batch, game, table)
    assert [shard_record_version(p) for p in paths[3]] == [3, 3]
    n = table.board_size
    streams = {}
    for version in (2, 3):
        dataset = training_dataset(paths[version], board_size=n, batch_size=64, seed=4, shuffle_buffer=256,
                                   repeat=False)
        streams[version] = list(dataset)
    assert len(streams[2]) == len(streams[3]) == len(batch) // 64
    for two, three in zip(streams[2], streams[3]):
        for key in two:
            assert two[key].numpy().tobytes() == three[key].numpy().tobytes(), key
    # The table may also be named explicitly (a copy elsewhere).
    moved = str(tmp_path / "elsewhere.table.gz")
    os.rename(layout.game_table_beside(paths[3][0]), moved)
    with pytest.raises(codec.FormatError, match="three-games.table.gz.*is missing"):
        training_dataset(paths[3], board_size=n, batch_size=64, seed=4)
    dataset = training_dataset(paths[3], board_size=n, batch_size=64, seed=4, shuffle_buffer=256, repeat=False,
                               game_table=moved)
    first = next(iter(dataset))
    assert first["ownership"].numpy().tobytes() == streams[3][0]["ownership"].numpy().tobytes()


def test_a_version_3_record_needs_its_table_and_a_game_inside_it(window):
    batch, game, table = window
    record = batch.encode(game, table)[0]
    with pytest.raises(codec.FormatError, match="game table") as err:
        codec.decode_records(record, "w/s.tfrecord.gz#0")
    assert err.value.field == schema.P2_GAME and "w/s.tfrecord.gz#0" in str(err.value)
    short = codec.GameTable(board_size=table.board_size, generation=table.generation[:1],
                            ownership=table.ownership[:1])
    with pytest.raises(codec.FormatError, match="game table has 1") as err:
        codec.decode_records(record, "w/s.tfrecord.gz#0", table=short)
    assert err.value.field == schema.P2_GAME
    decoder = GroupDecoder(table.board_size, version=3, table=short)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'game' is outside the window's game table"):
        decoder.decode(tf.constant([record]), tf.zeros([int(min(len(batch), schema.POSITION_GROUP))], tf.int32))
    with pytest.raises(ValueError, match="game table"):
        GroupDecoder(table.board_size, version=3)


# --- the game table file ------------------------------------------------------------


def test_the_game_table_round_trips(window):
    _, _, table = window
    data = codec.encode_game_table(table)
    back = codec.decode_game_table(data, "t.table.gz", board_size=table.board_size, games=len(table))
    np.testing.assert_array_equal(back.ownership, table.ownership)
    np.testing.assert_array_equal(back.generation, table.generation)
    np.testing.assert_array_equal(back.fine, table.fine)
    assert codec.encode_game_table(back) == data  # deterministic bytes (a retried job compares them)


def _table_file(table: codec.GameTable, **fields) -> bytes:
    """The table's file with ``fields`` replaced (tampering)."""
    from format.tfrecord import decompress_gzip, iter_framed_records
    (record,) = iter_framed_records(decompress_gzip(codec.encode_game_table(table), "t"), "t")
    ex = Example()
    ex.ParseFromString(record)
    for name, value in fields.items():
        del ex.features.feature[name]
        if isinstance(value, bytes):
            set_bytes(ex, name, value)
        else:
            set_int64(ex, name, value)
    return compress_gzip(frame_records([ex.SerializeToString()]))


@pytest.mark.parametrize("tamper, field, problem", [
    (lambda t: _table_file(t, version=[2]), schema.GT_VERSION, "unknown game-table version 2"),
    (lambda t: _table_file(t, count=[len(t) + 1]), schema.GT_COUNT, "manifest lists"),
    (lambda t: _table_file(t, generation=[0]), schema.GT_GENERATION, "expected"),
    (lambda t: _table_file(t, fine=[2] * len(t)), schema.GT_FINE, "each 0 or 1"),
    (lambda t: _table_file(t, ownership=bytes([243]) * (len(t) * schema.trit_bytes(t.board_size))), schema.GT_OWNERSHIP,
     "not 5 base-3 digits"),
    (lambda t: _table_file(t, ownership_fine=bytes([128]) * (int(t.fine.sum()) * t.board_size ** 2)),
     schema.GT_OWNERSHIP_FINE, "holds -128"),
    (lambda t: _table_file(t, ownership_fine=b""), schema.GT_OWNERSHIP_FINE, "fine games"),
])
def test_a_bad_game_table_is_refused_naming_the_file_and_field(window, tamper, field, problem):
    _, _, table = window
    with pytest.raises(codec.FormatError) as err:
        codec.decode_game_table(tamper(table), "w/x-games.table.gz", board_size=table.board_size,
                                games=len(table))
    assert err.value.field == field and problem in str(err.value) and "w/x-games.table.gz" in str(err.value)


def test_a_damaged_or_foreign_game_table_file_is_refused(window):
    _, _, table = window
    data = bytearray(frame_records([b"x" * 40]))
    data[20] ^= 0xFF  # a flipped byte: the framing's CRC
    for bad, problem in ((compress_gzip(bytes(data)), "CRC"), (b"not gzip", "gzip"),
                         (compress_gzip(frame_records([b"a", b"b"])), "one record")):
        with pytest.raises(codec.FormatError, match=problem) as err:
            codec.decode_game_table(bad, "w/x-games.table.gz")
        assert "w/x-games.table.gz" in str(err.value)
    with pytest.raises(codec.FormatError, match="board") as err:
        codec.decode_game_table(codec.encode_game_table(table), "t", board_size=7)
    assert err.value.field == schema.GT_BOARD_SIZE


# --- the manifest names it; the readers check it ------------------------------------


def _publish(storage, generation, batch, game, table, *, write_table=True) -> dict:
    attempt = "abc1"
    names = [layout.shard_name(attempt, 0, 1)]
    storage.write_new(layout.shard_path(generation, names[0]), codec.encode_shard(batch.encode(game, table)))
    if write_table:
        storage.write_new(layout.game_table_path(generation, layout.game_table_name(attempt)),
                          codec.encode_game_table(table))
    document = {"version": WINDOW_MANIFEST_VERSION, "record_version": 3, "target_generation": generation,
                "board_size": table.board_size, "shards": names, "positions": len(batch),
                "games": [f"g{i}" for i in range(len(table))], "game_table": layout.game_table_name(attempt)}
    storage.write_new(layout.window_manifest(generation), window_manifest_bytes(document))
    return document


def test_the_manifest_names_the_table_and_the_readers_check_it(tmp_path, window):
    batch, game, table = window
    storage = open_storage(str(tmp_path / "lake"))
    _publish(storage, 1, batch, game, table)
    manifest = read_window_manifest(storage, 1, check_shards=True)
    assert manifest.record_version == 3
    assert manifest.game_table == layout.game_table_path(1, layout.game_table_name("abc1"))
    assert manifest.files == manifest.shards + (manifest.game_table,)
    assert layout.game_table_beside(storage.url(manifest.shards[0])) == storage.url(manifest.game_table)
    read = codec.read_window_table(storage, manifest)
    records = codec.read_shard(storage.read(manifest.shards[0]), manifest.shards[0],
                               games=manifest.document["games"], table=read)
    assert [r.game_id for r in records] == [f"g{g}" for g in game]

    _publish(storage, 2, batch, game, table, write_table=False)
    with pytest.raises(ManifestError, match="field 'game_table'.*-games.table.gz, which is missing"):
        read_window_manifest(storage, 2, check_shards=True)
    with pytest.raises(codec.FormatError, match="abc1-games.table.gz: is missing"):
        codec.read_window_table(storage, read_window_manifest(storage, 2))

    document = json.loads(storage.read(layout.window_manifest(1)))
    for bad in ({k: v for k, v in document.items() if k != "game_table"}, {**document, "game_table": "../x"},
                {**document, "game_table": document["shards"][0]}):
        with pytest.raises(ManifestError, match="field 'game_table'"):
            parse_window_manifest(json.dumps(bad).encode(), layout.window_manifest(1))
    more_games = {**document, "games": document["games"] + ["extra"]}
    storage.write_replace(layout.window_manifest(1), json.dumps(more_games).encode())
    with pytest.raises(codec.FormatError, match="manifest lists") as err:
        codec.read_window_table(storage, read_window_manifest(storage, 1))
    assert err.value.field == schema.GT_COUNT and storage.url(manifest.game_table) in str(err.value)


# --- the wire encoder the job uses ----------------------------------------------------


@pytest.mark.parametrize("version", (2, 3))
def test_the_wire_encoder_writes_the_reference_bytes(window, version):
    """codec.encode_groups (what the shuffle job writes) == the protobuf reference, byte for byte, on full
    and short records; and with game indices, move numbers and captures past one and two varint bytes."""
    batch, game, table = window
    for rows in (np.arange(len(batch)), np.arange(schema.POSITION_GROUP + 5), np.arange(3), np.arange(0)):
        compact = batch.take(rows).compact(game[rows], table if version == 3 else None)
        assert codec.encode_groups(compact) == codec.encode_position_groups(compact)
    compact = batch.compact(game, table if version == 3 else None)
    compact.game = compact.game * 40_000 + 5             # 3-byte varints
    compact.move_number = compact.move_number + (1 << 40)  # 6-byte varints
    compact.generation = compact.generation + 200          # 2-byte varints
    assert codec.encode_groups(compact) == codec.encode_position_groups(compact)


def test_varints_match_protobufs():
    from format.group_wire import varints

    rng = np.random.default_rng(0)
    for high in (100, 3000, 1 << 30, 1 << 62):
        values = rng.integers(0, high, 500)
        data, offsets = varints(values)
        ex = Example()
        set_int64(ex, "v", values)
        wire = ex.features.feature["v"].int64_list.SerializeToString()
        assert wire == b"\x0a" + _VarintBytes(len(data)) + data.tobytes()    # protobuf's own varint
        assert len(offsets) == len(values) + 1 and offsets[-1] == len(data)
    with pytest.raises(ValueError):
        varints(np.array([-1]))


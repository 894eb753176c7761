"""Position records and the window game table (format/SPEC.md "Position records", "Window game table").

A record keeps each position's board, recent moves, targets and game; each
game's ownership label and generation are one row of the window's game
table.  Here, on finished games, resigned games with fractional
random-playout labels, and capped openings whose kept copies carry a merged
label of their own: the records decode to what the batch holds (numpy,
`codec.decode_records`) and the trainer finds the table; bad records and
shards of an older (or unknown) version are refused in one line naming the
file and the field, saying what to do; the table round-trips and is
refused, naming the file and the field, when it is damaged, missing or
disagrees with its window; the manifest names the table and its reader
checks it is there; the wire encoder writes the protobuf reference's bytes.
The planes are cross-checked in tests/format/test_planes.py, the policy
values in tests/format/test_policy_values.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from google.protobuf.internal.encoder import _VarintBytes
import pytest
import tensorflow as tf

from cloud.storage import open_storage
from format import codec
from format.documents import ManifestError
from format.window_manifest import WINDOW_MANIFEST_VERSION, parse_window_manifest, read_window_manifest, window_manifest_bytes
from format import layout
from format import schema
from format.example_fields import set_bytes, set_int64
from format.example_proto import Example
from model.tfdata import GroupDecoder, shard_record_version, training_dataset
from format.tfrecord import compress_gzip, frame_records
from pipeline import labels as L
from pipeline import positions as P
from testdata.random_games import engine_game, resigned_copy
from tests.format.reference_records import encode_position_groups, with_version

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


def test_trits_round_trip_and_mark_bad_bytes():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, size=(7, 361)).astype(np.uint8)
    packed = codec.pack_trits(codes)
    assert packed.shape == (7, schema.trit_bytes(19)) == (7, 73) and packed.max() <= 242
    np.testing.assert_array_equal(codec.unpack_trits(packed, 361), codes)
    assert (codec.unpack_trits(np.array([[243]], np.uint8), 5) == 3).all()


def test_records_keep_a_label_only_where_it_is_not_the_games_row(window):
    batch, game, table = window
    compact = batch.compact(game, table)
    # Only the capped openings' kept copies keep their own row: at most CAP per capped key.
    assert 1 <= compact.fine.sum() <= CAP * 2
    black_view = batch.ownership * batch.to_play[:, None]
    np.testing.assert_array_equal(compact.fine, (black_view != table.ownership[game]).any(axis=1))
    ex = Example()
    ex.ParseFromString(codec.encode_groups(compact)[0])
    features = set(ex.features.feature)
    assert ex.features.feature[schema.P_VERSION].int64_list.value == [schema.POSITION_RECORD_VERSION]
    assert "ownership" not in features and "generation" not in features and schema.P_GAME in features


def test_records_decode_to_the_batchs_positions(window):
    batch, game, table = window
    records = batch.encode(game, table)
    assert len(records) == -(-len(batch) // schema.POSITION_GROUP)
    decoded = [p for r in records for p in codec.decode_records(r, "s#0", table=table)]
    assert len(decoded) == len(batch)
    for i, rec in enumerate(decoded):
        assert rec.to_play == batch.to_play[i] and rec.move_number == batch.move_number[i] and rec.game_id == ""
        assert rec.game == game[i] and rec.generation == batch.generation[i]
        index, prob = batch.policy(i)
        np.testing.assert_array_equal(rec.policy_index, index)
        np.testing.assert_allclose(rec.policy_prob, prob, atol=1e-6)  # visit counts: exact
        # Exact labels (ternary), played-out ones (int8) and capped openings' own rows all come back.
        np.testing.assert_array_equal(rec.ownership, batch.ownership[i].astype(np.float32) / schema.OWNERSHIP_SCALE)
        assert rec.value == batch.value[i] and rec.score == batch.score[i]
        assert (rec.policy_weight, rec.value_weight, rec.ownership_weight, rec.score_weight) == (
            batch.policy_weight[i], batch.value_weight[i], batch.ownership_weight[i], batch.score_weight[i])
    assert {d.ownership_weight for d in decoded} == {1.0, 0.5}  # exact and played-out labels both present
    assert any(not np.isin(d.ownership, (-1.0, 0.0, 1.0)).all() for d in decoded)  # fractional ones too


def _record(compact: codec.CompactPositions, **fields) -> bytes:
    """The first record of ``compact`` with ``fields`` replaced (tampering)."""
    ex = Example()
    ex.ParseFromString(codec.encode_groups(compact)[0])
    for name, value in fields.items():
        del ex.features.feature[name]
        if isinstance(value, bytes):
            ex.features.feature[name].bytes_list.value.append(value)
        else:
            set_int64(ex, name, value)
    return ex.SerializeToString()


def _moves_above(n: int) -> bytes:
    """A moves column (64 positions) whose every move is one past "no move" (N*N + 1)."""
    dtype = np.uint8 if schema.move_bytes(n) == 1 else np.dtype("<u2")
    return np.full(64 * schema.HISTORY_MOVES, n * n + 2, dtype).tobytes()


@pytest.mark.parametrize("field, value, problem", [
    (schema.P_COUNT, lambda n: [65], lambda n: "outside 1..64"),
    (schema.P_BOARD, lambda n: bytes([243]) * (64 * schema.trit_bytes(n)), lambda n: "not 5 base-3 digits"),
    (schema.P_MOVES, _moves_above, lambda n: f"above {n * n + 1}"),
    (schema.P_POLICY_VALUE, lambda n: [0], lambda n: "integers in 1..65535"),
    (schema.P_CAPTURE_COUNT, lambda n: [1] * 64, lambda n: "sums to 64"),
    (schema.P_OWNERSHIP_FINE, lambda n: bytes(5), lambda n: f"own-label positions x {n * n}"),
])
def test_bad_records_are_refused_naming_the_field(field, value, problem, window):
    batch, game, table = window
    n = table.board_size
    rows = np.arange(schema.POSITION_GROUP)
    data = _record(batch.take(rows).compact(game[rows], table), **{field: value(n)})
    with pytest.raises(codec.FormatError) as err:
        codec.decode_records(data, "w/shard.tfrecord.gz#3", table=table)
    assert err.value.field == field and problem(n) in str(err.value) and "w/shard.tfrecord.gz#3" in str(err.value)


def test_game_ids_come_from_the_manifests_list(window):
    """A position stores its game's index in the table; the ids live once, in the manifest."""
    batch, game, table = window
    ids = [f"game-{g}" for g in range(len(table))]
    decoded = [p for r in batch.encode(game, table) for p in codec.decode_records(r, "s#0", games=ids, table=table)]
    assert [d.game_id for d in decoded] == [ids[g] for g in game]
    with pytest.raises(codec.FormatError, match="game table has 2") as err:
        codec.decode_records(batch.encode(game, table)[0], "s#0", games=ids[:2], table=table)
    assert err.value.field == schema.P_GAME


# --- shards of another version ---------------------------------------------------------


OLD_VERSIONS = range(1, schema.POSITION_RECORD_VERSION)
UNKNOWN_VERSION = schema.POSITION_RECORD_VERSION + 1
"""A position-record version no reader knows (yet)."""


def _shard_of_version(folder, batch, game, table, version: int) -> str:
    """A shard (its game table beside it, as the job leaves them) whose records say ``version``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, layout.shard_name("old", 0, 1))
    with open(path, "wb") as f:
        f.write(codec.encode_shard([with_version(r, version) for r in batch.encode(game, table)]))
    with open(layout.game_table_beside(path), "wb") as f:
        f.write(codec.encode_game_table(table))
    return path


def assert_rebuild_line(message: str, path: str, version: int) -> None:
    """One line that names the file and the version and says how to rebuild the window."""
    assert "\n" not in message.strip() and path in message and f"version-{version} " in message, message
    assert "rebuild the window" in message and "`python -m pipeline.shuffle --root ROOT`" in message, message


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_a_shard_of_an_older_version_is_refused_with_the_rebuild_command(tmp_path, window, version):
    """Every reader of a shard: the codec, the trainer's tf.data reader, and the manifest's reader."""
    batch, game, table = window
    path = _shard_of_version(str(tmp_path), batch, game, table, version)
    with open(path, "rb") as f:
        data = f.read()
    with pytest.raises(codec.FormatError) as err:
        codec.read_shard(data, path, table=table)
    assert err.value.field == schema.P_VERSION
    assert_rebuild_line(str(err.value), f"{path}#0", version)
    for record_version in (None, version):  # read from the shard, or the manifest's
        with pytest.raises(codec.FormatError) as err:
            training_dataset([path], board_size=table.board_size, batch_size=64, seed=0,
                             record_version=record_version)
        assert_rebuild_line(str(err.value), path, version)
    # A window whose manifest says the version the shard does not hold: the decoder's check in the graph.
    decoder = GroupDecoder(table.board_size, table=table, jit=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rebuild the window .*pipeline.shuffle --root ROOT"):
        decoder.decode(tf.constant([with_version(batch.encode(game, table)[0], version)]),
                       tf.zeros([schema.POSITION_GROUP], tf.int32))
    document = {"version": WINDOW_MANIFEST_VERSION, "target_generation": 3, "board_size": 9,
                "shards": ["a-0-of-1.tfrecord.gz"], "positions": 10, "record_version": version}
    with pytest.raises(ManifestError) as err:
        parse_window_manifest(json.dumps(document).encode(), layout.window_manifest(3))
    assert_rebuild_line(str(err.value), layout.window_manifest(3), version)


def test_the_inspect_tool_names_an_old_shard_in_one_line_without_a_traceback(tmp_path, window):
    batch, game, table = window
    path = _shard_of_version(str(tmp_path / "w"), batch, game, table, 3)
    done = subprocess.run([sys.executable, "-m", "format.inspect", "verify", path], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    (bad,) = [line for line in done.stdout.splitlines() if line.startswith("BAD ")]
    assert_rebuild_line(bad, path, 3)


def test_an_unknown_record_version_is_refused_with_what_to_do(tmp_path, window):
    batch, game, table = window
    path = _shard_of_version(str(tmp_path), batch, game, table, UNKNOWN_VERSION)
    with pytest.raises(codec.FormatError, match="update zerolake"):
        training_dataset([path], board_size=table.board_size, batch_size=8, seed=0)
    with open(path, "rb") as f, pytest.raises(codec.FormatError, match="update zerolake"):
        codec.read_shard(f.read(), path, table=table)


def test_window_manifest_names_its_record_version():
    path = layout.window_manifest(3)
    document = {"version": WINDOW_MANIFEST_VERSION, "target_generation": 3, "board_size": 9,
                "shards": ["a-0-of-1.tfrecord.gz"], "positions": 10, "record_version": schema.POSITION_RECORD_VERSION,
                "game_table": "a-games.table.gz"}
    manifest = parse_window_manifest(json.dumps(document).encode(), path)
    assert manifest.record_version == schema.POSITION_RECORD_VERSION
    del document["record_version"]  # manifests before version 2 records lacked the field: version 1
    with pytest.raises(ManifestError, match="version-1 position records.*pipeline.shuffle"):
        parse_window_manifest(json.dumps(document).encode(), path)
    document["record_version"] = UNKNOWN_VERSION
    with pytest.raises(ManifestError, match="record_version.*update zerolake"):
        parse_window_manifest(json.dumps(document).encode(), path)


def test_training_dataset_finds_the_table_beside_the_shards_or_where_named(tmp_path, window):
    batch, game, table = window
    n = table.board_size
    paths = []
    for shard, rows in enumerate(np.array_split(np.arange(len(batch)), 2)):
        path = os.path.join(str(tmp_path), layout.shard_name("three", shard, 2))
        with open(path, "wb") as f:
            f.write(codec.encode_shard(batch.take(rows).encode(game[rows], table)))
        paths.append(path)
    with open(os.path.join(str(tmp_path), layout.game_table_name("three")), "wb") as f:
        f.write(codec.encode_game_table(table))
    assert [shard_record_version(p) for p in paths] == [schema.POSITION_RECORD_VERSION] * 2
    first = next(iter(training_dataset(paths, board_size=n, batch_size=64, seed=4, shuffle_buffer=256,
                                       repeat=False)))
    moved = str(tmp_path / "elsewhere.table.gz")
    os.rename(layout.game_table_beside(paths[0]), moved)
    with pytest.raises(codec.FormatError, match="three-games.table.gz.*is missing"):
        training_dataset(paths, board_size=n, batch_size=64, seed=4)
    dataset = training_dataset(paths, board_size=n, batch_size=64, seed=4, shuffle_buffer=256, repeat=False,
                               game_table=moved)
    again = next(iter(dataset))
    for key in first:
        assert first[key].numpy().tobytes() == again[key].numpy().tobytes(), key


def test_a_record_needs_its_table_and_a_game_inside_it(window):
    batch, game, table = window
    record = batch.encode(game, table)[0]
    with pytest.raises(codec.FormatError, match="game table") as err:
        codec.decode_records(record, "w/s.tfrecord.gz#0")
    assert err.value.field == schema.P_GAME and "w/s.tfrecord.gz#0" in str(err.value)
    short = codec.GameTable(board_size=table.board_size, generation=table.generation[:1],
                            ownership=table.ownership[:1])
    with pytest.raises(codec.FormatError, match="game table has 1") as err:
        codec.decode_records(record, "w/s.tfrecord.gz#0", table=short)
    assert err.value.field == schema.P_GAME
    decoder = GroupDecoder(table.board_size, table=short)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'game' is outside the window's game table"):
        decoder.decode(tf.constant([record]), tf.zeros([int(min(len(batch), schema.POSITION_GROUP))], tf.int32))
    with pytest.raises(ValueError, match="game table"):
        GroupDecoder(table.board_size, table=None)


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
    document = {"version": WINDOW_MANIFEST_VERSION, "record_version": schema.POSITION_RECORD_VERSION,
                "target_generation": generation,
                "board_size": table.board_size, "shards": names, "positions": len(batch),
                "games": [f"g{i}" for i in range(len(table))], "game_table": layout.game_table_name(attempt)}
    storage.write_new(layout.window_manifest(generation), window_manifest_bytes(document))
    return document


def test_the_manifest_names_the_table_and_the_readers_check_it(tmp_path, window):
    batch, game, table = window
    storage = open_storage(str(tmp_path / "lake"))
    _publish(storage, 1, batch, game, table)
    manifest = read_window_manifest(storage, 1, check_shards=True)
    assert manifest.record_version == schema.POSITION_RECORD_VERSION
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


def test_the_wire_encoder_writes_the_reference_bytes(window):
    """codec.encode_groups (what the shuffle job writes) == the protobuf reference, byte for byte, on full
    and short records; and with game indices, move numbers and captures past one and two varint bytes."""
    batch, game, table = window
    for rows in (np.arange(len(batch)), np.arange(schema.POSITION_GROUP + 5), np.arange(3), np.arange(0)):
        compact = batch.take(rows).compact(game[rows], table)
        assert codec.encode_groups(compact) == encode_position_groups(compact)
    compact = batch.compact(game, table)
    compact.game = compact.game * 40_000 + 5             # 3-byte varints
    compact.move_number = compact.move_number + (1 << 40)  # 6-byte varints
    assert codec.encode_groups(compact) == encode_position_groups(compact)


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


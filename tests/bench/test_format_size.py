"""bench/format_size.py's peer layouts, checked on positions whose content is known.

The bench itself plays games and runs the shuffle job (minutes); here only
its writers of the peers' formats: Leela Zero's v2 training text (read back
bit for bit) and Minigo's record layout.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from format import schema
from format.example_proto import Example
from format.position_records import PositionRecord

_SPEC = importlib.util.spec_from_file_location("format_size_bench",
                                               Path(__file__).resolve().parents[2] / "bench" / "format_size.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def _position(rng, n: int, to_play: int, with_policy: bool = True) -> PositionRecord:
    planes = (rng.random((16, n, n)) < 0.3).astype(np.uint8)
    index = np.array([3, 17, n * n]) if with_policy else np.zeros(0, np.int64)
    prob = np.array([0.5, 0.25, 0.25], np.float32) if with_policy else np.zeros(0, np.float32)
    return PositionRecord(board_size=n, planes=planes, to_play=to_play, policy_index=index, policy_prob=prob,
                          value=-1.0, score=2.5, ownership=np.zeros(n * n, np.float32), policy_weight=1.0,
                          value_weight=1.0, ownership_weight=1.0, score_weight=1.0, game_id="g", move_number=4,
                          generation=0, game=0)


@pytest.mark.parametrize("to_play", [schema.BLACK, schema.WHITE])
def test_leela_zero_text_reads_back_bit_for_bit(to_play):
    position = _position(np.random.default_rng(1), 19, to_play)
    lines = bench.leela_zero_text(position).splitlines()
    assert len(lines) == 19
    for plane, line in zip(position.planes.reshape(16, -1), lines[:16]):
        assert len(line) == 91
        bits = bin(int(line[:90], 16))[2:].zfill(360) + line[90]
        assert [int(b) for b in bits] == plane.tolist()
    assert lines[16] == ("0" if to_play == schema.BLACK else "1")
    probabilities = np.array(lines[17].split(), np.float32)
    assert probabilities.shape == (362,) and probabilities[3] == 0.5 and probabilities[361] == 0.25
    assert probabilities.sum() == pytest.approx(1.0)
    assert lines[18] == "-1"


def test_minigo_records_hold_the_planes_channels_last_and_a_dense_policy():
    rng = np.random.default_rng(2)
    positions = [_position(rng, 9, schema.WHITE), _position(rng, 9, schema.BLACK, with_policy=False)]
    for position, record in zip(positions, bench.minigo_records(positions)):
        ex = Example()
        ex.ParseFromString(record)
        x = np.frombuffer(ex.features.feature["x"].bytes_list.value[0], np.uint8).reshape(9, 9, 17)
        np.testing.assert_array_equal(x[..., :16], position.planes.transpose(1, 2, 0))
        assert (x[..., 16] == (1 if position.to_play == schema.BLACK else 0)).all()
        pi = np.frombuffer(ex.features.feature["pi"].bytes_list.value[0], np.float32)
        if len(position.policy_index):
            assert pi.shape == (82,) and pi[3] == 0.5 and pi[81] == 0.25
        else:  # no target: the peers get a uniform one
            np.testing.assert_allclose(pi, 1 / 82)
        assert ex.features.feature["outcome"].float_list.value[0] == -1.0
    assert 0 < bench.minigo_bytes_per_record(positions) < 17 * 81 + 82 * 4


def test_shard_bytes_count_the_game_table(tmp_path):
    """A window's shard bytes include its game table: every byte the shards need."""
    from format import codec, layout
    from pipeline import labels as L
    from pipeline import positions as P
    from testdata.random_games import engine_game

    rng = np.random.default_rng(3)
    games = [engine_game(rng, 9) for _ in range(2)]
    labels = L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, [0, 1], dedup_max_move=0)
    table = codec.GameTable(board_size=9, generation=[0, 0], ownership=P.game_label_rows(labels))
    shard, table_name = layout.shard_name("a1", 0, 1), layout.game_table_name("a1")
    (tmp_path / shard).write_bytes(codec.encode_shard(batch.encode(None, table)))
    (tmp_path / table_name).write_bytes(codec.encode_game_table(table))
    manifest = {"folder": str(tmp_path), "shards": [shard], "game_table": table_name, "games": ["g0", "g1"]}
    size, positions = bench.shard_positions(manifest)
    assert size == (tmp_path / shard).stat().st_size + (tmp_path / table_name).stat().st_size
    assert len(positions) == len(batch) and {p.game_id for p in positions} == {"g0", "g1"}
    np.testing.assert_array_equal(positions[0].ownership, batch.ownership[0] / schema.OWNERSHIP_SCALE)

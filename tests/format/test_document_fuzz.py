"""Lake documents with hostile numbers: each reader gives its own named error, nothing else.

Hypothesis takes a real document of each kind (a window manifest written by
the shuffle job's writer, run.json, a lease record, a model manifest, the
loop's closing match record and budget record, a line of the ladder's results), picks any numeric field,
however deeply nested in its statistics, and replaces it with a value no
writer produces: huge, negative, NaN, infinite, a bool, a string, null.
Reading the result must either succeed or raise the reader's own error (which
names the object); any other exception is a traceback a user would see.
Cross-checks are tested directly: a manifest whose counts disagree with each
other, or with its shards' sizes, is refused.
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.storage import open_storage
from format import codec, layout
from format.documents import ManifestError
from format.model_manifest import parse_model_manifest
from format.window_manifest import MAX_WINDOW_POSITIONS, parse_window_manifest, read_window_manifest
from format.leases import LeaseDamaged, LeaseRecord
from format.loop_budget import LoopBudget
from format.run_config import RunConfig, RunConfigMismatch
from testdata.random_games import engine_game
from testdata.synthetic_windows import write_run_config

HOSTILE = st.one_of(
    st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 2 ** 63, 10 ** 400, -1, 0, True,
                     False, "7", None, [], {}]),
    st.floats(allow_nan=True, allow_infinity=True))


def numeric_paths(value, path=()):
    """Every path (keys and indices) to a number inside a JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numeric_paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numeric_paths(item, path + (index,))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


def with_hostile_number(data, document) -> bytes:
    """``document`` as JSON with one of its numbers, drawn, replaced by a drawn hostile value."""
    field = data.draw(st.sampled_from(list(numeric_paths(document))))
    return json.dumps(replaced(document, field, data.draw(HOSTILE))).encode()


def replaced(document, path, value):
    document = json.loads(json.dumps(document))
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return document


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    """A real window: legal games through the shuffle job itself (in-process Beam)."""
    from pipeline import shuffle

    root = str(tmp_path_factory.mktemp("fuzz") / "lake")
    storage = open_storage(root)
    write_run_config(storage, board_size=9)
    rng = np.random.default_rng(5)
    storage.write_new(layout.chunk_path(0, "fuzz", 1_700_000_000_000, 0),
                      codec.encode_chunk([engine_game(rng, 9) for _ in range(12)]))
    assert shuffle.main(["--root", root, "--window-min-positions", "100", "--shard-positions", "300",
                         "--workers", "1"]) == 0
    path = layout.window_manifest(1)
    return storage, json.loads(storage.read(path)), path


def test_the_manifest_has_numbers_to_mutate(window):
    _, document, _ = window
    assert len(list(numeric_paths(document))) >= 20 and len(document["shards"]) >= 2


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_window_manifest_with_any_hostile_number_is_a_named_error(window, data):
    _, document, path = window
    field = data.draw(st.sampled_from(list(numeric_paths(document))))
    value = data.draw(HOSTILE)
    text = json.dumps(replaced(document, field, value)).encode()
    try:
        manifest = parse_window_manifest(text, path)
    except ManifestError as exc:
        assert path in str(exc)
        return
    # Accepted: then whatever the trainer plans from it is sane.
    assert 0 < manifest.positions <= MAX_WINDOW_POSITIONS
    assert 5 <= manifest.board_size <= 19


def test_counts_are_cross_checked_within_the_manifest_and_against_the_shards(window, tmp_path):
    storage, document, path = window
    shards = document["shards"]
    positions = document["positions"]
    bad = {"positions": positions + 1}                                          # shard counts disagree
    with pytest.raises(ManifestError, match="shard_positions.*adds up to"):
        parse_window_manifest(json.dumps({**document, **bad}).encode(), path)
    lie = {name: 1 for name in shards} | {shards[0]: 10 ** 8 - len(shards) + 1}
    absurd = dict(document, positions=10 ** 8, shard_positions=lie,
                  generations={"0": 10 ** 8})                                   # consistent, but a lie
    parse_window_manifest(json.dumps(absurd).encode(), path)
    lake = open_storage(str(tmp_path / "lake"))
    for info in storage.list(layout.window_dir(1) + "/"):
        if info.path != path:
            lake.write_new(info.path, storage.read(info.path))
    lake.write_new(path, json.dumps(absurd).encode())
    with pytest.raises(ManifestError, match="positions.*more than its shards"):
        read_window_manifest(lake, 1, check_shards=True)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_run_json_with_any_hostile_number_is_a_named_error(data):
    document = json.loads(RunConfig(board_size=9, komi=7.5).to_json())
    text = with_hostile_number(data, document)
    try:
        config = RunConfig.from_json(text, "fuzz/" + layout.RUN_CONFIG)
    except RunConfigMismatch as exc:
        assert "fuzz/" + layout.RUN_CONFIG in str(exc)
        return
    assert 5 <= config.board_size <= 19 and math.isfinite(config.komi)


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_loop_budget_record_with_any_hostile_number_is_a_named_error(data):
    document = json.loads(LoopBudget(budget_seconds=7200.0, spent_seconds=1800.5).to_bytes())
    text = with_hostile_number(data, document)
    try:
        budget = LoopBudget.from_bytes(text, "fuzz/" + layout.LOOP_BUDGET)
    except ManifestError as exc:
        assert "fuzz/loop/budget.json: field '" in str(exc)
        return
    assert 0 <= budget.budget_seconds <= 2 ** 53 and 0 <= budget.spent_seconds <= 2 ** 53


def test_a_run_json_komi_too_large_to_double_is_a_named_error():
    # Hypothesis found it: 8.98e307 * 2 is inf, and the multiple-of-0.5 check's round(inf) raised
    # OverflowError past the named error.
    text = json.dumps({**json.loads(RunConfig().to_json()), "komi": 8.98846567431158e+307}).encode()
    with pytest.raises(RunConfigMismatch, match="komi"):
        RunConfig.from_json(text, "fuzz/" + layout.RUN_CONFIG)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_lease_record_with_any_hostile_number_is_damaged(data):
    document = json.loads(LeaseRecord("h:1:x", "h", 1, 1e9, 1e9, 1e9 + 60).to_bytes())
    text = with_hostile_number(data, document)
    try:
        record = LeaseRecord.from_bytes(text, "fuzz/" + layout.TRAINER_LEASE)
    except LeaseDamaged as exc:
        assert "trainer-lease.json" in str(exc)
        return
    assert 0 < record.pid and record.acquired <= record.renewed <= record.expires


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_model_manifest_with_any_hostile_number_is_a_named_error(data):
    document = {"version": 1, "generation": 3, "files": {"saved_model.pb": {"sha256": "0" * 64, "size": 1200}},
                "metadata": {"board_size": 9, "generation": 3, "global_step": 500, "window_positions": 120000,
                             "network": {"blocks": 4, "filters": 32}, "training_metrics": {"loss": 3.1}}}
    text = with_hostile_number(data, document)
    url = "fuzz/" + layout.model_manifest(3)
    try:
        manifest = parse_model_manifest(text, 3, url)
    except ManifestError as exc:
        assert url in str(exc)
        return
    assert 5 <= manifest.board_size <= 19 and manifest.generation == 3


def _closing_document() -> dict:
    """loop/final-<G>.json as the loop writes it: three closing matches, the GNU Go one with its games."""
    from format.match_record import ClosingRecord
    from arena.match import GameResult, summarize

    games = [GameResult(i, "model-g4" if i % 2 == 0 else "gnugo-l1", "gnugo-l1" if i % 2 == 0 else "model-g4",
                        (1, 2, 3), 1 if i < 3 else -1, None if i else -3.5, "resign",
                        f"loop/final-000004-gnugo-1/{i:05d}.sgf") for i in range(4)]
    record = summarize("model-g4", "gnugo-l1", 9, 7.5, games, 12.5).to_record()
    totals = dataclasses.replace(summarize("model-g4", "random", 9, 7.5, games, 3.0).to_record(), game_results=None)
    return json.loads(ClosingRecord(vs_random=totals, vs_generation_0=totals, vs_gnugo_1=record).to_bytes())


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_closing_match_record_with_any_hostile_number_is_a_named_error(data):
    from format.match_record import ClosingRecord

    document = _closing_document()
    text = with_hostile_number(data, document)
    url = "fuzz/" + layout.loop_marker("final-000004.json")
    try:
        closing = ClosingRecord.from_bytes(text, url)
    except ValueError as exc:
        assert str(exc).startswith(url)
        return
    for record in (closing.vs_random, closing.vs_generation_0, closing.vs_gnugo_1):
        assert record.wins + record.losses + record.draws == record.games
        assert 0 <= record.win_rate <= 1 and math.isfinite(record.seconds)


def _ladder_line() -> dict:
    return {"a": "gen:1", "b": "random", "black": "random", "conditions": "9x9 komi 7.5 visits 64 opening 4 cap 0",
            "digest": "3dcd256d69c3aec6", "end_reason": "two-passes", "index": 9, "moves": 75,
            "pairing": "gen-1_vs_random", "score": -20.5, "sgf": layout.ladder_game_sgf("gen-1_vs_random", 9),
            "time": 1795583308.730546, "version": 1, "white": "gen:1", "winner": -1}


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_ladder_results_line_with_any_hostile_number_is_a_named_error(tmp_path_factory, data):
    from arena.ladder import read_results

    document = _ladder_line()
    field = data.draw(st.sampled_from(list(numeric_paths(document))))
    storage = open_storage(str(tmp_path_factory.mktemp("ladder")))
    storage.write_replace(layout.ladder_results(), (json.dumps(replaced(document, field, data.draw(HOSTILE)))
                                                    + "\n").encode())
    try:
        [game] = read_results(storage)
    except ValueError as exc:
        assert storage.url(layout.ladder_results()) in str(exc) and "line 1" in str(exc)
        return
    assert game.winner in (-1, 0, 1) and game.index >= 0 and game.moves >= 0 and math.isfinite(game.time)
    assert game.score is None or math.isfinite(game.score)


def test_a_ladder_results_file_that_is_not_text_is_a_named_error(tmp_path):
    from arena.ladder import read_results

    storage = open_storage(str(tmp_path))
    storage.write_replace(layout.ladder_results(), b"\xff\xfe" + json.dumps(_ladder_line()).encode())
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_results(storage)


@pytest.mark.parametrize("entry", [[-5, 10], [1e300, 3], [True, 3], [3], "7", None, [2 ** 63, 1], {"games": 3}])
def test_a_doctored_chunk_count_cache_entry_is_counted_again_not_trusted(tmp_path, entry):
    from arena.ladder_report import chunk_counts

    storage = open_storage(str(tmp_path))
    rng = np.random.default_rng(3)
    games = [engine_game(rng, 9) for _ in range(3)]
    path = layout.chunk_path(0, "fuzz", 1_700_000_000_000, 0)
    storage.write_new(path, codec.encode_chunk(games))
    storage.write_replace(layout.ladder_chunk_counts(), json.dumps({path: entry}).encode())
    assert chunk_counts(storage) == {path: [3, sum(game.num_positions for game in games)]}
    assert json.loads(storage.read(layout.ladder_chunk_counts())) == {path: [3, sum(g.num_positions for g in games)]}

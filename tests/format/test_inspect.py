"""`python -m format.inspect` on local and gs:// lakes, good and damaged."""
import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import sgfmill.sgf

from format import layout
from format import codec
from format import schema
from format.inspect import main as inspect_main
from testdata.synthetic_games import synthetic_game
from format.tfrecord import compress_zstd, frame_records

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _games(seed, count=4, n=9, generation=0):
    rng = np.random.default_rng(seed)
    return [synthetic_game(rng, n, visits=60, full_search_fraction=0.5, generation=generation)
            for _ in range(count)]


def _write_lake(storage):
    """Three good chunks over two generations; returns the games written."""
    written = []
    for seq, gen in enumerate([0, 0, 1]):
        games = _games(seq, generation=gen)
        storage.write_new(layout.chunk_path(gen, "w1", 1000 + seq, seq), codec.encode_chunk(games))
        written += games
    return written


def _damage(storage, rng):
    """One chunk of each kind of damage verify must catch; returns their paths."""
    good = codec.encode_chunk(_games(99))
    cut = int(rng.integers(1, len(good) - 1))
    flip = int(rng.integers(0, len(good)))
    flipped = good[:flip] + bytes([good[flip] ^ 0x5A]) + good[flip + 1:]
    from tests.format.test_codec import _replace_ints, _tamper

    record = _tamper(codec.encode_game(_games(98, 1)[0]), schema.G_VERSION, _replace_ints([7]))
    bad = {
        layout.games_prefix(1) + "bad-1-truncated.tfrecord.zst": good[:cut],
        layout.games_prefix(1) + "bad-2-flipped.tfrecord.zst": flipped,
        layout.games_prefix(1) + "bad-3-notrecord.tfrecord.zst": compress_zstd(b"not a tfrecord " * 50),
        layout.games_prefix(1) + "bad-4-version.tfrecord.zst": compress_zstd(frame_records([record])),
    }
    for path, data in bad.items():
        storage.write_new(path, data)
    return list(bad)


def _summary(root, capsys):
    assert inspect_main(["summary", root, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _check_lake(storage, root, capsys):
    games = _write_lake(storage)
    summary = _summary(root, capsys)
    assert summary["games"] == len(games) == 12
    assert summary["positions"] == sum(g.num_positions for g in games)
    assert summary["generations"] == {"0": 8, "1": 4}
    assert summary["bad_files"] == {}
    assert inspect_main(["verify", root]) == 0
    capsys.readouterr()

    bad = _damage(storage, np.random.default_rng(3))
    assert inspect_main(["verify", root]) == 1
    out = capsys.readouterr().out
    for path in bad:
        assert f"BAD {storage.url(path)}" in out, path
    # summary still reports every good file
    summary = _summary(root, capsys)
    assert summary["chunks"] == 3
    assert summary["positions"] >= sum(g.num_positions for g in games)
    assert set(summary["bad_files"]) == {storage.url(p) for p in bad}


def test_local_lake_summary_and_verify(tmp_path, capsys):
    from cloud.storage import open_storage

    root = str(tmp_path / "lake")
    _check_lake(open_storage(root), root, capsys)


def test_gcs_lake_summary_and_verify(gcs_emulator, capsys):
    from cloud.storage import open_storage

    root = gcs_emulator.root_url("inspect")
    _check_lake(open_storage(root), root, capsys)


def test_gcs_round_trip_every_field(gcs_emulator):
    from cloud.storage import open_storage
    from tests.format.test_codec import assert_games_equal

    storage = open_storage(gcs_emulator.root_url("roundtrip"))
    games = _games(5, n=19)
    path = layout.chunk_path(2, "w9", 5, 0)
    storage.write_new(path, codec.encode_chunk(games))
    back = codec.read_chunk(storage.read(path), storage.url(path))
    for a, b in zip(games, back):
        assert_games_equal(a, b)


def test_game_exports_sgf_with_policy_comments(tmp_path):
    from cloud.storage import open_storage

    storage = open_storage(str(tmp_path))
    games = _games(11, count=2)
    path = layout.chunk_path(0, "w1", 1, 0)
    storage.write_new(path, codec.encode_chunk(games))
    out = tmp_path / "g.sgf"
    assert inspect_main(["game", storage.url(path), "--index", "1", "--sgf", str(out)]) == 0
    sgf = sgfmill.sgf.Sgf_game.from_bytes(out.read_bytes())
    assert sgf.get_size() == 9
    nodes = sgf.get_main_sequence()[1:]
    assert len(nodes) == games[1].num_positions
    full = int(np.flatnonzero(games[1].full_search)[0])
    assert "policy" in nodes[full].get("C")


def test_position_shows_board_policy_and_ownership(tmp_path):
    from cloud.storage import open_storage

    storage = open_storage(str(tmp_path))
    games = _games(12, count=1)
    path = layout.chunk_path(0, "w1", 1, 0)
    storage.write_new(path, codec.encode_chunk(games))
    move = 30
    result = subprocess.run(
        [sys.executable, "-m", "format.inspect", "position", storage.url(path), "--game", "0", "--move", str(move)],
        cwd=REPO, capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    board_rows = [l for l in lines if l[:2].strip().isdigit()]
    assert len(board_rows) == 9
    stones = sum(row[3:3 + 17].count("X") + row[3:3 + 17].count("O") for row in board_rows)
    assert stones == int(games[0].planes[move].sum())
    assert "root value" in result.stdout and "ownership" in result.stdout


def test_position_shows_a_game_id_with_escape_sequences_escaped():
    """A chunk's game id is whatever its writer put there: raw, an escape sequence reaches the terminal."""
    from format.inspect import render_position

    game = dataclasses.replace(_games(12, count=1)[0], game_id="w1\x1b]0;owned\x07\n")
    first = render_position(game, 3).splitlines()[0]
    assert first.startswith("game w1\\x1b]0;owned\\x07\\n move 3") and first.isprintable()


def test_bad_arguments_get_clear_errors(tmp_path):
    result = subprocess.run([sys.executable, "-m", "format.inspect", "position", str(tmp_path / "x.tfrecord.zst"),
                             "--move", "1"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0
    assert "x.tfrecord.zst" in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_record_files_are_bad(tmp_path, capsys):
    from format.inspect import main as inspect_main

    for name in ("000000/w-0000000000001-000000.tfrecord.zst", "shard-0.tfrecord.gz"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert inspect_main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.count("empty file (0 bytes)") == 2 and "0 good, 2 bad" in out


def test_unreadable_or_looping_entries_are_one_line_errors(tmp_path, capsys):
    import os

    from format.inspect import main as inspect_main

    os.symlink("loop.tfrecord.zst", tmp_path / "loop.tfrecord.zst")          # ELOOP
    assert inspect_main(["verify", str(tmp_path)]) == 2
    assert "cannot list" in capsys.readouterr().err
    os.unlink(tmp_path / "loop.tfrecord.zst")
    if os.geteuid() != 0:          # root reads any folder, so the unreadable case needs a user
        locked = tmp_path / "locked"
        locked.mkdir()
        os.chmod(locked, 0)
        try:
            assert inspect_main(["verify", str(tmp_path)]) == 2
            assert "cannot list" in capsys.readouterr().err
        finally:
            os.chmod(locked, 0o755)


def test_sgf_into_a_folder_or_missing_parent_is_one_line(tmp_path, capsys):
    from format.inspect import main as inspect_main

    path = layout.chunk_path(0, "w1", 1, 0)
    chunk = tmp_path / "lake" / path
    chunk.parent.mkdir(parents=True)
    chunk.write_bytes(codec.encode_chunk(_games(0, count=1)))
    for target in (tmp_path, tmp_path / "missing" / "game.sgf"):
        assert inspect_main(["game", str(chunk), "--sgf", str(target)]) == 2
        err = capsys.readouterr().err
        assert "--sgf" in err and "Traceback" not in err


def test_a_version_3_window_is_read_with_its_game_table(tmp_path, capsys):
    """Shards are decoded with the game table beside them; a missing or damaged table is named."""
    from cloud.storage import open_storage
    from pipeline import labels as L
    from pipeline import positions as P
    from testdata.random_games import engine_game

    rng = np.random.default_rng(4)
    games = [engine_game(rng, 9) for _ in range(3)]
    labels = L.label_games(games, policy_fn=None, random_playouts=2, model_playout_moves=0, temperature=1.0,
                           playout_weight=0.5, rng=rng, stats=L.empty_stats())
    batch = P.games_positions(games, labels, list(range(len(games))), dedup_max_move=0)
    table = codec.GameTable(board_size=9, generation=[0, 0, 0], ownership=P.game_label_rows(labels))
    root = str(tmp_path / "lake")
    storage = open_storage(root)
    shard = layout.shard_path(1, layout.shard_name("att1", 0, 1))
    table_path = layout.game_table_path(1, layout.game_table_name("att1"))
    storage.write_new(shard, codec.encode_shard(batch.encode(None, table)))
    storage.write_new(table_path, codec.encode_game_table(table))
    summary = _summary(root, capsys)
    assert summary["shard_positions"] == len(batch) and summary["game_tables"] == 1 and not summary["bad_files"]
    assert inspect_main(["verify", str(tmp_path / "lake" / shard)]) == 0  # one shard: its table is beside it
    capsys.readouterr()

    storage.delete(table_path)
    assert inspect_main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert f"BAD {storage.url(shard)}" in out and f"{storage.url(table_path)} is missing" in out
    storage.write_new(table_path, codec.encode_game_table(table)[:-9])  # truncated
    assert inspect_main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert f"BAD {storage.url(table_path)}" in out and "is damaged" in out and "0 good, 2 bad" in out


# --- links, stray names and special files: nothing hidden, nothing waited on --------


@pytest.mark.parametrize("linked", ["all games", "one generation"])
def test_a_linked_folder_hides_no_games_from_any_reader(tmp_path, capsys, linked):
    """``games/`` (or one generation of it) moved to another disk and linked back:
    inspect's summary and verify, the storage listing and the shuffle job's chunk
    list all see every chunk, as before the move."""
    from cloud.storage import open_storage
    from pipeline import window_plan

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    games = _write_lake(storage)
    chunks = storage.list()
    folder = storage.url((layout.games_prefix() if linked == "all games" else layout.games_prefix(0)).rstrip("/"))
    import os

    os.rename(folder, tmp_path / "disk2")
    os.symlink(tmp_path / "disk2", folder)
    assert storage.list() == storage.list(layout.games_prefix()) == chunks
    assert len(window_plan.list_chunks(storage)) == len(chunks) == 3
    summary = _summary(root, capsys)
    assert summary["chunks"] == 3 and summary["games"] == len(games) and summary["bad_files"] == {}
    assert inspect_main(["verify", root]) == 0
    assert "verified 3 files: 3 good, 0 bad" in capsys.readouterr().out
    inner = storage.url(layout.games_prefix(0).rstrip("/"))
    for target in (folder, inner):
        assert inspect_main(["verify", target]) == 0                     # the link itself as the target
    capsys.readouterr()


def test_a_stray_name_is_passed_by_with_one_warning(tmp_path, capsys, caplog):
    """A file whose name no object path has (a backslash) is no chunk to check: named once, skipped."""
    from cloud.storage import open_storage

    root = str(tmp_path / "lake")
    storage = open_storage(root)
    _write_lake(storage)
    stray = tmp_path / "lake" / layout.games_prefix(0) / "w1\\0000000000001-000000.tfrecord.zst"
    stray.write_bytes(b"not a chunk")
    caplog.set_level("WARNING", logger="cloud.base")
    assert inspect_main(["verify", root]) == 0
    assert "verified 3 files: 3 good, 0 bad" in capsys.readouterr().out
    assert _summary(root, capsys)["chunks"] == 3
    assert len([r for r in caplog.records if repr(str(stray)) in r.getMessage()]) == 1


def test_verify_refuses_a_fifo_by_name_and_never_waits_on_one(tmp_path, capsys):
    import os
    import threading

    fifo = tmp_path / "pipe.tfrecord.zst"
    os.mkfifo(fifo)
    done = threading.Event()

    def unblock():
        """After 20 s, end any read that waits on the FIFO (it gets EOF), so that a hang fails below."""
        done.wait(20)
        while not done.wait(0.2):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:     # no reader waiting
                pass

    timer = threading.Thread(target=unblock, daemon=True)
    timer.start()
    try:
        assert inspect_main(["verify", str(fifo)]) == 2
        err = capsys.readouterr().err
        assert f"{fifo}: not a regular file or a folder" in err, err
        assert inspect_main(["summary", str(fifo)]) == 2
        # In a folder it is no object: verify checks the rest and never opens it.
        (tmp_path / "000000").mkdir()
        (tmp_path / "000000" / "w-0000000000001-000000.tfrecord.zst").write_bytes(codec.encode_chunk(_games(1)))
        assert inspect_main(["verify", str(tmp_path)]) == 0
        assert "verified 1 files: 1 good, 0 bad" in capsys.readouterr().out
    finally:
        done.set()

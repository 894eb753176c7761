"""format.layout is the only module that spells a lake path.

Every other module in the project (the five roles, testdata/, bench/ and
the tests) asks format.layout for paths.  This test reads their source and
fails on any string that spells a lake path: ``games/``, ``windows/``,
``models/``, ``checkpoints/``, ``LATEST``, ``MANIFEST.json`` or
``run.json``.  Prose is not a path: docstrings, and strings with spaces in
them (help texts, messages), are allowed to mention the layout.  Tests that
tamper with a lake name its objects through format.layout; the storage
layer's tests use neutral object names (``data/000001/a.bin``), since they
test the storage, not the lake.  Only this file, the test of the layout
itself, spells lake paths (to check what the layout returns).
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

from format import layout
from format.documents import ManifestError
from format.window_manifest import parse_window_manifest, WINDOW_MANIFEST_VERSION

REPO = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("cloud", "format", "selfplay", "pipeline", "model", "testdata", "bench", "tests")
OWNER = REPO / "format" / "layout.py"
LAYOUT_TEST = pathlib.Path(__file__).resolve()
PATH_LITERAL = re.compile(r"(^|[/{}])(games|windows|models|checkpoints)/|(^|/)(LATEST|MANIFEST\.json|run\.json)($|[/{])")


def docstring_nodes(tree) -> set[int]:
    """ids of the Constant nodes that are docstrings or bare string statements."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.add(id(node.value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.JoinedStr):
            found.update(id(part) for part in node.value.values)
    return found


def path_literals(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    prose = docstring_nodes(tree)
    hits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in prose:
            continue
        text = node.value
        if any(c.isspace() for c in text):
            continue
        if PATH_LITERAL.search(text):
            hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {text!r}")
    return hits


def scanned_files():
    for package in SCANNED:
        for path in sorted((REPO / package).rglob("*.py")):
            if path not in (OWNER, LAYOUT_TEST):
                yield path


def test_no_module_but_the_layout_spells_a_lake_path():
    hits = [hit for path in scanned_files() for hit in path_literals(path)]
    assert not hits, "lake paths spelled outside format/layout.py:\n" + "\n".join(hits)


def test_the_scanner_finds_a_spelled_path(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""Docs may say ROOT/games/ and models/LATEST."""\n'
                     'A = f"windows/{g:06d}/MANIFEST.json"\nB = "models/LATEST"\nC = "see games/ there"\n')
    hits = _scan_outside_repo(probe)
    # The f-string's pieces ('windows/', '/MANIFEST.json') and "models/LATEST"; not the prose.
    assert sorted(hits) == ["/MANIFEST.json", "models/LATEST", "windows/"], hits


def _scan_outside_repo(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    prose = docstring_nodes(tree)
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
            and not any(c.isspace() for c in node.value) and PATH_LITERAL.search(node.value)]


def test_layout_paths_are_what_the_spec_says():
    assert layout.chunk_path(3, "w1", 1234, 5) == "games/000003/w1-0000000001234-000005.tfrecord.zst"
    assert layout.window_manifest(12) == "windows/000012/MANIFEST.json"
    assert layout.model_manifest(1) == "models/000001/MANIFEST.json"
    assert layout.LATEST == "models/LATEST" and layout.RUN_CONFIG == "run.json"
    assert layout.parse_chunk_path(layout.chunk_path(3, "w1", 1234, 5)).seq == 5
    assert layout.chunk_path(12, "w3", 1700000000000, 7) == "games/000012/w3-1700000000000-000007.tfrecord.zst"
    with pytest.raises(ValueError):
        layout.chunk_path(1, "a/b", 0, 0)
    assert layout.settings_record("loop", "20250101T000000Z-00ff") == "loop/settings/20250101T000000Z-00ff.json"
    assert layout.settings_records_prefix("cluster") == "cluster/settings/"
    with pytest.raises(ValueError):
        layout.settings_record("loop", "../x")
    assert layout.parse_chunk_path("games/3/x.tfrecord.zst") is None
    # A window: shards and the game table of the same job attempt.
    assert (layout.shard_path(2, layout.shard_name("6b03d37b", 1, 4))
            == "windows/000002/6b03d37b-00001-of-00004.tfrecord.gz")
    assert layout.game_table_path(2, layout.game_table_name("6b03d37b")) == "windows/000002/6b03d37b-games.table.gz"
    for shard in ("windows/000002/6b03d37b-00001-of-00004.tfrecord.gz",
                  "gs://bucket/lake/windows/000002/6b03d37b-00001-of-00004.tfrecord.gz",
                  "/tmp/stage/windows/000002/6b03d37b-00001-of-00004.tfrecord.gz"):
        assert layout.game_table_beside(shard) == shard.replace("-00001-of-00004.tfrecord.gz", "-games.table.gz")
    assert layout.game_table_beside("6b03d37b-00000-of-00001.tfrecord.gz") == "6b03d37b-games.table.gz"
    with pytest.raises(ValueError):
        layout.game_table_name("a-b")


# --- names the layout does not write: never parsed, refused in a manifest -----------

def test_only_the_names_the_layout_writes_parse():
    """ASCII digits of the layout's width, never another Unicode digit ('²' passed
    str.isdigit() and then crashed int(), killing every role that listed windows/)."""
    assert layout.parse_generation("000007") == 7 and layout.parse_generation(layout.generation_dir(10**6)) == 10**6
    for name in ("00000²", "٠٠٠٠٠٧", "00000７", "0000007", "00007", "+00007", " 00007", "00000a", "",
                 "1" * 5000):                                    # int() refuses over 4,300 digits
        assert layout.parse_generation(name) is None, name
    assert layout.window_generation("windows/00000²/x") is None
    assert not layout.is_window_manifest("windows/00000²/MANIFEST.json")
    chunk = layout.chunk_path(3, "w1", 1234, 5)
    assert layout.parse_chunk_path(chunk) is not None
    for bad in (chunk.replace("000003", "00000３"), chunk.replace("1234", "123٤"), chunk.replace("000005", "00000٥"),
                chunk.replace("000005", "5" * 5000)):
        assert layout.parse_chunk_path(bad) is None, bad
    assert layout.parse_job_tmp_dir("tmp/shuffle-000003-abc/x") == ("shuffle", 3, "abc")
    assert layout.parse_job_tmp_dir("tmp/shuffle-00000³-abc/x") is None
    assert layout.parse_job_tmp_dir("tmp/shuffle-0000003-abc/x") is None
    assert layout.parse_job_tmp_dir(f"tmp/shuffle-{'1' * 5000}-abc/x") is None


def _window_document(**changes) -> bytes:
    import json

    document = {"version": WINDOW_MANIFEST_VERSION, "target_generation": 4, "board_size": 9,
                "record_version": 4, "shards": ["a1-00000-of-00001.tfrecord.gz"], "positions": 10,
                "game_table": "a1-games.table.gz"}
    return json.dumps({**document, **changes}).encode()


@pytest.mark.parametrize("field,value", [
    ("shards", ["."]), ("shards", [".."]), ("shards", ["a/b.tfrecord.gz"]), ("shards", ["../x.tfrecord.gz"]),
    ("shards", [".zl-tmp-x.tfrecord.gz"]), ("shards", ["MANIFEST.json"]), ("shards", ["x\\y.tfrecord.gz"]),
    ("shards", [".tfrecord.gz"]), ("shards", ["a-0-of-1.tfrecord.gz"] * 2), ("shards", [7]),
    ("game_table", "."), ("game_table", ".."), ("game_table", "a/b.table.gz"), ("game_table", "x.tfrecord.gz"),
    ("game_table", ".zl-tmp-a.table.gz"), ("game_table", ""),
])
def test_a_window_manifest_naming_what_the_layout_never_writes_is_refused(field, value):
    """Each name is refused by the manifest's reader, naming the manifest and the field,
    and never reaches a path check that raises something else (a follower died of it)."""
    path = layout.window_manifest(4)
    with pytest.raises(ManifestError, match=rf"^gs://b/lake/{path}: field '{field}'") as caught:
        parse_window_manifest(_window_document(**{field: value}), path, f"gs://b/lake/{path}")
    assert caught.value.field == field


def test_a_window_manifest_with_the_layouts_names_is_read():
    path = layout.window_manifest(4)
    window = parse_window_manifest(_window_document(), path)
    assert window.shards == (layout.shard_path(4, layout.shard_name("a1", 0, 1)),)
    assert window.game_table == layout.game_table_path(4, layout.game_table_name("a1"))
    # Shard names of an earlier release's form are read too.
    other = parse_window_manifest(_window_document(shards=["a-0-of-1.tfrecord.gz"]), path)
    assert other.shards == ("windows/000004/a-0-of-1.tfrecord.gz",)

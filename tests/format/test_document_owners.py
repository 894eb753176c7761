"""Each lake document is parsed in exactly one place, its owner in format/, and read through typed fields.

The owners: format.layout (window and model manifests, settings records),
format.run_config (run.json), format.leases (leases and claims),
format.match_record (the loop's match results), format.loop_budget (the loop's
time spent), format.codec (chunks, shards, game tables).  This test reads the roles' source and fails when a module
outside format/ parses a document it read from storage (``json.loads`` of a
``.read(...)``) or reaches past an owner's typed fields into the raw
``.document`` it keeps for tools that show or rewrite a manifest.

A role's private documents, which nothing else reads, stay with the role;
each is listed here with what it is.
"""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
ROLES = ("cloud", "selfplay", "pipeline", "model")

PRIVATE_DOCUMENTS = {
    ("arena/ladder_report.py", "chunk_counts"): "the ladder's own cache of chunk counts (report/), rebuilt when bad",
    ("arena/ladder.py", "add_to_store"): "the anchor-game store's made.json, in the repository, not a lake",
    ("selfplay/spool.py", "_read_batches"): "a worker's spool batch files, on its own disk, not a lake",
}


def json_loads_of_reads(tree) -> list[tuple[str, int]]:
    """(enclosing function, line) of every ``json.loads(<x>.read(...))``."""
    found = []
    for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        for node in ast.walk(function):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "loads"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json" and node.args
                    and isinstance(node.args[0], ast.Call) and isinstance(node.args[0].func, ast.Attribute)
                    and node.args[0].func.attr == "read"):
                found.append((function.name, node.lineno))
    return found


def role_sources():
    for package in ROLES:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), ast.parse(path.read_text(), str(path))


def test_no_role_parses_a_document_it_read_from_storage():
    offenders = []
    for name, tree in role_sources():
        for function, line in json_loads_of_reads(tree):
            if (name, function) not in PRIVATE_DOCUMENTS:
                offenders.append(f"{name}:{line} ({function})")
    assert not offenders, "parse lake documents through their owner in format/: " + ", ".join(offenders)


def test_no_role_reads_a_manifest_as_a_raw_dict():
    offenders = [f"{name}:{node.lineno}" for name, tree in role_sources() for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and node.attr == "document"]
    assert not offenders, "use the owner's typed fields, not .document: " + ", ".join(offenders)


def test_the_checker_finds_a_raw_parse_and_a_raw_dict():
    tree = ast.parse("import json\ndef f(storage, window):\n    d = json.loads(storage.read('x'))\n"
                     "    return window.document['positions']\n")
    assert json_loads_of_reads(tree) == [("f", 3)]
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "document"] == [4]

"""Every reader of a lake document refuses one nested 3,000 levels deep in one line naming it.

6 KB of ``[`` made json raise RecursionError, which no reader caught: the
trainer, the shuffle job and the run page died with a traceback on such a
run.json or window manifest, and leases, claims, model manifests, settings
records, loop records, the ladder's ratings and its chunk-count cache were read
the same way.  Each reader kind here meets one (and a document past its bound,
and one that is not JSON) through `format.lake_json.parse`.
"""
from __future__ import annotations

import pytest

from cloud.storage import open_storage
from format import lake_json, layout, registry
from format.leases import LeaseDamaged, read_record
from format.match_record import ClosingRecord, MatchRecord
from format.run_config import RunConfigMismatch, read_run_config
from format.documents import ManifestError
from format.settings_record import parse_settings_record
from format.window_manifest import read_window_manifest

DEEP = b"[" * 3000 + b"]" * 3000
DEEP_OBJECT = b'{"a": ' + DEEP + b"}"


def test_parse_refuses_deep_damaged_and_oversized_documents_and_reads_the_rest():
    assert lake_json.parse(b'{"a": [1, {"b": "[[["}]}', 100) == {"a": [1, {"b": "[[["}]}
    nested = "[" * lake_json.MAX_DEPTH + "]" * lake_json.MAX_DEPTH
    assert lake_json.parse(nested, len(nested)) is not None            # the deepest a document may nest
    for data, problem in ((DEEP, "nested too deeply"), (DEEP_OBJECT, "nested too deeply"),
                          ("[" + nested + "]", "nested too deeply"),   # inside the recursion limit, past the bound
                          (b"{x", "not valid JSON"), (b"\xff{}", "not valid JSON"),
                          (b"{}" + b" " * 99, "is larger than 100 bytes")):
        with pytest.raises(lake_json.NotADocument, match=problem):
            lake_json.parse(data, 100 if problem.startswith("is larger") else len(data))


def write(storage, path: str, data: bytes) -> str:
    storage.write_new(path, data)
    return storage.url(path)


def test_each_format_reader_names_a_deep_document(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    url = write(storage, layout.RUN_CONFIG, DEEP_OBJECT)
    with pytest.raises(RunConfigMismatch, match="nested too deeply") as err:
        read_run_config(storage)
    assert str(err.value).startswith(url)

    url = write(storage, layout.window_manifest(1), DEEP_OBJECT)
    with pytest.raises(ManifestError, match="nested too deeply") as err:
        read_window_manifest(storage, 1)
    assert str(err.value).startswith(url)

    url = write(storage, registry.manifest_path(1), DEEP_OBJECT)
    with pytest.raises(registry.ModelIntegrityError, match="nested too deeply") as err:
        registry.read_manifest(storage, 1)
    assert str(err.value).startswith(url)

    with pytest.raises(ManifestError, match="nested too deeply") as err:
        parse_settings_record(DEEP, "settings.json")
    assert str(err.value).startswith("settings.json")

    url = write(storage, layout.TRAINER_LEASE, DEEP_OBJECT)
    with pytest.raises(LeaseDamaged, match="nested too deeply") as err:
        read_record(storage, layout.TRAINER_LEASE)
    assert str(err.value).startswith(url)
    url = write(storage, layout.window_claim(1), DEEP)
    with pytest.raises(LeaseDamaged, match="nested too deeply"):
        read_record(storage, layout.window_claim(1))

    for reader in (MatchRecord.from_bytes, ClosingRecord.from_bytes):
        with pytest.raises(ValueError, match="nested too deeply") as err:
            reader(DEEP_OBJECT, "loop/eval-1.json")
        assert str(err.value).startswith("loop/eval-1.json")


def test_the_ladders_readers_name_a_deep_ratings_file_and_chunk_count_cache(tmp_path):
    from arena.ladder_report import chunk_counts, read_ratings_document

    storage = open_storage(str(tmp_path / "lake"))
    url = write(storage, layout.report_path("ratings.json"), DEEP_OBJECT)
    with pytest.raises(ValueError, match="nested too deeply") as err:
        read_ratings_document(storage)
    assert str(err.value).startswith(url)

    url = write(storage, layout.ladder_chunk_counts(), DEEP_OBJECT)
    problems = []
    assert chunk_counts(storage, save=False, problems=problems) == {}
    assert problems == [f"{url}: not valid JSON (arrays or objects nested too deeply: a lake document nests at most "
                        f"{lake_json.MAX_DEPTH} levels); its chunks are counted again"]

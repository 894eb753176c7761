"""The shuffle job against a gs:// root on gcp-storage-emulator (started by the fixture).

Every object the job touches (run.json, chunks, temporary pieces, shards,
the manifest) goes through cloud.storage's GCS backend, in the driver and in
the Beam workers alike.
"""
from __future__ import annotations

import json

import numpy as np

from format import layout
from format.window_manifest import read_window_manifest
from format import codec
from format import schema
from format.run_config import RunConfig
from testdata.synthetic_games import synthetic_game
from pipeline.shuffle import main


def test_job_runs_on_a_gs_root(gcs_emulator):
    root = gcs_emulator.root_url("shuffle")
    storage = gcs_emulator.open(root)
    storage.write_new(layout.RUN_CONFIG, RunConfig(board_size=9).to_json())
    rng = np.random.default_rng(3)
    positions = 0
    for seq in range(4):
        games = [synthetic_game(rng, 9, visits=20, generation=seq // 2) for _ in range(8)]
        positions += sum(g.num_positions for g in games)
        storage.write_new(layout.chunk_path(seq // 2, "w", 1_700_000_000_000 + seq, seq), codec.encode_chunk(games))
    broken = layout.chunk_path(1, "w", 1_600_000_000_000, 9)
    storage.write_new(broken, b"\x28\xb5\x2f\xfd not really zstd")

    assert main(["--root", root, "--workers", "1", "--shard-positions", "300", "--reuse", "1.0",
                 "--dedup-max-move", "0", "--seed", "5"]) == 0

    window = f"{layout.WINDOWS_DIR}/{layout.generation_dir(1)}"
    manifest = json.loads(storage.read(f"{window}/{layout.MANIFEST}"))
    assert manifest["input"]["positions_read"] == positions
    assert [s["chunk"] for s in manifest["chunks_skipped"]] == [broken]
    records = 0
    table = codec.read_window_table(storage, read_window_manifest(storage, 1, check_shards=True))
    for name in manifest["shards"]:
        shard = codec.read_shard(storage.read(f"{window}/{name}"), name, table=table)
        assert len(shard) == manifest["shard_positions"][name]
        records += len(shard)
    assert records == manifest["positions"] == positions  # reuse 1, nothing capped
    assert len(manifest["shards"]) >= 2
    assert storage.list("tmp/") == []

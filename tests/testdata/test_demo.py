"""testdata.demo writes its synthetic (rule-breaking) games only where no real run lives.

Its default root used to be ``./lake``, the loop's, and the next shuffle job
trained on its games.  Now it writes into an empty root or one it made
itself, and refuses any other with one line, writing nothing.
"""
from __future__ import annotations

from cloud.storage import open_storage
from format import codec, layout
from format.run_config import RunConfig, ensure_run_config
from testdata import demo


def test_the_demo_refuses_a_real_lake_and_reuses_its_own(tmp_path, capsys):
    real = open_storage(str(tmp_path / "real"))
    ensure_run_config(real, RunConfig(board_size=9))
    real.write_new(layout.chunk_path(0, "w", 1_700_000_000_000, 0), codec.encode_chunk([]))
    before = real.list("")
    assert demo.main(["--root", str(tmp_path / "real"), "--chunks", "1", "--games-per-chunk", "2"]) == 2
    err = capsys.readouterr().err
    assert "is not a demo lake" in err and len(err.strip().splitlines()) == 1
    assert real.list("") == before                                   # nothing written

    root = str(tmp_path / "demo")
    assert demo.main(["--root", root, "--chunks", "1", "--games-per-chunk", "2"]) == 0
    assert demo.main(["--root", root, "--chunks", "1", "--games-per-chunk", "2"]) == 0   # its own: reused
    storage = open_storage(root)
    assert storage.exists(layout.DEMO_MARKER)
    assert len([i for i in storage.list(layout.games_prefix())]) == 2

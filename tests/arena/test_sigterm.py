"""Nothing is left behind: a match, the GTP engine or the ladder stopped by SIGTERM removes its model cache
(processes.sigterm)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloud.local import LocalStorage
from format import layout, registry
from format.run_config import RunConfig, ensure_run_config

REPO = Path(__file__).resolve().parents[2]

STUB_TENSORFLOW = '''"""Stand-in for TensorFlow: a model load that never ends, reached at once."""
import time


class saved_model:
    @staticmethod
    def load(path):
        time.sleep(120)
'''

STOPPED_WHILE_LOADING = {
    "match": (["arena.match", "model:{lake}@1", "random", "--games", "1"],
              "arena.match: stopped by SIGTERM; no result"),
    # GUIs (Sabaki, GoGui) and systemd stop an engine with SIGTERM.
    "gtp": (["arena.gtp", "--root", "{lake}", "--quiet"], "arena.gtp: stopped by SIGTERM"),
    # One generation against one anchor: the model is the first thing it loads.
    "ladder": (["arena.ladder", "--root", "{lake}", "--anchors", "random", "--anchor", "random",
                "--games", "1", "--no-stored-anchor-games"],
               "arena.ladder: stopped by SIGTERM; every game played so far is kept (rerun to go on)"),
}


@pytest.mark.parametrize("program", sorted(STOPPED_WHILE_LOADING))
def test_a_program_stopped_by_sigterm_removes_its_model_cache(tmp_path, program):
    """SIGTERM while a match, the GTP engine or the ladder loads its model: the cache's files are
    fetched, TMPDIR is empty afterwards (the engine and the ladder used to die leaving the copy).

    A stand-in ``tensorflow`` whose ``saved_model.load`` blocks holds the program
    inside loading, its cache full, without paying TensorFlow's import
    (seconds); a match of two network-free players makes no cache at all.
    """
    lake = tmp_path / "lake"
    ensure_run_config(LocalStorage(str(lake)), RunConfig(board_size=9))   # the ladder needs the run
    publish_fake_model(lake, tmp_path / "export")
    env, tmpdir = stub_environment(tmp_path, STUB_TENSORFLOW)
    args, last_line = STOPPED_WHILE_LOADING[program]
    proc = subprocess.Popen([sys.executable, "-m", *(arg.format(lake=lake) for arg in args)], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmpdir.glob(f"zerolake-models-*/{layout.generation_dir(1)}/variables/data")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1] == last_line and "Traceback" not in err, err
    assert os.listdir(tmpdir) == []


def stub_environment(tmp_path: Path, stub_source: str) -> tuple[dict, Path]:
    """(a child's environment with the stand-in TensorFlow ``stub_source`` first on its path and
    TMPDIR a fresh folder, that folder): what a program leaves in TMPDIR can then be counted."""
    stub = tmp_path / "stub" / "tensorflow"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(stub_source)
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    return dict(os.environ, PYTHONPATH=f"{stub.parent}{os.pathsep}{REPO}", TMPDIR=str(tmpdir)), tmpdir


def publish_fake_model(lake: Path, export: Path) -> None:
    """Publish files that only a stand-in TensorFlow loads as generation 1 (LATEST moves to it)."""
    (export / "variables").mkdir(parents=True)
    (export / "saved_model.pb").write_bytes(b"graph")
    (export / "variables" / "data").write_bytes(b"weights" * 10)
    registry.publish_model(LocalStorage(str(lake)), 1, str(export), {"board_size": 9})

"""No traffic but what the run needs: every role, run on a local lake, connects to nothing.

What a run needs (README, "What leaves the machine"): the lake (a folder here,
so nothing), GCS authentication and the Dataflow API when configured.  Each
role runs under `tests.network_guard.run_offline`: a network namespace whose
only interface is loopback (so nothing can leave the machine even if the code
is wrong) and strace following every child, so telemetry sent from a forked
copy or from native code is seen too.  The roles are run where the libraries
that had telemetry are used: the worker and the GTP engine convert a float
model through OpenVINO on load, the trainer quantizes its int8 copy with NNCF
and OpenVINO at publish, and the shuffle job labels games with the model.
Before `inference.openvino_evaluator.block_usage_telemetry`, one conversion made
about 110 attempts (DNS look-ups of an analytics host from forked senders).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cloud.local import LocalStorage
from format import layout
from format.window_manifest import read_window_manifest
from tests.network_guard import missing_tools, run_offline

REPO = Path(__file__).resolve().parents[2]
SMALL_NETWORK = dict(blocks=1, filters=16, global_pool_every=1, global_pool_channels=8, value_hidden=16)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """``run(name, *argv)``: ``python -m <argv>`` offline in the repository, with a fresh HOME;
    returns (result, the IPv4/IPv6 connection attempts it made)."""
    assert missing_tools() is None, f"{missing_tools()} (scripts/setup.sh --test installs them)"
    scratch = tmp_path_factory.mktemp("guarded")
    home = scratch / "home"
    home.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(home), TF_CPP_MIN_LOG_LEVEL="3",
               XDG_STATE_HOME=str(scratch / "state"), XDG_CACHE_HOME=str(scratch / "cache"))

    def run(name, *argv, input=None):
        return run_offline([sys.executable, *argv], str(scratch / f"{name}.strace"), cwd=REPO, env=env,
                           input=input, capture_output=True, text=True, timeout=300)

    run.home = home
    return run


def test_the_guard_sees_a_connection_made_by_a_child_process(guarded):
    # The control: a grandchild (through a shell) connecting to a documentation-only
    # address, which the namespace cannot reach, is recorded; loopback is told apart.
    code = ("import socket, subprocess, sys\n"
            "for address in ('192.0.2.1', '127.0.0.1'):\n"
            "    try: socket.create_connection((address, 9), timeout=1)\n"
            "    except OSError: pass\n")
    result, attempts = guarded("control", "-c", f"import subprocess, sys; subprocess.run(['sh', '-c', "
                                             f"'\"{sys.executable}\" -c \"$0\"', {code!r}])")
    assert result.returncode == 0, result.stderr
    assert [(a.address, a.port, a.loopback) for a in attempts] == [("192.0.2.1", 9, False), ("127.0.0.1", 9, True)]


def test_no_role_connects_anywhere_on_a_local_lake(guarded, tmp_path):
    from testdata.models import publish_untrained_model

    lake = tmp_path / "lake"
    # A float model without its int8 copy: the worker and the GTP engine convert it through OpenVINO.
    publish_untrained_model(str(lake), 1, 9, network=SMALL_NETWORK, seed=3)
    runs = {
        "worker": guarded("worker", "-m", "selfplay.worker", "--root", str(lake), "--board-size", "9",
                          "--games", "8", "--visits", "4", "--fast-visits", "2", "--max-games", "8",
                          "--chunk-games", "8"),
        "shuffle": guarded("shuffle", "-m", "pipeline.shuffle", "--root", str(lake), "--workers", "1",
                           "--window-min-positions", "100", "--model-playout-moves", "4"),
        "trainer": guarded("trainer", "-m", "model.train", "--root", str(lake), "--blocks", "1", "--filters",
                           "16", "--value-hidden", "16", "--batch-size", "32", "--steps-per-window", "20",
                           "--checkpoint-every", "20", "--log-every", "20", "--steps-per-call", "10",
                           "--warmup-steps", "10"),
    }
    # Generation 1 again (the trainer's generation 2 has its int8 copy, which needs no conversion).
    runs["gtp"] = guarded("gtp", "-m", "arena.gtp", "--root", str(lake), "--generation", "1", "--visits", "8",
                          input="boardsize 9\ngenmove b\nquit\n")
    for role, (result, attempts) in runs.items():
        assert result.returncode == 0, f"{role}: {result.stdout[-2000:]}{result.stderr[-3000:]}"
        assert [a for a in attempts if not a.loopback] == [], f"{role} tried to connect: {attempts}"
    storage = LocalStorage(str(lake))
    assert read_window_manifest(storage, 2).positions > 0        # the shuffle did label and write
    assert storage.exists(layout.model_file(2, layout.CPU_INT8_XML))    # the trainer did quantize
    assert "= " in runs["gtp"][0].stdout                                 # the engine did answer genmove
    assert not (guarded.home / "intel").exists()                        # no telemetry client id either

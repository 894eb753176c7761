"""bench/selfplay.py's counting pieces: the peer's weights file, its output parser, the FLOP count."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "selfplay.py"


@pytest.fixture(scope="module")
def bench():
    # bench/selfplay.py shares the selfplay package's name, so it is loaded by path.
    spec = importlib.util.spec_from_file_location("bench_selfplay", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_leela_zero_weights_have_its_v1_layout(bench, tmp_path):
    path = tmp_path / "w.txt"
    bench.write_leela_zero_weights(path, blocks=2, filters=8)
    lines = path.read_text().splitlines()
    assert lines[0] == "1"
    sizes = [len(line.split()) for line in lines[1:]]
    conv3 = lambda cin, cout: [cout * cin * 9, cout, cout, cout]   # noqa: E731
    want = conv3(18, 8) + conv3(8, 8) * 4 + [2 * 8, 2, 2, 2, 2 * 361 * 362, 362]
    want += [8, 1, 1, 1, 361 * 256, 256, 256, 1]
    assert sizes == want
    # Leela Zero counts residual blocks as (lines - 1 - 4 - 14) / 8.
    assert (len(lines) - 1 - 4 - 14) / 8 == 2
    variances = np.array(lines[4].split(), float)
    assert (variances > 0).all()


def test_the_benchmark_line_is_parsed_and_a_missing_one_is_an_error(bench, tmp_path):
    line = "1600 visits, 541 nodes, 1599 playouts, 131 n/s"
    assert bench.BENCHMARK_LINE.findall("noise\n" + line + "\n")[-1] == ("1600", "541", "1599", "131")
    fake = tmp_path / "leelaz"
    fake.write_text("#!/bin/sh\necho 'weights file is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeError, match="without its benchmark line.*weights file is broken"):
        bench.run_leela_zero_benchmark(fake, tmp_path / "w.txt", 10, 1)


def test_a_missing_leela_zero_names_the_install_command(bench, monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "LEELAZ", tmp_path / "absent")
    with pytest.raises(SystemExit, match="apt-get install -y leela-zero"):
        bench.require_leela_zero()


def test_direct_flops_are_counted_by_hand_on_a_tiny_network(bench):
    from model.config import NetworkConfig
    from model.network import build_network

    n, f = 5, 4
    points, actions = n * n, n * n + 1
    convs = (17 * f * 9 + 2 * f * f * 9) * points        # stem + one block, multiply-adds
    value_heads = (2 * f + f) * points + 2 * points * 3 + 3 * 1 + 3 * 1   # value, ownership; hidden, value, score
    # The bench's pinned head: AlphaGo Zero's 2-channel 1x1 conv into a dense layer.
    dense = build_network(NetworkConfig(board_size=n, blocks=1, filters=f, value_hidden=3, policy_head="dense"))
    dense_policy = 2 * f * points + 2 * points * actions
    assert bench.direct_flops_per_evaluation(dense) == 2 * (convs + value_heads + dense_policy)
    # The default conv head: a 1x1 conv to 16 channels, one to each point's logit, pass from the mean.
    conv = build_network(NetworkConfig(board_size=n, blocks=1, filters=f, value_hidden=3))
    conv_policy = (f * 16 + 16) * points + 16
    assert bench.direct_flops_per_evaluation(conv) == 2 * (convs + value_heads + conv_policy)


def test_the_6x96_19x19_network_is_about_0_76_gflop(bench):
    network, _ = bench.build_network(19, 6, 96)
    assert 0.70e9 < bench.direct_flops_per_evaluation(network) < 0.80e9


def test_leela_zero_runs_on_the_weights_the_bench_writes(bench, tmp_path):
    """The peer actually loads the file and searches (a few visits, one thread)."""
    binary = bench.require_leela_zero()
    weights = tmp_path / "w.txt"
    bench.write_leela_zero_weights(weights, blocks=1, filters=8)
    playouts, rate, cpu = bench.run_leela_zero_benchmark(binary, weights, visits=20, threads=1)
    assert playouts >= 19 and rate > 0 and cpu > 0

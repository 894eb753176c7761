"""model.train: the network learns, and bad flags or lake states are refused early.

(Training through the CLI, kill and resume, and publishing are in
tests/model/test_train_resume.py; Mirrored against default in
tests/model/test_mirrored.py.)

Training runs on a synthetic 9x9 window (testdata.synthetic_windows), in the record
version production writes, whose targets are simple functions of the board,
with a tiny network so the whole file takes well under a minute.
"""
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from cloud.storage import open_storage
from format import schema
from model.tfdata import training_dataset
from format import layout
from format.window_manifest import parse_window_manifest, read_window_manifest, WINDOW_MANIFEST_VERSION
from testdata import synthetic_windows as synthetic
from model.config import ConfigError, TrainConfig
from model.config import NetworkConfig
from model.network import build_network
from model.sgd import Trainer, resolve_strategy, summarize
from model.windows import Window, window_steps


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("lake")
    storage = open_storage(str(root))
    synthetic.write_run_config(storage, board_size=9)
    manifest = synthetic.write_synthetic_window(storage, target_generation=1, board_size=9,
                                                positions=2000, shards=2, seed=1)
    return root, storage, manifest


def test_the_test_window_is_the_record_version_production_writes(lake):
    _, storage, _ = lake
    window = read_window_manifest(storage, 1, check_shards=True)
    assert window.record_version == schema.POSITION_RECORD_VERSION and window.game_table in window.files
    assert len(window.games) == window.positions == 2000     # each synthetic position is its own game


def mean_over(trainer, iterator, steps, chunk=10):
    sums = None
    for _ in range(steps // chunk):
        part = trainer.train_steps(iterator, chunk)
        sums = part if sums is None else {k: sums[k] + part[k] for k in part}
    return summarize(sums)


@pytest.mark.parametrize("value_head", ["tanh", "wdl"])
def test_tiny_run_lowers_every_heads_loss(lake, value_head):
    root, storage, manifest = lake
    network = NetworkConfig(blocks=2, filters=16, value_hidden=16, value_head=value_head, global_pool_every=2,
                            global_pool_channels=4)
    config = TrainConfig(root=str(root), network=network, batch_size=32, learning_rate=0.05, warmup_steps=10)
    trainer = Trainer(config, config.network_for(9), resolve_strategy(config))
    shards = [storage.url(layout.shard_path(1, name)) for name in manifest["shards"]]
    iterator = iter(training_dataset(shards, board_size=9, batch_size=32, seed=3))
    first = mean_over(trainer, iterator, 20)
    mean_over(trainer, iterator, 80)
    last = mean_over(trainer, iterator, 20)
    for head in ("policy_loss", "value_loss", "ownership_loss", "score_loss"):
        assert last[head] < 0.95 * first[head], (head, first[head], last[head])
    assert last["policy_accuracy"] > first["policy_accuracy"]
    assert trainer.global_step == 120


def test_weight_normalization_gives_each_head_its_nominal_strength(lake):
    # 32 rows of which 4 carry a policy target and 16 a value target: by the batch, the
    # policy term is scaled by 4/32 and the value term by 16/32; by the weights, each head's
    # term is its weighted mean loss times its weight, whatever share of rows carry it.
    root, _, _ = lake
    sums = {"policy_loss_sum": 8.0, "policy_weight_sum": 4.0, "value_loss_sum": 4.0, "value_weight_sum": 16.0,
            "ownership_loss_sum": 0.0, "ownership_weight_sum": 0.0, "score_loss_sum": 6.0,
            "score_weight_sum": 32.0}
    expected = {"batch": (1.0 * 8 + 2.0 * 4 + 0.5 * 6) / 32, "weight": 1.0 * 8 / 4 + 2.0 * 4 / 16 + 0.5 * 6 / 32}
    for normalization, want in expected.items():
        network = NetworkConfig(blocks=1, filters=8, value_hidden=8, global_pool_every=1, global_pool_channels=4)
        config = TrainConfig(root=str(root), network=network, batch_size=32, loss_normalization=normalization,
                             value_loss_weight=2.0, ownership_loss_weight=3.0, score_loss_weight=0.5)
        trainer = Trainer(config, config.network_for(9), resolve_strategy(config))
        heads = {k: tf.constant(v) for k, v in sums.items()}
        weighted = {h: getattr(config, f"{h}_loss_weight") * heads[f"{h}_loss_sum"]
                    for h in ("policy", "value", "ownership", "score")}
        got = trainer.strategy.run(lambda: trainer._normalized_data_loss(weighted, heads))
        assert float(got) == pytest.approx(want, rel=1e-6), normalization
    with pytest.raises(ConfigError, match="--loss-normalization"):
        TrainConfig(root="x", loss_normalization="rows")


@pytest.mark.parametrize("n", [9, 19])
def test_network_output_shapes(n):
    model = build_network(NetworkConfig(board_size=n, blocks=1, filters=8, global_pool_every=1,
                                        global_pool_channels=4, value_head="wdl"))
    out = model(np.zeros((2, n, n, schema.BASIC_INPUT_PLANES), np.float32), training=False)
    assert tuple(out["policy_logits"].shape) == (2, n * n + 1)
    assert tuple(out["ownership"].shape) == (2, n * n)
    assert tuple(out["value"].shape) == (2,) and tuple(out["score"].shape) == (2,)
    assert tuple(out["value_logits"].shape) == (2, 3)


def test_window_steps_follow_positions_and_epochs():
    window = Window(target_generation=1, board_size=9, shards=("a",), positions=1000,
                    path=layout.window_manifest(1))
    assert window_steps(window, global_batch=256, epochs=1.0) == 4
    assert window_steps(window, global_batch=256, epochs=2.5) == 10


def test_samples_per_row_steps_train_each_new_row_about_that_often_within_the_bounds():
    from model.windows import new_rows, samples_per_row_steps

    # 10,000 new rows x 4 samples per row / 256 = 156.25 -> 157 steps.
    assert samples_per_row_steps(10_000, 4.0, 256) == 157
    assert samples_per_row_steps(10_000, 4.0, 256, min_steps=200) == 200      # never fewer than the minimum
    assert samples_per_row_steps(10_000, 4.0, 256, max_steps=100) == 100      # nor more than the maximum
    assert samples_per_row_steps(0, 4.0, 256, min_steps=5, max_steps=100) == 5
    assert samples_per_row_steps(10**9, 8.0, 512) == math.ceil(10**9 * 8 / 512)   # 0 = no maximum
    # New rows: the lake's chunk bytes between the two windows' plans, at this window's rows per byte.
    plan = {"lake_bytes": 150_000, "positions_per_byte": 0.05}
    window = parse_window_manifest(json.dumps({
        "version": WINDOW_MANIFEST_VERSION, "target_generation": 3, "board_size": 9,
        "shards": ["a.tfrecord.gz"], "positions": 1000, "window": plan, "record_version": 4,
        "game_table": "a-games.table.gz"}).encode(), layout.window_manifest(3))
    assert new_rows(window, 100_000) == 2500
    assert new_rows(window, 0) == 7500                                        # before any model: the whole lake
    assert new_rows(window, 200_000) == 0                                     # never negative
    assert new_rows(window, None) is None                                     # a model that does not say
    older = Window(target_generation=1, board_size=9, shards=("a",), positions=1000, path=layout.window_manifest(1))
    assert new_rows(older, 0) is None                                         # a manifest without the plan's bytes


def test_config_validation_names_each_bad_flag():
    with pytest.raises(ConfigError) as info:
        TrainConfig(root="x", batch_size=0, momentum=1.5, lr_schedule="step")
    text = str(info.value)
    assert "--batch-size" in text and "--momentum" in text and "--lr-boundaries" in text


def _run_main_without_tf(tmp_path, argv):
    """Run main(argv) in a fresh interpreter; (status, stderr, TF imported?)."""
    code = ("import sys, json\nfrom model.train import main\n"
            f"rc = main({argv!r})\n"
            "print(json.dumps([rc, 'tensorflow' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=str(pathlib.Path(__file__).resolve().parents[2]))
    rc, imported_tf = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, done.stderr, imported_tf


def test_bad_lake_state_fails_fast_before_tensorflow(tmp_path):
    root = tmp_path / "lake"
    storage = open_storage(str(root))
    rc, err, imported_tf = _run_main_without_tf(tmp_path, ["--root", str(root)])
    assert (rc, imported_tf) == (2, False) and "run.json does not exist" in err
    synthetic.write_run_config(storage, board_size=9)
    rc, err, imported_tf = _run_main_without_tf(tmp_path, ["--root", str(root), "--board-size", "19"])
    assert (rc, imported_tf) == (2, False)
    assert "--board-size 19 disagrees" in err and "board_size 9" in err
    # Shards without a manifest: the window is incomplete and must be ignored.
    storage.write_new(layout.shard_path(1, "shard-00000-of-00001.tfrecord.gz"), b"")
    rc, err, imported_tf = _run_main_without_tf(tmp_path, ["--root", str(root)])
    assert (rc, imported_tf) == (2, False) and "no window to train" in err


def test_bad_flags_are_usage_errors(tmp_path):
    for argv, needle in ((["--root", "x", "--strategy", "bogus"], "--strategy"),
                         (["--root", "x", "--batch-size", "0"], "--batch-size: must be >= 1"),
                         (["--blocks", "2"], "--root")):
        done = subprocess.run([sys.executable, "-m", "model.train", *argv], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2 and needle in done.stderr, (argv, done.stderr)


@pytest.mark.parametrize("accelerator", ["tpu", "gpu"])
def test_an_accelerator_asked_for_and_absent_is_one_error(tmp_path, accelerator):
    """This machine has neither: the trainer says so in the one wording every role uses
    (inference.devices.AcceleratorMissing) and exits 2, instead of training on the CPU."""
    if accelerator == "gpu" and tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    root = tmp_path / "lake"
    storage = open_storage(str(root))
    synthetic.write_run_config(storage, board_size=9)
    synthetic.write_synthetic_window(storage, target_generation=1, board_size=9, positions=64, shards=1)
    done = subprocess.run([sys.executable, "-m", "model.train", "--root", str(root), "--strategy", accelerator],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"--strategy {accelerator}: TensorFlow sees no {accelerator.upper()} on this machine" in done.stderr
    assert "scripts/setup.sh --accelerator" in done.stderr


def test_learning_rate_warms_up_then_follows_its_schedule():
    from model.sgd import LearningRateSchedule

    def rates(**flags):
        schedule = LearningRateSchedule(TrainConfig(root="x", learning_rate=0.1, warmup_steps=10, **flags))
        return [float(schedule(step)) for step in (0, 4, 9, 50, 100, 1000)]

    constant = rates()
    assert constant[:3] == pytest.approx([0.01, 0.05, 0.1]) and constant[3:] == pytest.approx([0.1] * 3)
    cosine = rates(lr_schedule="cosine", lr_decay_steps=100, lr_final_fraction=0.1)
    assert cosine[3] == pytest.approx(0.1 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 0.5))))
    assert cosine[4] == pytest.approx(0.01) and cosine[5] == pytest.approx(0.01)
    step = rates(lr_schedule="step", lr_boundaries="50,1000")
    assert step[2:] == pytest.approx([0.1, 0.01, 0.01, 0.001])
    # The anneal holds the peak, then falls along a half cosine: halfway at step 75, the floor at 100.
    anneal = rates(lr_schedule="anneal", lr_anneal_from=50, lr_anneal_to=100, lr_final_fraction=0.1)
    assert anneal[2:4] == pytest.approx([0.1, 0.1]) and anneal[4:] == pytest.approx([0.01, 0.01])
    halfway = LearningRateSchedule(TrainConfig(root="x", learning_rate=0.1, warmup_steps=10, lr_schedule="anneal",
                                               lr_anneal_from=50, lr_anneal_to=100, lr_final_fraction=0.1))
    assert float(halfway(75)) == pytest.approx(0.1 * (0.1 + 0.9 * 0.5))


def test_a_clock_anneal_follows_the_wall_clock_not_the_step():
    import tensorflow as tf

    from model.sgd import LearningRateSchedule, anneal_progress

    config = TrainConfig(root="x", learning_rate=0.1, warmup_steps=0, lr_schedule="anneal", lr_anneal_by="clock",
                         lr_anneal_from=1000.0, lr_anneal_to=2000.0, lr_final_fraction=0.1)
    assert [anneal_progress(config, t) for t in (0.0, 1000.0, 1500.0, 2000.0, 9e9)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    progress = tf.Variable(0.0)
    schedule = LearningRateSchedule(config, progress)
    assert float(schedule(10**6)) == pytest.approx(0.1)           # any step: the clock has not reached the anneal
    progress.assign(1.0)
    assert float(schedule(0)) == pytest.approx(0.01)
    with pytest.raises(ConfigError, match="--lr-anneal-to: must be above --lr-anneal-from [(]5[)]"):
        TrainConfig(root="x", lr_schedule="anneal", lr_anneal_from=5, lr_anneal_to=5)

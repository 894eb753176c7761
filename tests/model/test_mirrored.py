"""MirroredStrategy on 2 logical CPUs trains like the default strategy.

Both trainers start from the same seeded weights and see the same global
batches (several steps per tf.function call); with synchronized batch norm
and gradients summed across replicas, their per-call losses and final
weights must agree up to float reassociation (measured: ~5e-7 relative;
without synchronized batch norm they differ by ~2e-2).  The learning rate is
kept small: at 0.05 momentum SGD on 32-example batches amplifies that
reassociation noise to ~1e-3 within 12 steps.  It runs in a subprocess
because splitting the CPU into logical devices must happen before
TensorFlow initialises and cannot be undone in the test process.
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    from cloud.storage import open_storage
    from model.tfdata import training_dataset
    from testdata import synthetic_windows as synthetic
    from model.config import NetworkConfig, TrainConfig
    from model.sgd import Trainer, resolve_strategy, summarize

    root, loss_normalization = sys.argv[1], sys.argv[2]
    storage = open_storage(root)
    manifest = synthetic.write_synthetic_window(storage, target_generation=1, board_size=9,
                                                positions=512, shards=2, seed=9)
    shards = [storage.url("windows/000001/" + name) for name in manifest["shards"]]
    network = NetworkConfig(blocks=2, filters=16, value_hidden=16, global_pool_every=2, global_pool_channels=4)
    # float32 on every CPU: the strategies must agree to 1e-4, which bfloat16 (auto on AMX CPUs) does not hold.
    common = dict(root=root, network=network, learning_rate=0.01, warmup_steps=1, seed=5,
                  loss_normalization=loss_normalization, precision="float32")
    mirrored_config = TrainConfig(strategy="mirrored", logical_cpus=2, batch_size=16, **common)
    mirrored = resolve_strategy(mirrored_config)       # splits the CPU first
    default_config = TrainConfig(strategy="default", batch_size=32, **common)
    default = resolve_strategy(default_config)
    results = {"replicas": [mirrored.replicas, default.replicas]}
    for name, config, resolved in (("mirrored", mirrored_config, mirrored),
                                   ("default", default_config, default)):
        trainer = Trainer(config, config.network_for(9), resolved)
        dataset = training_dataset(shards, board_size=9, batch_size=32, seed=2, shuffle_buffer=64)
        iterator = iter(resolved.strategy.experimental_distribute_dataset(dataset))
        losses = []
        for _ in range(3):
            means = summarize(trainer.train_steps(iterator, 4))
            losses.append([means[k] for k in ("policy_loss", "value_loss", "ownership_loss", "score_loss")])
        results[name] = {"losses": losses, "weights": [float(np.sum(np.abs(w))) for w in trainer.published_weights()],
                         "step": trainer.global_step}
    print(json.dumps(results))
""")


@pytest.mark.parametrize("loss_normalization", ["batch", "weight"])
def test_mirrored_on_two_logical_cpus_matches_default(tmp_path, loss_normalization):
    # "weight" divides each replica's head sums by the weight sum of the whole global
    # batch (an all-reduce inside the step): both replicas must divide by the same number.
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "lake"), loss_normalization], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["replicas"] == [2, 1]
    mirrored, default = results["mirrored"], results["default"]
    assert mirrored["step"] == default["step"] == 12
    for call, (m, d) in enumerate(zip(mirrored["losses"], default["losses"])):
        for head, a, b in zip(("policy", "value", "ownership", "score"), m, d):
            assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), (call, head, a, b)
    # Training moved the weights the same way (sums of |w| per tensor).  Dividing a head by its
    # weight sum raises the step of a head whose targets are sparse, which amplifies the
    # reassociation noise too (measured: 4e-4 on one tensor after 12 steps); a replica dividing by
    # its own sum instead of the global one is off by ~1e-1 in the first call's policy loss.
    tolerance = 1e-4 if loss_normalization == "batch" else 2e-3
    for a, b in zip(mirrored["weights"], default["weights"]):
        assert abs(a - b) <= tolerance * max(1.0, abs(b)), (a, b)
    assert mirrored["losses"][0] != mirrored["losses"][-1]

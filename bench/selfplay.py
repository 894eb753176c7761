"""Self-play throughput: the Cython search alone, then search + network end to end.

Figures (all measured in this run; other processes share the machine, so
treat them as noisy):

* ``search_sims_per_s_9`` / ``_19``: simulations per second of the batched
  Cython search (`selfplay.driver.GameBatch`) with a constant evaluator
  (uniform policy, value 0) on one core: 64 games, 200 simulations a move,
  moves played and games restarted as in self-play, so the Python per-move
  work is included.  Minigo's Python MCTS does 8.8k readouts/s here.
  The search runs on one thread; the figure is per second of that thread's
  CPU time, because other processes sharing the 2 cores stretch wall time
  (the wall-clock figure is printed and reported too).
* ``positions_per_s``, ``network_share``, ``batch_fill``: the real worker
  loop (`selfplay.worker.SelfPlayWorker`, two halves overlapping search and
  inference, chunks written to a temporary local root) with the default
  small network, freshly initialised, on the CPU.  network_share is the time
  the inference thread spends inside the network call over the wall time;
  batch_fill is rows filled over rows offered.
* ``visits_per_s_6b96c_9``: the same loop with a 6-block, 96-channel network
  on 9x9, both cores (KataGo's Eigen backend does 781 visits/s on two
  threads here).

The network is `model.network`'s if that module is present, else an
equivalent residual network built here (same input and output heads);
the JSON line says which.

    .venv/bin/python bench/selfplay.py [--quick]

Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selfplay.driver import GameBatch  # noqa: E402

SEARCH_GAMES = 64
SEARCH_BUDGET = 200


def search_only(board_size: int, seconds: float, seed: int = 1) -> float:
    """Simulations per second of the Cython search with a constant evaluator."""
    batch = GameBatch(board_size, SEARCH_GAMES, num_groups=1, leaves_per_game=8, seed=seed,
                      c_puct_init=1.25, fpu_reduction=0.25, dirichlet_alpha_total=10.83, dirichlet_epsilon=0.25)
    buffer = np.zeros((batch.batch_rows, board_size, board_size, 17), np.float32)
    logits = np.zeros((batch.batch_rows, batch.num_actions), np.float32)
    values = np.zeros(batch.batch_rows, np.float32)
    for g in range(SEARCH_GAMES):
        batch.start_search(g, SEARCH_BUDGET)
    start = time.perf_counter()
    cpu_start = time.process_time()
    moves = 0
    while time.perf_counter() - start < seconds:
        batch.gather(0, buffer)
        batch.apply(0, logits, values)
        for g in batch.done_games(0):
            batch.play(g, batch.choose_move(g, 1.0 if batch.board(g).move_number < 8 else 0.0))
            moves += 1
            if batch.board(g).is_over:
                batch.new_game(g)
            batch.start_search(g, SEARCH_BUDGET)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    stats = batch.stats()
    sims = stats["leaves_evaluated"] + stats["terminal_visits"]
    print(f"search only {board_size}x{board_size}: {sims / cpu:,.0f} sims per CPU second "
          f"({sims / elapsed:,.0f} per wall second; {moves / elapsed:,.0f} moves/s, "
          f"{stats['collisions']} collisions)", flush=True)
    return sims / cpu, sims / elapsed


def build_network(board_size: int, blocks: int | None, channels: int | None):
    """(keras model, source): model.network's network, else a local equivalent."""
    import tensorflow as tf

    try:
        from model.network import NetworkConfig, build_network as build_project_network
    except ImportError:  # the trainer's module is absent: build an equivalent here
        build_project_network = None
    if build_project_network is not None:
        config = NetworkConfig(board_size=board_size)
        if blocks is not None:
            config = NetworkConfig(board_size=board_size, blocks=blocks, filters=channels)
        return (build_project_network(config),
                f"model.network {config.blocks}x{config.filters}")
    blocks = 4 if blocks is None else blocks
    channels = 48 if channels is None else channels
    layers = tf.keras.layers
    inputs = tf.keras.Input((board_size, board_size, 17))

    def conv_bn(x, width, kernel):
        x = layers.Conv2D(width, kernel, padding="same", use_bias=False)(x)
        return layers.BatchNormalization()(x)

    x = layers.ReLU()(conv_bn(inputs, channels, 3))
    for _ in range(blocks):
        y = layers.ReLU()(conv_bn(x, channels, 3))
        x = layers.ReLU()(x + conv_bn(y, channels, 3))
    policy = layers.Dense(board_size * board_size + 1)(layers.Flatten()(layers.ReLU()(conv_bn(x, 2, 1))))
    value = layers.Flatten()(layers.ReLU()(conv_bn(x, 1, 1)))
    value = layers.Dense(1, activation="tanh")(layers.Dense(64, activation="relu")(value))
    return tf.keras.Model(inputs, [policy, value]), f"bench-local resnet {blocks}x{channels}"


class CompiledModel:
    """A keras network as a `LoadedModel`-like callable: one tf.function,
    batch dimension left open so varying batch sizes never retrace."""

    def __init__(self, network, board_size: int, generation: int = 1):
        import tensorflow as tf

        self.generation = generation

        @tf.function(input_signature=[tf.TensorSpec([None, board_size, board_size, 17], tf.float32)])
        def infer(planes):
            outputs = network(planes, training=False)
            if isinstance(outputs, dict):
                return {"policy_logits": outputs["policy_logits"], "value": tf.reshape(outputs["value"], [-1])}
            return {"policy_logits": outputs[0], "value": tf.reshape(outputs[1], [-1])}

        self._infer = infer

    def __call__(self, planes):
        return self._infer(planes)


# Every search setting the figures depend on, pinned here at the values they
# were first measured with, so that changing a default of the worker (the
# learning work tunes them) moves no bench figure.  Compare like with like.
PINNED_WORKER_SETTINGS = dict(
    komi=7.5, max_moves=0, visits=64, fast_visits=16, full_search_fraction=0.25, gumbel=False,
    gumbel_considered=16, leaves_per_game=8, c_puct=1.25, fpu_reduction=0.25, dirichlet_alpha_total=10.83,
    dirichlet_epsilon=0.25, temperature_moves=-1, resign_threshold=-0.9, resign_consecutive=3,
    resign_disabled_fraction=0.1, accelerated_visits=2, chunk_games=16, chunk_seconds=600.0,
)


def end_to_end(board_size: int, seconds: float, blocks: int | None, channels: int | None,
               games: int, label: str) -> dict:
    from cloud.storage import open_storage
    from format.run_config import RunConfig, ensure_run_config
    from selfplay.config import WorkerConfig
    from selfplay.evaluator import ModelEvaluator, use_every_cpu_core
    from selfplay.worker import SelfPlayWorker

    use_every_cpu_core()
    network, source = build_network(board_size, blocks, channels)
    evaluator = ModelEvaluator(CompiledModel(network, board_size), devices=[])
    evaluator(np.zeros((8, board_size, board_size, 17), np.float32))   # trace once
    with tempfile.TemporaryDirectory() as root:
        config = WorkerConfig(root=root, board_size=board_size, games=games, max_seconds=seconds,
                              progress_seconds=max(seconds / 3, 5), worker_id="bench", seed=7,
                              **PINNED_WORKER_SETTINGS)
        storage = open_storage(root)
        ensure_run_config(storage, RunConfig(board_size=board_size, komi=config.komi))
        worker = SelfPlayWorker(config, storage, evaluator)
        start = time.perf_counter()
        counters = worker.run()
        elapsed = time.perf_counter() - start
    stats = worker.batch.stats()
    result = {
        "network": source,
        "positions_per_s": counters.positions / elapsed,
        "visits_per_s": (stats["leaves_evaluated"] + stats["terminal_visits"]) / elapsed,
        "evals_per_s": counters.evaluations / elapsed,
        "network_share": counters.network_seconds / elapsed,
        "batch_fill": counters.evaluations / max(counters.batch_rows, 1),
        "games": counters.games,
    }
    print(f"{label} ({source}): {result['positions_per_s']:.1f} positions/s, "
          f"{result['visits_per_s']:.0f} visits/s, network {result['network_share']:.1%} of wall time, "
          f"batch fill {result['batch_fill']:.1%}", flush=True)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test, noisier figures)")
    args = parser.parse_args(argv)
    search_seconds = 4.0 if args.quick else 15.0
    e2e_seconds = 15.0 if args.quick else 60.0

    sims_9, wall_9 = search_only(9, search_seconds)
    sims_19, wall_19 = search_only(19, search_seconds)
    small = end_to_end(9, e2e_seconds, None, None, games=128, label="default net 9x9")
    big = end_to_end(9, e2e_seconds, 6, 96, games=64, label="6b96c net 9x9")
    print(json.dumps({
        "bench": "selfplay",
        "search_sims_per_s_9": round(sims_9),
        "search_sims_per_s_19": round(sims_19),
        "search_sims_per_wall_s_9": round(wall_9),
        "search_sims_per_wall_s_19": round(wall_19),
        "positions_per_s": round(small["positions_per_s"], 2),
        "network_share": round(small["network_share"], 4),
        "batch_fill": round(small["batch_fill"], 4),
        "visits_per_s_6b96c_9": round(big["visits_per_s"], 1),
        "network": small["network"],
        "network_6b96c": big["network"],
        "network_share_6b96c": round(big["network_share"], 4),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a search evaluates with: the uniform evaluator, random playouts, or a published model.

A search (the worker's `engine.driver.GameBatch`, the arena's `MctsPlayer`)
calls an evaluator on batches of input planes.  This module builds it; every
role loads a published model through `load_published_evaluator`:

    storage, generation --load_published_evaluator-->
        --inference.model_files.load_model--> LoadedModel (files verified, shapes checked)
        --inference.openvino_evaluator.make_evaluator--> evaluator (int8 OpenVINO copy or TensorFlow)
        --inference.model_probe.probe_model--> refused if its outputs are misshapen or not finite
        --> LoadedEvaluator(evaluate, name, generation, board_size)

`load_evaluator` (the arena's players) resolves an `EvaluatorSource` (a
model root and generation, LATEST by default, or the uniform evaluator) and
adds the run's komi; the self-play worker's model watcher
(`selfplay.worker.ModelWatcher`) resolves LATEST itself and passes its device
placement and ``--inference`` backend.  `PlayoutEvaluator` is generation 0's
network-free evaluator.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from engine.playouts import playout_values
from format import layout, schema

if TYPE_CHECKING:
    from inference.model_files import ModelCache  # imported when a model loads, not with this module


# --------------------------------------------------------------------------
# A network-free evaluator with a value signal
# --------------------------------------------------------------------------


class PlayoutEvaluator:
    """Uniform priors; value = mean result of random playouts from the leaf.

    The classic pure-MCTS baseline: unlike the uniform evaluator (value 0,
    whose search only sees game-over leaves, so it plays about as well as
    random moves), it beats `RandomPlayer` with a few dozen visits, so it
    is a yardstick that a young network must pass.

    The work is `engine.playouts.playout_values`, one Cython call per batch
    outside the GIL: each leaf position is rebuilt from its input planes
    (the stones at t and the colour plane) on a fresh board, so superko
    history before the leaf is not seen by the playouts.  A playout's
    result is +1/-1/0 for the side to move at the leaf.  It is also the
    evaluator of generation 0 (`selfplay.worker.generation0_evaluator`).
    """

    generation = 0
    input_planes = schema.BASIC_INPUT_PLANES  # playout_values reads channels 0, 8 and 16

    def __init__(self, board_size: int, komi: float, playouts: int = 1, seed: int = 0):
        if playouts < 1:
            raise ValueError(f"playouts must be >= 1, got {playouts}")
        self.board_size = board_size
        self.komi = float(komi)
        self.playouts = playouts
        self.name = f"playouts{playouts}"
        self._rng = np.random.default_rng(seed)

    def __call__(self, planes: np.ndarray):
        rows, size = planes.shape[0], self.board_size
        if planes.shape[1:] != (size, size, self.input_planes):
            raise ValueError(f"planes must be [B, {size}, {size}, {self.input_planes}], got {planes.shape}")
        values = playout_values(
            np.ascontiguousarray(planes, np.float32), self.komi, self.playouts, int(self._rng.integers(0, 2**63))
        )
        return np.zeros((rows, size * size + 1), np.float32), values


# --------------------------------------------------------------------------
# Evaluators: uniform, or a published model
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvaluatorSource:
    """Where an MCTS player's evaluations come from.

    model_root: storage root (local folder or gs://...) of a run with
        published models; None = the uniform evaluator (`inference.evaluator`).
    generation: the published generation to load; None = the latest.
    """

    model_root: str | None = None
    generation: int | None = None

    def __post_init__(self):
        if self.generation is not None and (self.model_root is None or self.generation < 0):
            raise ValueError(f"generation {self.generation!r} needs a model root and must be >= 0")

    @classmethod
    def from_model_dir(cls, path: str) -> "EvaluatorSource":
        """A published model folder ``ROOT/models/<generation>`` -> its root and generation."""
        trimmed = path.rstrip("/")
        parent, _, name = trimmed.rpartition("/")
        root, _, models = parent.rpartition("/")
        if models != layout.MODELS_DIR or not name.isdigit():
            raise ValueError(f"--model {path!r}: want a published model folder ROOT/{layout.MODELS_DIR}/<generation>")
        return cls(model_root=root or ".", generation=int(name))


@dataclasses.dataclass
class LoadedEvaluator:
    """An evaluator callable plus what it can play.

    board_size/komi: the run's settings (run.json) for a model; None for the
    uniform evaluator, which plays any size."""

    evaluate: object
    name: str
    generation: int
    board_size: int | None = None
    komi: float | None = None

    def for_board_size(self, board_size: int):
        """The callable for `board_size` (ValueError if the model can't play it)."""
        if self.board_size is None:
            from inference.evaluator import UniformEvaluator

            return UniformEvaluator(board_size)
        if board_size != self.board_size:
            raise ValueError(
                f"{self.name} plays {self.board_size}x{self.board_size} only, not {board_size}x{board_size}"
            )
        return self.evaluate


def load_published_evaluator(
    storage, generation: int, *, cache_dir=None, placement=None, inference: str = "auto", threads: int = 0, log=None
) -> LoadedEvaluator:
    """Published ``generation`` of the lake at ``storage`` as a probed evaluator (komi unset).

    ``cache_dir``: an `inference.model_files.ModelCache` or folder (None: a
    fresh one).  ``placement``: an `inference.devices.Placement`, where the
    model's variables are loaded and where it runs (None: TensorFlow's
    choice).  ``inference``, ``threads`` and ``log`` are
    `inference.openvino_evaluator.make_evaluator`'s.  Raises `format.registry`'s
    RegistryError for a generation that is not published or is corrupt
    (including a SavedModel whose shapes are not its manifest's board size),
    and `inference.model_probe.ModelMisfit` (a ValueError) for one whose
    outputs on real positions are misshapen or not finite (a diverged network).
    """
    from inference import model_files
    from inference.model_probe import probe_model
    from inference.openvino_evaluator import make_evaluator

    with placement.scope() if placement is not None else contextlib.nullcontext():
        model = model_files.load_model(storage, generation, cache_dir=cache_dir)
    evaluator = make_evaluator(model, placement, inference, threads=threads, log=log)
    probe_model(evaluator, int(model.board_size), generation)  # a diverged model is refused, not played
    return LoadedEvaluator(evaluator, f"model-g{generation}", generation, board_size=int(model.board_size))


def load_evaluator(source: EvaluatorSource, cache_dir: ModelCache | str | None = None, retry=None) -> LoadedEvaluator:
    """Load `source` once: the uniform evaluator, or a model from the registry.

    A model's board size is the one in its manifest; its komi is the run's
    (run.json), or None when the root has no run.json.  Raises LookupError
    when the root has no published model yet, and what
    `load_published_evaluator` raises.  ``retry`` is the storage RetryPolicy
    for a gs:// root (None: the default); an unreachable bucket raises
    `cloud.base.StorageError` naming the object."""
    from inference.evaluator import UniformEvaluator

    if source.model_root is None:
        return LoadedEvaluator(UniformEvaluator(9), "uniform", 0)
    from cloud.storage import open_storage
    from format import registry
    from format.run_config import read_run_config

    storage = open_storage(source.model_root, retry=retry)
    generation = source.generation
    if generation is None:
        generation = registry.latest_generation(storage)
        if generation is None:
            raise LookupError(
                f"{storage.url(layout.LATEST)} is missing: {source.model_root} has no published model yet"
            )
    loaded = load_published_evaluator(storage, generation, cache_dir=cache_dir)
    run = read_run_config(storage)
    loaded.komi = None if run is None else run.komi
    return loaded

"""An evaluation cache: a network's outputs for input planes it has seen, reused.

Terms:

* *row*: one position's network input, float32 [N, N, C] (format/planes.py);
  it holds the last 8 positions and the side to move, so two rows are the
  same input exactly when the position, its recent history and the side to
  move agree.
* *key*: a 128-bit BLAKE2b digest of a row's bytes.  Keying on the input
  itself (not on the engine's Zobrist hash of the stones alone) means a hit
  can never return another position's outputs: the network would compute the
  very same numbers.  A false hit needs a 128-bit collision.
* *hit*: a row answered from the cache, or a row that repeats an earlier row
  of the same batch (computed once, copied).

Data flow: the worker's inference thread calls ``CachedEvaluator(planes)``;
the rows not in the cache (deduplicated) go to the wrapped evaluator in one
batch, their outputs are stored, and every row's outputs come back in the
rows' order.  The least recently used entries are dropped beyond
``capacity``.  One cache belongs to one evaluator, so one model generation:
the worker wraps each newly loaded model in a fresh cache.

Why: many games run in one worker and all start from the empty board, so
the openings repeat across games; KataGo and Leela Zero keep such a cache
for the same reason.  The bench (bench/selfplay.py) reports the share of
rows it answers (``cache_hit_share``).

It is called from one thread at a time (the worker's inference thread).
"""

from __future__ import annotations

import collections
import hashlib
import time

import numpy as np

from format.planes import input_planes_of
from inference.evaluator import UNIFORM_GENERATION

DEFAULT_CAPACITY = 32768
"""Entries kept.  An entry holds N*N+1 logits and a value: 1.5 KB on 19x19,
so about 48 MB at this capacity (about 11 MB on 9x9)."""


def row_keys(planes: np.ndarray) -> list[bytes]:
    """The cache key of each row of ``planes`` [B, ...] (see the module docstring)."""
    rows = np.ascontiguousarray(planes, np.float32).reshape(len(planes), -1)
    return [hashlib.blake2b(row.data, digest_size=16).digest() for row in rows]


class CachedEvaluator:
    """``evaluator`` (inference.evaluator.Evaluator) behind an LRU cache of its outputs.

    Satisfies the Evaluator protocol itself.  Counters: ``rows`` asked for,
    ``hits`` answered without the network, ``cpu_seconds`` this wrapper's own
    CPU time (hashing, look-ups, copies; the wrapped call excluded), so that a
    benchmark can count it as search-side work.
    """

    def __init__(self, evaluator, capacity: int = DEFAULT_CAPACITY):
        if capacity < 1:
            raise ValueError(f"evaluation cache capacity must be >= 1, got {capacity}")
        self.evaluator = evaluator
        self.generation = evaluator.generation
        self.input_planes = input_planes_of(evaluator)
        self.capacity = capacity
        self._entries: collections.OrderedDict[bytes, tuple[np.ndarray, np.float32]] = collections.OrderedDict()
        self.rows = 0
        self.hits = 0
        self.cpu_seconds = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        started = time.thread_time()
        keys = row_keys(planes)
        found = [self._entries.get(key) for key in keys]
        # Rows to compute: first occurrence of each key the cache lacks.
        first_row: dict[bytes, int] = {}
        for row, (key, entry) in enumerate(zip(keys, found)):
            if entry is None and key not in first_row:
                first_row[key] = row
        self.cpu_seconds += time.thread_time() - started
        computed = {}
        if first_row:
            rows = list(first_row.values())
            logits, values = self.evaluator(planes[rows])
            computed = {key: (logits[i], values[i]) for i, key in enumerate(first_row)}
        started = time.thread_time()
        out_logits, out_values = self._assemble(keys, found, computed)
        self.rows += len(keys)
        self.hits += len(keys) - len(computed)
        self.cpu_seconds += time.thread_time() - started
        return out_logits, out_values

    def _assemble(self, keys, found, computed):
        """Every row's outputs in row order; store the computed ones, refresh the reused ones."""
        entries = self._entries
        for key, entry in computed.items():
            entries[key] = (np.array(entry[0], np.float32), np.float32(entry[1]))
        for key, entry in zip(keys, found):
            if entry is not None:
                entries.move_to_end(key)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        answers = [entry if entry is not None else computed[key] for key, entry in zip(keys, found)]
        num_actions = len(answers[0][0]) if answers else 0
        out_logits = np.empty((len(keys), num_actions), np.float32)
        out_values = np.empty(len(keys), np.float32)
        for row, (logits, value) in enumerate(answers):
            out_logits[row] = logits
            out_values[row] = value
        return out_logits, out_values

    @property
    def hit_share(self) -> float:
        """Hits over rows asked for (0 before any call)."""
        return self.hits / self.rows if self.rows else 0.0


def with_evaluation_cache(evaluator, capacity: int = DEFAULT_CAPACITY):
    """``evaluator`` wrapped in a fresh `CachedEvaluator`, or as it is when caching cannot pay.

    The uniform evaluator (generation 0) costs nothing per row, so hashing
    rows for it would only slow the search; ``capacity`` 0 turns the cache off.
    """
    if capacity == 0 or evaluator.generation == UNIFORM_GENERATION or isinstance(evaluator, CachedEvaluator):
        return evaluator
    return CachedEvaluator(evaluator, capacity)

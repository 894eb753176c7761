"""How a finished search becomes a move, and when a side resigns: one rule for every player.

The self-play worker, the GTP engine and the match players all search with
`engine.driver.GameBatch`; what they do with a finished search is decided
here, each with its own parameters:

* **Move choice.**  The first ``sampled_moves`` moves of a game (counted by
  move number, from 0) are sampled in proportion to root visit counts
  (temperature 1), so that games differ; later moves take the most visited
  child (temperature 0; exact ties are broken at random by the search).
  Self-play uses N*N // 12 sampled moves (AlphaGo Zero's 30 on 19x19);
  matches use a few, GTP none.
* **Resignation.**  A side resigns once the root value of its own searches
  (from its point of view, in [-1, 1]) has stayed below ``resign_threshold``
  for ``resign_consecutive`` of its consecutive moves; one good value resets
  the count.  ``resign_threshold=None`` never resigns.  Requiring several
  consecutive low values keeps one noisy search from throwing a game away.
"""

from __future__ import annotations

import dataclasses

from format import schema


@dataclasses.dataclass(frozen=True)
class MovePolicy:
    """Parameters of the rule above (see the module docstring)."""

    sampled_moves: int = 0
    resign_threshold: float | None = None
    resign_consecutive: int = 1

    def __post_init__(self):
        if self.sampled_moves < 0:
            raise ValueError(f"sampled_moves must be >= 0, got {self.sampled_moves}")
        if self.resign_threshold is not None and not -1.0 <= self.resign_threshold <= 1.0:
            raise ValueError(f"resign_threshold must be in [-1, 1], got {self.resign_threshold}")
        if self.resign_consecutive < 1:
            raise ValueError(f"resign_consecutive must be >= 1, got {self.resign_consecutive}")

    def temperature(self, move_number: int) -> float:
        """1.0 (sample by visits) for the opening moves, then 0.0 (the most visited)."""
        return 1.0 if move_number < self.sampled_moves else 0.0


class ResignationCounter:
    """Per game: how many consecutive own moves each colour has searched below the threshold."""

    def __init__(self, policy: MovePolicy):
        self.policy = policy
        self.low_value_moves = {schema.BLACK: 0, schema.WHITE: 0}

    def observe(self, to_play: int, value: float) -> bool:
        """Record the root value of ``to_play``'s search; True when that side should resign now."""
        threshold = self.policy.resign_threshold
        if threshold is None or value >= threshold:
            self.low_value_moves[to_play] = 0
            return False
        self.low_value_moves[to_play] += 1
        return self.low_value_moves[to_play] >= self.policy.resign_consecutive

    def reset(self) -> None:
        self.low_value_moves = {schema.BLACK: 0, schema.WHITE: 0}

"""Is a loaded model one a search can play with?  The probe every player of a model runs first.

A published network can pass its checksums and load, and still be unusable:
one whose weights diverged to NaN answers every position with NaN (the
search then backs up NaN and plays moves 0, 1, 2, ...), and one built for
another board fails deep inside the first batch.  `probe_model` evaluates a
fixed set of real positions (`probe_positions`) and refuses, in one line
(`ModelMisfit`), outputs of the wrong shape or that are not finite
(`check_outputs`).  `inference.loading.load_published_evaluator` probes every
model it loads, for the self-play worker (before it switches to it; the worker
also checks every batch in play) and for a match, the GTP engine or the rating ladder.
"""

from __future__ import annotations

import numpy as np

from format import schema
from format.planes import input_planes_of


class ModelMisfit(ValueError):
    """A published model that this worker must not play with; the message names it and why."""


MESSAGE_CHARACTERS = 300
"""How much of an error's own text a rejection line quotes (TensorFlow's can run to pages)."""


def one_line(text: str, limit: int = MESSAGE_CHARACTERS) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def probe_positions(board_size: int, channels: int = schema.BASIC_INPUT_PLANES) -> np.ndarray:
    """float32 [6, N, N, channels]: the planes of real positions, each colour to move in each stage.

    The empty board (Black to move) and the board after one move (White), then
    two consecutive positions a quarter and half way through a game of the
    engine's random-playout moves, with stones, history planes and captures.
    Deterministic, so a model is always probed on the same positions.
    """
    from engine.board import Board

    n = board_size
    wanted = sorted({0, 1, n * n // 4, n * n // 4 + 1, n * n // 2, n * n // 2 + 1})
    board, positions = Board(n, schema.DEFAULT_KOMI), []
    for move_number in range(wanted[-1] + 1):
        if board.is_over:
            break
        if move_number in wanted:
            positions.append(board.features(channels))
        board.play(board.playout_policy_move(move_number))
    return np.stack(positions).astype(np.float32)


def check_outputs(logits, values, rows: int, board_size: int) -> str | None:
    """None when an evaluator's answer for ``rows`` positions is what a search can use, else what is wrong.

    The search backs up whatever it is given: a NaN value poisons every node
    above it and NaN priors make every move alike (a diverged network plays
    moves 0, 1, 2, ...), so not-finite outputs are refused as firmly as
    wrong shapes.
    """
    logits, values = np.asarray(logits), np.asarray(values)
    actions = board_size * board_size + 1
    if logits.shape != (rows, actions) or values.reshape(-1).shape != (rows,):
        return f"outputs of shapes {list(logits.shape)} and {list(values.shape)}, not [{rows}, {actions}] and [{rows}]"
    if not (np.isfinite(logits).all() and np.isfinite(values).all()):
        return "outputs that are not finite (a diverged network)"
    return None


def probe_model(evaluator, board_size: int, generation: int) -> None:
    """Evaluate `probe_positions` and require the outputs a search needs (`check_outputs`).

    A diverged network passes its checksums and loads fine, then plays the same nonsense in
    every game; a network that cannot take this board fails deep inside the search.  Both
    are refused here, in one line, before a single game moves to them.
    """
    planes = probe_positions(board_size, input_planes_of(evaluator))
    try:
        logits, values = evaluator(planes)
    except Exception as exc:  # noqa: BLE001 - whatever the backend raises, the model is what failed
        raise ModelMisfit(
            f"model generation {generation} cannot evaluate {board_size}x{board_size} positions "
            f"({type(exc).__name__}: {one_line(str(exc), 200)})"
        ) from None
    problem = check_outputs(logits, values, len(planes), board_size)
    if problem is not None:
        raise ModelMisfit(f"model generation {generation} answers {len(planes)} probe positions with {problem}")

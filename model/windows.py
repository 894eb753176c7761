"""Finding work in the lake: run.json's board size and complete training windows.

A *window* is ``ROOT/windows/<gen:06d>/``: shards written by the Beam job,
then ``MANIFEST.json`` written last.  Its ``target_generation`` is the model
generation trained from it.  A window directory without a manifest is still
being written and is ignored.  Nothing here imports TensorFlow, so the
trainer's CLI can refuse bad input before paying for it.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

from format import schema
from format.run_config import RunConfigMismatch, read_run_config

log = logging.getLogger(__name__)


class LakeError(RuntimeError):
    """The lake cannot be trained from as asked; the message says why and where."""


@dataclass(frozen=True)
class Window:
    """A complete training window (from its MANIFEST.json)."""

    target_generation: int
    board_size: int
    shards: tuple[str, ...]
    """Storage paths of the shards, relative to the lake root."""
    positions: int
    manifest_path: str

    def steps(self, global_batch: int, epochs: float) -> int:
        """Training steps for ``epochs`` passes at ``global_batch`` (at least 1)."""
        return max(1, math.ceil(self.positions * epochs / global_batch))


def window_dir(generation: int) -> str:
    return f"{schema.WINDOWS_DIR}/{schema.generation_dir(generation)}"


def lake_board_size(storage, flag_board_size: int) -> int:
    """The run's board size; refuses a missing run.json or a disagreeing flag."""
    try:
        run = read_run_config(storage)
    except RunConfigMismatch as exc:
        raise LakeError(str(exc)) from None
    where = storage.url(schema.RUN_CONFIG)
    if run is None:
        raise LakeError(f"{where} does not exist: this root has no run yet "
                        "(self-play or the pipeline creates it)")
    if flag_board_size and flag_board_size != run.board_size:
        raise LakeError(f"--board-size {flag_board_size} disagrees with {where}, "
                        f"which says board_size {run.board_size}")
    return run.board_size


def parse_manifest(data: bytes, manifest_path: str) -> Window:
    """A window from its manifest's bytes; LakeError names the file and field."""
    try:
        fields = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LakeError(f"{manifest_path}: not valid JSON ({exc})") from None
    directory = manifest_path.rsplit("/", 1)[0]

    def need(name, kind):
        value = fields.get(name) if isinstance(fields, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise LakeError(f"{manifest_path}: field '{name}' is missing or not {kind.__name__}")
        return value

    if need("version", int) != 1:
        raise LakeError(f"{manifest_path}: field 'version' is {fields['version']}, expected 1")
    shards = need("shards", list)
    if not shards or not all(isinstance(s, str) and s and "/" not in s and ".." not in s for s in shards):
        raise LakeError(f"{manifest_path}: field 'shards' must list shard file names in the window")
    positions = need("positions", int)
    if positions <= 0:
        raise LakeError(f"{manifest_path}: field 'positions' is {positions}")
    return Window(target_generation=need("target_generation", int), board_size=need("board_size", int),
                  shards=tuple(f"{directory}/{s}" for s in shards), positions=positions,
                  manifest_path=manifest_path)


def complete_windows(storage, board_size: int) -> list[Window]:
    """Every window with a readable manifest for this board size, oldest first.

    A malformed or foreign manifest costs only its window: it is logged and
    skipped.
    """
    windows = []
    for info in storage.list(f"{schema.WINDOWS_DIR}/"):
        if not info.path.endswith("/" + schema.MANIFEST):
            continue
        try:
            window = parse_manifest(storage.read(info.path), info.path)
        except LakeError as exc:
            log.warning("skipping window: %s", exc)
            continue
        if window.board_size != board_size:
            log.warning("skipping %s: board_size %d, the run is %d", info.path, window.board_size, board_size)
            continue
        if info.path != f"{window_dir(window.target_generation)}/{schema.MANIFEST}":
            log.warning("skipping %s: its target_generation %d does not match its directory",
                        info.path, window.target_generation)
            continue
        windows.append(window)
    return sorted(windows, key=lambda w: w.target_generation)


def newest_untrained(windows: list[Window], latest_published: int | None) -> Window | None:
    """The newest window whose generation is newer than every published model."""
    floor = -1 if latest_published is None else latest_published
    fresh = [w for w in windows if w.target_generation > floor]
    return fresh[-1] if fresh else None

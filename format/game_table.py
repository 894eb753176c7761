"""A window's game table: each game's ownership label and generation, once per game.

Position records (format/SPEC.md "Window game table") keep neither
per position: a position's ``game`` column indexes a row of this table, and
only a position whose label is its own (a capped opening's merged mean)
keeps an int8 row in its record.  The shuffle job writes the table beside
its shards, before the manifest (which names it); every reader reads it
through `decode_game_table` (bytes) or `read_window_table` (a window of a
lake), which validate it and raise `FormatError` naming the file and the
field.

File: a GZIP TFRecord holding one ``tf.train.Example`` (the project's own
codec: CRC-checked framing, the validated field reader); columns::

    version, board_size, count (G)
    generation      int64[G]
    fine            int64[G]   1: the label is fractional
    ownership       bytes      G rows of base-3 codes from Black's side (pack_trits); zeros for fine games
    ownership_fine  bytes      int8[F, NN] round(127 * o) of each fine game, in order

In memory it is `GameTable`: generation int64[G] and ownership int8[G, NN] (round(127 * o),
Black's side), which the encoder compares labels with and `model.tfdata` gathers from.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from format import schema
from format.example_fields import FeatureReader, FormatError, parse_example, set_bytes, set_int64
from format.example_proto import Example
from format.position_records import code_colours, colour_codes, pack_trits, unpack_trits
from format.tfrecord import RecordError, compress_gzip, decompress_gzip, frame_records, iter_framed_records


class MissingGameTable(FormatError):
    """A window's game table is not where its manifest (or its shards' folder) says."""

    def __init__(self, source: str, problem: str):
        super().__init__(source, None, problem)
        self.args = (f"{source}: {problem}",)

    def __str__(self) -> str:
        return self.args[0]


TABLE_GZIP_LEVEL = 3
"""The table is written once per window and read once per training window: the smallest ISA-L level."""


@dataclasses.dataclass
class GameTable:
    """G games' labels and generations (row g = the manifest's ``games[g]``)."""

    board_size: int
    generation: np.ndarray
    """int64[G]: generation of the model that played each game."""
    ownership: np.ndarray
    """int8[G, NN]: ``round(127 * o)`` from Black's side; an exact label is -127, 0 or 127 a point."""

    def __post_init__(self):
        nn = self.board_size * self.board_size
        self.generation = np.asarray(self.generation, np.int64).reshape(-1)
        self.ownership = np.ascontiguousarray(self.ownership, np.int8).reshape(-1, nn)
        if len(self.ownership) != len(self.generation):
            raise ValueError(f"{len(self.generation)} generations for {len(self.ownership)} ownership rows")

    def __len__(self) -> int:
        return len(self.generation)

    @property
    def fine(self) -> np.ndarray:
        """bool[G]: the label is fractional (some point neither -127, 0 nor 127)."""
        return fractional(self.ownership)

    def planes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(codes uint8[G, trit_bytes], fine slot int32[G], fine rows int8[F + 1, NN]): the table as
        model.tfdata gathers it.  Exact games: their base-3 codes, slot F (the zero row); fine games:
        zero codes, slot k (their row among the fine rows)."""
        fine = self.fine
        codes = np.where(fine[:, None], 0, pack_trits(colour_codes(np.sign(self.ownership)))).astype(np.uint8)
        slot = np.full(len(self), int(fine.sum()), np.int32)
        slot[fine] = np.arange(int(fine.sum()), dtype=np.int32)
        rows = np.concatenate([self.ownership[fine], np.zeros((1, self.ownership.shape[1]), np.int8)])
        return codes, slot, rows


def fractional(rows: np.ndarray) -> np.ndarray:
    """bool[R]: rows of int8 ownership that hold a value other than -127, 0, 127."""
    scale = schema.OWNERSHIP_SCALE
    return ((rows != 0) & (rows != scale) & (rows != -scale)).any(axis=1)


def label_rows(ownership_black: np.ndarray) -> np.ndarray:
    """int8[G, NN] ``round(127 * o)`` of float ownership labels from Black's side, clipped to +-127.

    The one rounding of a label: the records' per-position rows are these
    rows (negated for White to move), so a position's label equals its
    game's row exactly unless capping merged it with other games' labels.
    """
    scaled = np.asarray(ownership_black, np.float32) * np.float32(schema.OWNERSHIP_SCALE)
    return np.clip(np.round(scaled), -schema.OWNERSHIP_SCALE, schema.OWNERSHIP_SCALE).astype(np.int8)


def encode_game_table(table: GameTable) -> bytes:
    """The whole table file (GZIP TFRecord of one Example)."""
    fine = table.fine
    ternary = np.where(fine[:, None], 0, np.sign(table.ownership)).astype(np.int8)
    ex = Example()
    set_int64(ex, schema.GT_VERSION, [schema.GAME_TABLE_VERSION])
    set_int64(ex, schema.GT_BOARD_SIZE, [table.board_size])
    set_int64(ex, schema.GT_COUNT, [len(table)])
    set_int64(ex, schema.GT_GENERATION, table.generation)
    set_int64(ex, schema.GT_FINE, fine.astype(np.int64))
    set_bytes(ex, schema.GT_OWNERSHIP, pack_trits(colour_codes(ternary)).tobytes())
    set_bytes(ex, schema.GT_OWNERSHIP_FINE, table.ownership[fine].tobytes())
    return compress_gzip(frame_records([ex.SerializeToString(deterministic=True)]), TABLE_GZIP_LEVEL)


def decode_game_table(
    data: bytes, source: str, *, board_size: int | None = None, games: Sequence[str] | int | None = None
) -> GameTable:
    """Validate a table file's bytes.  ``board_size`` and ``games`` (the manifest's ids, or their
    count), when given, must agree with it.  FormatError names ``source`` and the field."""
    try:
        records = list(iter_framed_records(decompress_gzip(data, source), source))
    except RecordError as exc:
        raise FormatError(source, None, str(exc).split(": ", 1)[-1]) from None
    if len(records) != 1:
        raise FormatError(source, None, f"holds {len(records)} records; a game table is one record")
    r = FeatureReader(parse_example(records[0], source), source)
    version = r.int(schema.GT_VERSION)
    if version != schema.GAME_TABLE_VERSION:
        raise r.error(
            schema.GT_VERSION,
            f"unknown game-table version {version} (this reader knows "
            f"{schema.GAME_TABLE_VERSION}); update zerolake to read it",
        )
    n = r.int(schema.GT_BOARD_SIZE)
    if not schema.MIN_BOARD_SIZE <= n <= schema.MAX_BOARD_SIZE or (board_size is not None and n != board_size):
        raise r.error(schema.GT_BOARD_SIZE, f"is {n}" + (f", the window's board is {board_size}" if board_size else ""))
    count = r.int(schema.GT_COUNT)
    expected = games if isinstance(games, int) or games is None else len(games)
    if count < 0 or (expected is not None and count != expected):
        raise r.error(schema.GT_COUNT, f"is {count}, but the window's manifest lists {expected} games")
    nn, width = n * n, schema.trit_bytes(n)
    generation = r.ints(schema.GT_GENERATION)
    if len(generation) != count or (generation < 0).any():
        raise r.error(schema.GT_GENERATION, f"has {len(generation)} entries (or a negative one), expected {count}")
    fine = r.ints(schema.GT_FINE)
    if len(fine) != count or not np.isin(fine, (0, 1)).all():
        raise r.error(schema.GT_FINE, f"must hold {count} flags, each 0 or 1")
    fine = fine.astype(bool)
    raw = r.bytes(schema.GT_OWNERSHIP)
    if len(raw) != count * width:
        raise r.error(schema.GT_OWNERSHIP, f"has {len(raw)} bytes, expected {count} games x {width}")
    codes = unpack_trits(np.frombuffer(raw, np.uint8).reshape(count, width), nn)
    if (codes == 3).any():
        raise r.error(schema.GT_OWNERSHIP, "holds a byte above 242 (not 5 base-3 digits)")
    if codes[fine].any():
        raise r.error(schema.GT_OWNERSHIP, "holds a nonzero row for a fine game")
    fine_raw = r.bytes(schema.GT_OWNERSHIP_FINE)
    if len(fine_raw) != int(fine.sum()) * nn:
        raise r.error(
            schema.GT_OWNERSHIP_FINE, f"has {len(fine_raw)} bytes, expected {int(fine.sum())} fine games x {nn}"
        )
    fine_rows = np.frombuffer(fine_raw, np.int8).reshape(-1, nn)
    if (fine_rows == -128).any():
        raise r.error(
            schema.GT_OWNERSHIP_FINE, f"holds -128 (ownership is -{schema.OWNERSHIP_SCALE}..{schema.OWNERSHIP_SCALE})"
        )
    ownership = code_colours(codes) * np.int8(schema.OWNERSHIP_SCALE)
    ownership[fine] = fine_rows
    return GameTable(board_size=n, generation=generation, ownership=ownership)


def read_window_table(storage, window) -> GameTable:
    """The game table of a window (a `format.window_manifest.WindowManifest`), validated
    against its manifest.  A missing or damaged table raises FormatError naming the file."""
    from cloud.base import NotFound

    if not window.game_table:
        raise ValueError(f"{storage.url(window.path)} names no game table (record version {window.record_version})")
    url = storage.url(window.game_table)
    try:
        data = storage.read(window.game_table)
    except NotFound:
        raise MissingGameTable(
            url,
            f"is missing: the window's manifest ({storage.url(window.path)}) names it, and "
            "its positions take their ownership and generation from it",
        ) from None
    return decode_game_table(data, url, board_size=window.board_size, games=window.games)

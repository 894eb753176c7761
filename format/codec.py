"""The one codec for the lake's two record kinds (byte layout: format/SPEC.md): its public surface.

*Game records* keep one self-play game each (chunks, format/SPEC.md "Chunks");
*position records* keep training examples (shards, "Shards", which also says
which versions are written and which are only read).  The code lives in
modules of one concern each:

* `format.game_records`: game records, and chunk framing and compression;
* `format.position_records`: position records and shards, and the one
  decoder of every version;
* `format.group_wire`: the shuffle job's encoder of position groups
  (`encode_groups`, byte-identical to `encode_position_groups`);
* `format.game_table`: a window's game table (each game's ownership label
  and generation, once per game);
* `format.legacy.version1`: version-1 position records, read only;
* `format.example_fields`: what both kinds share (typed feature access, FormatError).

Data flow::

    selfplay.worker --encode_game()--> selfplay.spool --frame_chunk()--> chunks (games/...)
    chunks --read_chunk() / iter_chunk()--> GameRecord... --> pipeline, format.inspect
    pipeline --written_positions()--> encode_groups() --> shards (GZIP TFRecord) --> model.tfdata --> trainer
    pipeline --encode_game_table()--> the window's game table --> model.tfdata, read_shard(table=)

Every decode validates what it reads and raises :class:`FormatError` naming
the source (file and record index) and the field; nothing read is unpickled or evaluated.
"""
from format.example_fields import FormatError
from format.game_table import GameTable, decode_game_table, encode_game_table, read_window_table
from format.game_records import (
    GameRecord,
    Segments,
    chunk_records,
    decode_game,
    encode_chunk,
    encode_game,
    flat_segments,
    frame_chunk,
    iter_chunk,
    pack_ownership,
    quantize_policy,
    read_chunk,
    unpack_ownership,
)
from format.position_records import (
    CompactPositions,
    PositionHistory,
    PositionRecord,
    colour_codes,
    decode_position,
    decode_records,
    encode_position_groups,
    encode_shard,
    pack_trits,
    policy_integers,
    policy_small_integers,
    read_shard,
    unpack_trits,
    written_positions,
)
from format.group_wire import encode_groups

__all__ = [
    "FormatError",
    "GameTable",
    "encode_game_table",
    "decode_game_table",
    "read_window_table",
    "GameRecord",
    "Segments",
    "flat_segments",
    "PositionRecord",
    "CompactPositions",
    "PositionHistory",
    "encode_position_groups",
    "encode_groups",
    "decode_records",
    "pack_trits",
    "unpack_trits",
    "colour_codes",
    "policy_integers",
    "policy_small_integers",
    "written_positions",
    "encode_game",
    "decode_game",
    "encode_chunk",
    "frame_chunk",
    "chunk_records",
    "read_chunk",
    "iter_chunk",
    "decode_position",
    "encode_shard",
    "read_shard",
    "quantize_policy",
    "pack_ownership",
    "unpack_ownership",
]

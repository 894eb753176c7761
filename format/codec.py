"""The one codec for the lake's two record kinds (byte layout: format/SPEC.md): its public surface.

The code lives in four modules, one concern each:

* `format.game_records`: game records and chunks;
* `format.position_records`: position records and shards (groups of
  compact positions) and their decoder;
* `format.game_table`: a window's game table (each game's ownership label
  and generation, once per game);
* `format.group_wire`: the position records' encoder (`encode_groups`);

with `format.example_fields` holding what both record kinds share (typed
feature access and FormatError).

Data flow::

    selfplay.worker --encode_game()--> selfplay.spool --frame_chunk()--> chunks (games/...)
    chunks --read_chunk() / iter_chunk()--> GameRecord... --> pipeline, format.inspect
    pipeline --PositionBatch.compact()--> --encode_groups()--> shards (GZIP TFRecord) --> model.tfdata --> trainer
    pipeline --encode_game_table()--> the window's game table --> model.tfdata, read_shard(table=)

*Game records* keep one game each (moves, bit-packed boards, sparse policy targets, the result and
endstate); *position records* keep groups of 64 compact training positions that model.tfdata expands in
the graph.  Every decode validates what it reads and raises :class:`FormatError` naming
the source (file and record index) and the field; nothing read is unpickled or evaluated.
"""

from format.example_fields import FormatError
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
from format.game_table import GameTable, decode_game_table, encode_game_table, read_window_table
from format.group_wire import encode_groups
from format.position_records import (
    CompactPositions,
    PositionHistory,
    PositionRecord,
    colour_codes,
    decode_records,
    encode_shard,
    pack_trits,
    policy_columns,
    policy_integers,
    read_shard,
    unpack_trits,
)

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
    "encode_groups",
    "decode_records",
    "pack_trits",
    "unpack_trits",
    "colour_codes",
    "policy_integers",
    "policy_columns",
    "encode_game",
    "decode_game",
    "encode_chunk",
    "frame_chunk",
    "chunk_records",
    "read_chunk",
    "iter_chunk",
    "encode_shard",
    "read_shard",
    "quantize_policy",
    "pack_ownership",
    "unpack_ownership",
]

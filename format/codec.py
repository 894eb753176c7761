"""The one codec for the lake's two record kinds (byte layout: format/SPEC.md).

This module is the codec's public surface; the code lives in three modules,
one concern each:

* `format.game_records`: game records and chunks;
* `format.position_records`: position records and shards: version 1 one
  position at a time, version 2 (what the shuffle job writes) in groups of
  compact positions;
* `format.position_wire`: a batched version-1 encoder, which writes
  protobuf wire bytes directly (byte-identical to the reference);

with `format.example_fields` holding what both record kinds share (typed
feature access and FormatError).

Data flow::

    selfplay.worker --GameRecord--> encode_chunk() --bytes--> Storage.write_new(games/...)
    Storage.read() --bytes--> read_chunk() --GameRecord...--> pipeline, format.inspect
    pipeline --encode_position_groups()--> shards (GZIP TFRecord) --> format.tfdata --> trainer

*Game records* keep one game each: the moves, the fresh board planes of every
position (bit-packed; history is rebuilt by the Beam job), a sparse quantized
policy target per fully searched position, root values, the result and the
endstate.  *Position records* keep training examples: version 2 groups of 64 compact
positions (board, last moves and captures, small-integer policy, ternary
ownership) that format.tfdata expands in the graph, so the trainer needs no
Go engine; version 1 (one assembled example each) is still read.

Every decode validates what it reads and raises :class:`FormatError` naming
the source (file and record index) and the field.  Nothing read is unpickled
or evaluated.
"""
from format.example_fields import FormatError
from format.game_records import (
    GameRecord,
    Segments,
    decode_game,
    encode_chunk,
    encode_game,
    flat_segments,
    iter_chunk,
    pack_ownership,
    quantize_policy,
    read_chunk,
    unpack_ownership,
)
from format.position_records import (
    CompactPositions,
    PositionRecord,
    colour_codes,
    decode_position,
    decode_records,
    encode_position,
    encode_position_groups,
    encode_shard,
    pack_trits,
    policy_small_integers,
    read_shard,
    unpack_trits,
)
from format.position_wire import encode_positions, encode_positions_framed

__all__ = [
    "FormatError",
    "GameRecord",
    "Segments",
    "flat_segments",
    "PositionRecord",
    "CompactPositions",
    "encode_position_groups",
    "decode_records",
    "pack_trits",
    "unpack_trits",
    "colour_codes",
    "policy_small_integers",
    "encode_game",
    "decode_game",
    "encode_chunk",
    "read_chunk",
    "iter_chunk",
    "encode_position",
    "encode_positions",
    "encode_positions_framed",
    "decode_position",
    "encode_shard",
    "read_shard",
    "quantize_policy",
    "pack_ownership",
    "unpack_ownership",
]

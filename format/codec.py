"""The one codec for the lake's two record kinds (byte layout: format/SPEC.md).

This module is the codec's public surface; the code lives in three modules,
one concern each:

* `format.game_records`: game records and chunks;
* `format.position_records`: position records and shards, one at a time;
* `format.position_wire`: the Beam job's batched position encoder, which
  writes protobuf wire bytes directly (byte-identical to the reference);

with `format.example_fields` holding what both record kinds share (typed
feature access and FormatError).

Data flow::

    selfplay.worker --GameRecord--> encode_chunk() --bytes--> Storage.write_new(games/...)
    Storage.read() --bytes--> read_chunk() --GameRecord...--> pipeline, format.inspect
    pipeline --encode_position()--> shards (GZIP TFRecord) --> format.tfdata --> trainer

*Game records* keep one game each: the moves, the fresh board planes of every
position (bit-packed; history is rebuilt by the Beam job), a sparse quantized
policy target per fully searched position, root values, the result and the
endstate.  *Position records* keep one training example each, already
assembled (history planes, dense-able policy, targets, weights), so the
trainer needs no Go engine.

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
    PositionRecord,
    decode_position,
    encode_position,
    encode_shard,
    read_shard,
)
from format.position_wire import encode_positions, encode_positions_framed

__all__ = [
    "FormatError",
    "GameRecord",
    "Segments",
    "flat_segments",
    "PositionRecord",
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

"""tf.data decoding of version-1 position records (format.legacy.version1) into training batches.

`model.tfdata.training_dataset` reads a version-1 window with the same
seeded, resumable file plumbing as the group versions and hands each batch
of serialized records to `PositionDecoder.decode`, which returns the dict
every decoder returns (model.tfdata's module docstring lists its keys).

Data flow::

    shard files (GZIP TFRecord)
      -> interleave over files, each read as mini-batches of MINIBATCH
         serialized records (fixed order, so a resumed run sees the same stream)
      -> shuffle mini-batches (seeded), rebatch to the training batch
                                           # batch FIRST: parsing per example is 15-20x slower
      -> enumerate, skip batches already trained
      -> PositionDecoder.decode: parse_example on the whole batch, unpack
         bits with a [256, 8] lookup table (tf.gather), one random symmetry
         per example, applied alike to planes, policy and ownership
      -> prefetch

How the symmetry stays cheap: after the lookup-table unpack a record is a
flat bit vector in *plane-major* order (``c * NN + p``); the network wants
*channels-last* order (``q * 16 + c``) with the symmetry applied.  For each
symmetry ``k`` a table ``PLANE_GATHER[k, q * 16 + c] = c * NN + inverse_k(q)``
lets one gather per bit do both.  As ordinary TensorFlow ops that gather
costs ~40 ms per 1024 19x19 examples (one core), more than everything else;
compiled with XLA (``tf.function(jit_compile=True)``, which works inside a
tf.data map) the lookup, gather and cast fuse into one loop: ~8 us an
example, 1.3-1.4x faster than packing each point's planes into a word and
gathering words, and 2x faster than the same ops uncompiled.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from format import planes as plane_layout
from format import schema
from format.legacy.version1 import VERSION
from format.symmetry import NUM_SYMMETRIES, inverse_permutations, symmetry_permutations

MINIBATCH = 64
"""Records each shard reader batches together before the shuffle.

Everything after the parallel readers then handles 1/64th as many elements:
tf.data costs ~1 us per element per stage, which at 60k+ records/s was a
third of the input pipeline (19x19: 52k -> 63-70k ex/s on 2 shared cores).
Shuffling whole mini-batches still mixes a window that the Beam job has
already shuffled."""

_WEIGHT_FIELDS = {
    "policy_weight": schema.P_POLICY_WEIGHT,
    "value_weight": schema.P_VALUE_WEIGHT,
    "ownership_weight": schema.P_OWNERSHIP_WEIGHT,
    "score_weight": schema.P_SCORE_WEIGHT,
}


def bit_unpack_table() -> np.ndarray:
    """[256, 8] uint8: row ``b`` holds the bits of byte ``b``, most significant first.

    Matches ``np.packbits(..., bitorder="big")``, the writer's packing.
    """
    return np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="big")


def plane_gather_table(inverse_points: np.ndarray) -> np.ndarray:
    """int32 [8, NN * 16]: ``PLANE_GATHER[k, q * 16 + c] = c * NN + inverse_k(q)``.

    ``inverse_points[k, q]`` is the point that symmetry k moves to q.  Entry
    ``q * 16 + c`` of the output (NHWC order) reads bit ``c * NN + p`` of the
    plane-major input (point p = inverse_k(q), plane c).
    """
    points = inverse_points.shape[1]
    channel = np.arange(plane_layout.PACKED_PLANES, dtype=np.int32)
    table = channel[None, None, :] * points + inverse_points[:, :, None].astype(np.int32)
    return table.reshape(NUM_SYMMETRIES, points * plane_layout.PACKED_PLANES)


def position_feature_spec() -> dict:
    """``tf.io.parse_example`` spec for the fields a trainer reads."""
    scalar_int = tf.io.FixedLenFeature([1], tf.int64)
    scalar_float = tf.io.FixedLenFeature([1], tf.float32)
    spec = {
        schema.P_VERSION: scalar_int,
        schema.P_BOARD_SIZE: scalar_int,
        schema.P_PLANES: tf.io.FixedLenFeature([1], tf.string),
        schema.P_TO_PLAY: scalar_int,
        schema.P_POLICY_INDEX: tf.io.VarLenFeature(tf.int64),
        schema.P_POLICY_PROB: tf.io.VarLenFeature(tf.float32),
        schema.P_VALUE: scalar_float,
        schema.P_SCORE: scalar_float,
        schema.P_OWNERSHIP: tf.io.FixedLenFeature([1], tf.string),
    }
    for field in _WEIGHT_FIELDS.values():
        spec[field] = scalar_float
    return spec


class PositionDecoder:
    """Decodes a batch of serialized position records for one board size.

    Holds the lookup tables as constants so that ``decode`` can be mapped
    over a dataset; ``symmetries`` is an int32 [B] tensor of symmetry ids
    (0 = identity).  The per-point work (unpack, symmetry, layout) is one
    XLA-compiled function (see the module docstring for why).  ``jit=False``
    runs the same ops as an ordinary graph.
    """

    def __init__(self, board_size: int, *, jit: bool = True):
        if not schema.MIN_BOARD_SIZE <= board_size <= schema.MAX_BOARD_SIZE:
            raise ValueError(f"board_size {board_size} outside "
                             f"[{schema.MIN_BOARD_SIZE}, {schema.MAX_BOARD_SIZE}]")
        self.board_size = board_size
        self.points = board_size * board_size
        self.actions = schema.num_actions(board_size)
        self.packed_bytes = schema.packed_plane_bytes(board_size, plane_layout.PACKED_PLANES)
        self._unpack = tf.constant(bit_unpack_table().astype(np.int32))
        forward = np.asarray(symmetry_permutations(board_size), dtype=np.int32)
        inverse = np.asarray(inverse_permutations(board_size), dtype=np.int32)
        if forward.shape != (NUM_SYMMETRIES, self.actions) or inverse.shape != forward.shape:
            raise ValueError(f"format.symmetry tables for {board_size}x{board_size} have shape "
                             f"{forward.shape}, expected {(NUM_SYMMETRIES, self.actions)}")
        self._forward = tf.constant(forward.reshape(-1))  # flat [8 * A]: forward[k * A + p]
        self._inverse_points = tf.constant(inverse[:, : self.points])  # [8, NN]
        self._plane_gather = tf.constant(plane_gather_table(inverse[:, : self.points]))  # [8, NN*16]
        self._spec = position_feature_spec()
        self._points_core = tf.function(self._per_point, jit_compile=jit, autograph=False)

    def decode(self, serialized: tf.Tensor, symmetries: tf.Tensor) -> dict:
        """serialized: string [B]; symmetries: int32 [B] -> dict (see module doc)."""
        parsed = tf.io.parse_example(serialized, self._spec)
        with tf.control_dependencies(self._header_checks(parsed)):
            packed = tf.io.decode_raw(parsed[schema.P_PLANES][:, 0], tf.uint8,
                                      fixed_length=self.packed_bytes)  # [B, bytes]
        ownership = tf.io.decode_raw(parsed[schema.P_OWNERSHIP][:, 0], tf.int8,
                                     fixed_length=self.points)  # [B, NN]
        planes, ownership = self._points_core(packed, ownership, parsed[schema.P_TO_PLAY][:, 0],
                                              symmetries)
        batch = {
            "planes": planes,
            "policy": self._policy(parsed, symmetries),
            "ownership": ownership,
            "value": parsed[schema.P_VALUE][:, 0],
            "score": parsed[schema.P_SCORE][:, 0],
        }
        for key, field in _WEIGHT_FIELDS.items():
            batch[key] = parsed[field][:, 0]
        return batch

    def _header_checks(self, parsed: dict) -> list:
        return [
            tf.debugging.assert_equal(
                parsed[schema.P_VERSION], tf.constant(VERSION, tf.int64),
                message=f"position record field '{schema.P_VERSION}' is not {VERSION} "
                        "(this window mixes record versions)"),
            tf.debugging.assert_equal(
                parsed[schema.P_BOARD_SIZE], tf.constant(self.board_size, tf.int64),
                message=f"position record field '{schema.P_BOARD_SIZE}' is not {self.board_size}"),
        ]

    def _per_point(self, packed, ownership, to_play, symmetries):
        """uint8 [B, bytes], int8 [B, NN], int64 [B], int32 [B] -> planes, ownership.

        The lookup table turns bytes into a plane-major bit vector; one
        gather per bit, with ``PLANE_GATHER[symmetry]`` as indices, applies
        the symmetry and moves to channels-last at once.  The record holds
        input channels 0 .. PACKED_PLANES - 1 in order; the colour plane,
        the last channel (format/planes.py), is rebuilt from ``to_play``.
        """
        n = self.board_size
        bits = tf.reshape(tf.gather(self._unpack, tf.cast(packed, tf.int32)),
                          [-1, plane_layout.PACKED_PLANES * self.points])  # plane-major
        stones = tf.gather(bits, tf.gather(self._plane_gather, symmetries), batch_dims=1)
        stones = tf.reshape(tf.cast(stones, tf.float32), [-1, n, n, plane_layout.PACKED_PLANES])
        colour_on = tf.cast(tf.equal(to_play, plane_layout.COLOUR_PLANE_SIDE), tf.float32)
        colour = tf.broadcast_to(colour_on[:, None, None, None], tf.shape(stones[..., :1]))
        moved = tf.gather(tf.cast(ownership, tf.float32), tf.gather(self._inverse_points, symmetries),
                          batch_dims=1)
        return tf.concat([stones, colour], axis=-1), moved / float(schema.OWNERSHIP_SCALE)

    def _policy(self, parsed: dict, symmetries: tf.Tensor) -> tf.Tensor:
        """Sparse (index, prob) lists -> dense [B, A] with the symmetry applied."""
        index = parsed[schema.P_POLICY_INDEX]
        prob = parsed[schema.P_POLICY_PROB]
        row = tf.cast(index.indices[:, 0], tf.int32)
        point = tf.cast(index.values, tf.int32)
        moved = tf.gather(self._forward, tf.gather(symmetries, row) * self.actions + point)
        batch = tf.shape(symmetries)[0]
        # A segment sum into B*A slots is the scatter: several times faster
        # than tf.scatter_nd on CPU.
        dense = tf.math.unsorted_segment_sum(prob.values, row * self.actions + moved,
                                             batch * self.actions)
        return tf.reshape(dense, [batch, self.actions])

"""tf.data reader for training shards: position records -> training batches of float32 tensors.

A record (format/SPEC.md) is a group of 64 compact positions expanded here, in the graph
(`GroupDecoder`); ownership labels are rows of the window's game table (format.game_table), loaded
once.  Only ``schema.POSITION_RECORD_VERSION`` is read: an older shard is refused in one line naming
it (`shard_record_version`).  N is the board size, NN = N*N points, A = NN + 1 actions (pass last).

    shards (GZIP TFRecord) -> interleave (fixed order) -> shuffle groups (seeded)
      -> stage 1 per batch of groups: parse, one row per position, the sparse policy made dense, the
         captures as a bit mask a point, ownership rows from the record or the game table
      -> rebatch to batch_size positions; skip batches already trained (stage 2 not paid for them)
      -> stage 2, XLA-compiled: base-3 boards, one random symmetry per example (format.symmetry),
         the 7 older boards by undoing moves, the [B, N, N, C] planes (C = 17, or 22 with chains,
         liberties, legal points and the ko recapture of the board at t; format/planes.py)
      -> prefetch

A batch is a dict: ``planes`` [B, N, N, C] (NHWC), ``policy`` [B, A] (sums to 1, or all 0),
``value`` [B] (the result for the side to move), ``score`` [B] (final area score, side to move),
``ownership`` [B, NN] (in [-1, 1], side to move), and each head's ``*_weight`` [B].
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import tensorflow as tf

from format import layout, position_records, schema
from format import planes as plane_layout
from format.example_fields import FormatError
from format.symmetry import NUM_SYMMETRIES, inverse_permutations, symmetry_permutations

HEAD_WEIGHT_KEYS = ("policy_weight", "value_weight", "ownership_weight", "score_weight")
"""Keys of the decoded batch that hold per-example loss weights."""


class GroupDecoder:
    """Decodes records (groups of compact positions) for one board size.

    `stage1` runs on a batch of serialized records and returns one row per
    position, unexpanded; stage 2 (`PlaneExpander`, XLA-compiled, one per
    board shape and process) expands a batch of rows into the decoded batch
    the module docstring describes, and gives the data flow.  A decoder
    needs its window's game ``table`` (format.game_table.GameTable), held
    as constants: the table's base-3 codes of each exact label, and the int8
    rows of the fractional ones with an index per game (a game without one
    points at a zero row).
    ``input_planes`` (17 or 22) is how many of format/planes.py's channels
    the batch's ``planes`` hold: the training network's input width.
    """

    def __init__(self, board_size: int, *, table, jit: bool = True, input_planes: int = schema.BASIC_INPUT_PLANES):
        plane_layout.check_channels(input_planes)
        if not schema.MIN_BOARD_SIZE <= board_size <= schema.MAX_BOARD_SIZE:
            raise ValueError(f"board_size {board_size} outside [{schema.MIN_BOARD_SIZE}, {schema.MAX_BOARD_SIZE}]")
        if table is None or table.board_size != board_size:
            raise ValueError(
                f"position records need their window's game table for {board_size}x{board_size} (format.game_table)"
            )
        self.version = schema.POSITION_RECORD_VERSION
        self.input_planes = input_planes
        n = self.board_size = board_size
        self.points = n * n
        self.actions = schema.num_actions(n)
        self.width = schema.trit_bytes(n)
        self.move_width = schema.move_bytes(n)
        group = schema.POSITION_GROUP
        self._spec = {
            schema.P_VERSION: tf.io.FixedLenFeature([1], tf.int64),
            schema.P_BOARD_SIZE: tf.io.FixedLenFeature([1], tf.int64),
            schema.P_COUNT: tf.io.FixedLenFeature([1], tf.int64),
            schema.P_BOARD: tf.io.FixedLenFeature([1], tf.string),
            schema.P_OWNERSHIP_FINE: tf.io.FixedLenFeature([1], tf.string),
            schema.P_MOVES: tf.io.FixedLenFeature([1], tf.string),
            schema.P_TARGETS: tf.io.FixedLenFeature([1], tf.string),
            schema.P_CAPTURE_COUNT: tf.io.VarLenFeature(tf.int64),
            schema.P_CAPTURES: tf.io.VarLenFeature(tf.int64),
            schema.P_POLICY_COUNT: tf.io.VarLenFeature(tf.int64),
            schema.P_POLICY_INDEX_DELTA: tf.io.VarLenFeature(tf.int64),
            schema.P_POLICY_VALUE: tf.io.VarLenFeature(tf.int64),
            schema.P_GAME: tf.io.VarLenFeature(tf.int64),
        }
        codes, slot, rows = table.planes()
        self._games = len(table)
        self._fine_games = len(rows) - 1
        self._table_codes = tf.constant(codes)  # uint8 [G, W]: exact labels, zeros for fine games
        self._table_slot = tf.constant(slot)  # int32 [G]: each game's row of _table_fine
        self._table_fine = tf.constant(rows)  # int8 [F + 1, NN]: fine labels, then a zero row
        self._group = group
        self._stage2 = plane_expander(board_size, input_planes, jit).stage2

    def _rows(self, parsed, field, row_bytes, valid):
        """A fixed-width column: uint8 [P, row_bytes], one row per position of the batch's records."""
        raw = tf.io.decode_raw(parsed[field][:, 0], tf.uint8, fixed_length=self._group * row_bytes)
        return tf.boolean_mask(tf.reshape(raw, [-1, row_bytes]), valid)

    def stage1(self, serialized: tf.Tensor) -> dict:
        """string [R] records -> per-position rows (P = the records' positions)."""
        parsed = tf.io.parse_example(serialized, self._spec)
        checks = [
            tf.debugging.assert_equal(
                parsed[schema.P_VERSION],
                tf.constant(self.version, tf.int64),
                message=f"position record field '{schema.P_VERSION}' is not {self.version}: rebuild the window "
                f"from the lake's games with `{schema.REBUILD_WINDOW}`",
            ),
            tf.debugging.assert_equal(
                parsed[schema.P_BOARD_SIZE],
                tf.constant(self.board_size, tf.int64),
                message=f"position record field '{schema.P_BOARD_SIZE}' is not {self.board_size}",
            ),
        ]
        with tf.control_dependencies(checks):
            count = tf.cast(parsed[schema.P_COUNT][:, 0], tf.int32)
        valid = tf.reshape(tf.range(self._group)[None, :] < count[:, None], [-1])
        positions = tf.reduce_sum(count)
        # targets: column by column, each column POSITION_GROUP long (SPEC.md).
        targets = tf.io.decode_raw(
            parsed[schema.P_TARGETS][:, 0], tf.uint8, fixed_length=schema.TARGET_BYTES * self._group
        )
        targets = tf.reshape(
            tf.transpose(tf.reshape(targets, [-1, schema.TARGET_BYTES, self._group]), [0, 2, 1]),
            [-1, schema.TARGET_BYTES],
        )
        targets = tf.boolean_mask(targets, valid)
        moves = self._rows(parsed, schema.P_MOVES, schema.HISTORY_MOVES * self.move_width, valid)
        moves = tf.cast(tf.reshape(moves, [-1, schema.HISTORY_MOVES, self.move_width]), tf.int32)
        if self.move_width == 2:  # uint16 little-endian
            moves = moves[..., :1] + 256 * moves[..., 1:]
        weights = tf.bitcast(tf.reshape(targets[:, 6:14], [-1, 4, 2]), tf.float16)  # little-endian hosts
        score = tf.bitcast(targets[:, 2:6], tf.float32)
        codes, fine = self._table_ownership(parsed, targets, self._fine_ownership(parsed, targets, positions))
        return {
            "board": self._rows(parsed, schema.P_BOARD, self.width, valid),
            "ownership_codes": codes,
            "moves": moves[..., 0],
            "captured": self._capture_bits(parsed, positions),
            "white": tf.cast(tf.bitwise.bitwise_and(targets[:, 0], schema.TARGET_FLAG_WHITE), tf.int32),
            "fine_ownership": fine,
            "value": tf.cast(tf.bitcast(targets[:, 1], tf.int8), tf.float32) / float(schema.ROOT_VALUE_SCALE),
            "score": score,
            "policy_values": self._dense_policy(parsed, positions),
            **{key: tf.cast(weights[:, k], tf.float32) for k, key in enumerate(HEAD_WEIGHT_KEYS)},
        }

    def _fine_ownership(self, parsed, targets, positions) -> tf.Tensor:
        """int8 [P, NN]: the fine (int8) ownership rows of the positions flagged fine, zeros elsewhere.

        A record's fine rows lie end to end in its ``ownership_fine`` bytes,
        in position order, so the batch's records joined are its fine rows
        in the order of the flagged positions.
        """
        fine = self._own_rows(targets)
        joined = tf.strings.reduce_join(parsed[schema.P_OWNERSHIP_FINE][:, 0])
        rows = tf.reshape(tf.io.decode_raw(joined, tf.int8), [-1, self.points])
        return tf.scatter_nd(tf.cast(tf.where(fine), tf.int32), rows, tf.stack([positions, self.points]))

    @staticmethod
    def _own_rows(targets) -> tf.Tensor:
        """bool [P]: flags bit 1, the position's ownership row lies in its record's ``ownership_fine``."""
        return tf.not_equal(tf.bitwise.bitwise_and(targets[:, 0], schema.TARGET_FLAG_OWN_OWNERSHIP), 0)

    def _table_ownership(self, parsed, targets, own) -> tuple[tf.Tensor, tf.Tensor]:
        """(uint8 [P, W] ternary codes, int8 [P, NN] fine rows) of every position.

        A position flagged own keeps its record's row (``own``, zero codes);
        every other one takes its game's row of the table: base-3 codes for
        an exact label, the int8 row for a fractional one (the other column
        zero).
        """
        game = tf.cast(parsed[schema.P_GAME].values, tf.int32)
        checks = [
            tf.debugging.assert_less(
                game,
                self._games,
                message=f"position record field '{schema.P_GAME}' is outside the window's game "
                f"table ({self._games} games)",
            ),
            tf.debugging.assert_non_negative(game, message=f"position record field '{schema.P_GAME}' is negative"),
        ]
        with tf.control_dependencies(checks):
            game = tf.identity(game)
        flagged = self._own_rows(targets)
        codes = tf.where(flagged[:, None], tf.zeros([], tf.uint8), tf.gather(self._table_codes, game))
        if self._fine_games == 0:  # every label exact (no random-playout average): nothing more to gather
            return codes, own
        slot = tf.where(flagged, tf.constant(self._fine_games, tf.int32), tf.gather(self._table_slot, game))
        return codes, own + tf.gather(self._table_fine, slot)

    @staticmethod
    def _entry_rows(counts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """(position of each entry, index of each position's first entry) from per-position counts."""
        counts = tf.cast(counts, tf.int32)
        starts = tf.cumsum(counts, exclusive=True)
        rows = tf.repeat(tf.range(tf.size(counts)), counts)
        return rows, starts

    def _capture_bits(self, parsed, positions) -> tf.Tensor:
        """uint8 [P, NN]: bit age-1 set where move t-age captured a stone."""
        rows, _ = self._entry_rows(parsed[schema.P_CAPTURE_COUNT].values)
        entry = tf.cast(parsed[schema.P_CAPTURES].values, tf.int32)
        bits = tf.bitwise.left_shift(1, entry // self.points)
        # Each (position, point, age) is captured at most once: the sum is the OR.
        mask = tf.math.unsorted_segment_sum(bits, rows * self.points + entry % self.points, positions * self.points)
        return tf.cast(tf.reshape(mask, [-1, self.points]), tf.uint8)

    def _dense_policy(self, parsed, positions) -> tf.Tensor:
        """uint16 [P, A]: the integer policy values, indices un-gap-coded (stage 2 normalizes).

        Kept as uint16 (each action appears once a position, values
        1..65535) so the rebatch between the stages copies half of int32's
        bytes.  A value outside 1..max is refused, naming the field.
        """
        rows, starts = self._entry_rows(parsed[schema.P_POLICY_COUNT].values)
        deltas = tf.cast(parsed[schema.P_POLICY_INDEX_DELTA].values, tf.int32)
        running = tf.cumsum(deltas)
        first = tf.gather(starts, rows)  # each entry's position's first entry
        index = running - tf.gather(running - deltas, first)
        value = parsed[schema.P_POLICY_VALUE].values
        field = f"position record field '{schema.P_POLICY_VALUE}'"
        checks = [
            tf.debugging.assert_less_equal(
                value,
                tf.constant(schema.POLICY_VALUE_MAX, tf.int64),
                message=f"{field} holds a value above {schema.POLICY_VALUE_MAX}",
            ),
            tf.debugging.assert_positive(value, message=f"{field} holds a value below 1"),
        ]
        with tf.control_dependencies(checks):
            value = tf.cast(value, tf.int32)
        dense = tf.math.unsorted_segment_sum(value, rows * self.actions + index, positions * self.actions)
        return tf.cast(tf.reshape(dense, [-1, self.actions]), tf.uint16)

    def decode_rows(self, rows: dict, symmetries: tf.Tensor) -> dict:
        """Stage 2: a batch of stage-1 rows and int32 [B] symmetry ids -> the training batch."""
        planes, ownership, policy = self._stage2(
            rows["board"],
            rows["ownership_codes"],
            rows["fine_ownership"],
            rows["moves"],
            rows["captured"],
            rows["white"],
            rows["policy_values"],
            symmetries,
        )
        batch = {
            "planes": planes,
            "policy": policy,
            "ownership": ownership,
            "value": rows["value"],
            "score": rows["score"],
        }
        for key in HEAD_WEIGHT_KEYS:
            batch[key] = rows[key]
        return batch

    def decode(self, serialized: tf.Tensor, symmetries: tf.Tensor) -> dict:
        """Both stages at once: string [R] records -> the batch of all their positions."""
        return self.decode_rows(self.stage1(serialized), symmetries)


class PlaneExpander:
    """Stage 2 for one board shape: stage-1 rows -> planes, ownership and policy (`stage2`).

    It holds only what the board size and the input width fix (neighbours,
    symmetry tables), never a window's data, so one instance per shape serves
    every window of a process (`plane_expander`) and its XLA cluster is
    compiled once: TensorFlow's compilation cache keeps every cluster it
    compiles for the life of the process (about 1 MB each), and a following
    trainer reads a new window every few minutes for weeks.
    """

    def __init__(self, board_size: int, input_planes: int, jit: bool):
        n = self.board_size = board_size
        self.input_planes = input_planes
        self.points = n * n
        self.actions = schema.num_actions(n)
        self.width = schema.trit_bytes(n)
        # Each point's 4 neighbours (off the board: index NN, a padding column).
        grid = np.arange(n * n).reshape(n, n)
        padded = np.pad(grid, 1, constant_values=n * n)
        self._neighbours = tf.constant(
            np.stack([padded[:-2, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:], padded[2:, 1:-1]], axis=-1)
            .reshape(n * n, 4)
            .astype(np.int32)
        )
        self._trits = tf.constant(position_records.trit_table().astype(np.int32))  # [256, 5]
        inverse = np.asarray(inverse_permutations(n), dtype=np.int32)
        if inverse.shape != (NUM_SYMMETRIES, self.actions):
            raise ValueError(f"format.symmetry tables for {n}x{n} have shape {inverse.shape}")
        self._inverse_actions = tf.constant(inverse)  # [8, A]: inverse[k, q] = the action k moves to q
        forward = np.asarray(symmetry_permutations(n), dtype=np.int32)
        no_move = np.full((NUM_SYMMETRIES, 1), self.actions, np.int32)  # N*N + 1 stays itself
        self._forward_moves = tf.constant(np.concatenate([forward, no_move], axis=1).reshape(-1))  # [8 * (A+1)]
        self._inverse_points = tf.constant(inverse[:, : self.points])
        self.stage2 = tf.function(self._expand, jit_compile=jit, autograph=False)

    def _colours(self, packed):
        """uint8 [B, W] base-3 bytes -> int32 [B, NN] colours (+1 Black, -1 White, 0)."""
        codes = tf.reshape(tf.gather(self._trits, tf.cast(packed, tf.int32)), [-1, self.width * schema.TRIT_POINTS])
        codes = codes[:, : self.points]
        return tf.where(codes == 1, 1, tf.where(codes == 2, -1, 0))

    def _expand(self, board, ownership_codes, fine_ownership, moves, captured, white, policy_values, symmetries):
        """The per-point work, XLA-compiled: symmetry first, then history boards and planes.

        The symmetry moves the inputs (board, capture bits and ownership: one
        gather of NN points each; moves: a lookup), so the planes come out
        in their final order and the 16 planes are never gathered: gathering
        the [B, NN, 16] planes instead cost ~4x this whole function on 19x19.

        The history is rebuilt on [B, NN] int32 arrays, from the side to
        move's view (+1 own stone, -1 opponent's): undo move t-1, t-2, ...
        in turn, and set bit OWN_STONES + k or OPPONENT_STONES + k of each
        point's *code* for the board at t-k, bit COLOUR_PLANE for the colour
        plane (format/planes.py's channels).  The 17 input channels are then
        one broadcast over [B, NN, 17]
        (``code & (1 << channel) != 0``, 2x faster than a right shift),
        which XLA writes in one vectorised pass.  Building 16 planes and
        stacking them on the last axis (XLA then picks among 17 operands per
        element) made this function ~1.6x slower on 19x19; the whole of
        stage 2 now costs ~8 ms of CPU per 1024 19x19 positions here.
        """
        nn = self.points
        to_play = 1 - 2 * white  # [B]: +1 Black, -1 White
        side = to_play[:, None]
        where_from = tf.gather(self._inverse_points, symmetries)  # [B, NN]
        state = tf.gather(self._colours(board), where_from, batch_dims=1) * side  # +1 own, -1 opponent, 0
        captured = tf.gather(tf.cast(captured, tf.int32), where_from, batch_dims=1)
        # Moves: a point goes where the symmetry sends it; PASS and "no move" stay.
        moved = tf.gather(self._forward_moves, symmetries[:, None] * (self.actions + 1) + moves)
        points = tf.range(nn)[None, :]
        colour_on = tf.cast(tf.equal(to_play, plane_layout.COLOUR_PLANE_SIDE), tf.int32)
        own_bit, opponent_bit = plane_layout.OWN_STONES, plane_layout.OPPONENT_STONES
        code = (
            tf.cast(tf.equal(state, 1), tf.int32) * (1 << own_bit)
            + tf.cast(tf.equal(state, -1), tf.int32) * (1 << opponent_bit)
            + colour_on[:, None] * (1 << plane_layout.COLOUR_PLANE)
        )
        if self.input_planes > plane_layout.BASIC_INPUT_PLANES:
            code += self._position_codes(state, captured, moved[:, 0])
        present = tf.ones_like(side)
        for age in range(1, schema.HISTORY_LENGTH):
            move = moved[:, age - 1 : age]  # [B, 1]
            present = present * tf.cast(tf.not_equal(move, nn + schema.NO_MOVE_OFFSET), tf.int32)
            # Move t-age was the opponent's for odd ages: its captures were our stones.
            restored = 1 if age % 2 == 1 else -1
            was_captured = tf.not_equal(tf.bitwise.bitwise_and(captured, 1 << (age - 1)), 0)
            state = tf.where(tf.equal(points, move), 0, tf.where(was_captured, restored, state))
            code += (
                tf.cast(tf.equal(state, 1), tf.int32) * (1 << (own_bit + age))
                + tf.cast(tf.equal(state, -1), tf.int32) * (1 << (opponent_bit + age))
            ) * present
        # Fine rows are zero in the ternary column, and ternary rows zero in the fine one.
        ownership = tf.cast(self._colours(ownership_codes), tf.float32) + tf.cast(fine_ownership, tf.float32) / float(
            schema.OWNERSHIP_SCALE
        )
        ownership = ownership * tf.cast(side, tf.float32)
        ownership = tf.gather(ownership, where_from, batch_dims=1)
        policy = tf.cast(
            tf.gather(policy_values, tf.gather(self._inverse_actions, symmetries), batch_dims=1), tf.float32
        )
        policy = tf.math.divide_no_nan(policy, tf.reduce_sum(policy, axis=1, keepdims=True))
        return self._planes(code), ownership, policy

    def _planes(self, code):
        """int32 [B, NN] codes -> float32 [B, N, N, C] input planes (C = input_planes <= 22 < 32 bits)."""
        channel_bits = tf.bitwise.left_shift(1, tf.range(self.input_planes))
        planes = tf.cast(tf.not_equal(tf.bitwise.bitwise_and(code[:, :, None], channel_bits), 0), tf.float32)
        return tf.reshape(planes, [-1, self.board_size, self.board_size, self.input_planes])

    def _chain_liberties(self, state, neighbour_state):
        """int32 [B, NN]: each stone's chain's liberties (0 on empty points), for boards [B, NN] in {-1, 0, 1}.

        Chains are found by label propagation: every stone starts with its
        own point as label and repeatedly takes the smallest label among its
        same-coloured neighbours, then its label's label (pointer jumping,
        which halves long chains each round), until nothing changes; each
        chain ends labelled with its smallest point, in a few rounds on 9x9.
        A chain's liberties are then the empty points next to one of its
        stones, each counted once: an empty point adds 1 to each distinct
        label among its (up to 4) neighbours.
        """
        nn = self.points
        none = nn  # the label of empty points and of the padding column
        stone = tf.not_equal(state, 0)
        joined = tf.logical_and(tf.equal(neighbour_state, state[:, :, None]), stone[:, :, None])  # [B, NN, 4]

        def neighbour_labels(label):
            return tf.gather(tf.pad(label, [[0, 0], [0, 1]], constant_values=none), self._neighbours, axis=1)

        def spread(label, _):
            smallest = tf.reduce_min(tf.where(joined, neighbour_labels(label), none), axis=2)
            step = tf.minimum(label, smallest)
            step = tf.gather(tf.pad(step, [[0, 0], [0, 1]], constant_values=none), step, batch_dims=1)
            return step, tf.reduce_any(tf.not_equal(step, label))

        start = tf.where(stone, tf.range(nn)[None, :], none)
        label, _ = tf.while_loop(
            lambda label, changed: changed, spread, (start, tf.constant(True)), maximum_iterations=nn
        )
        around = tf.where(tf.equal(state, 0)[:, :, None], neighbour_labels(label), none)  # [B, NN, 4]
        first, second, third, fourth = tf.unstack(around, axis=2)
        distinct = tf.stack(
            [
                first,
                tf.where(tf.equal(second, first), none, second),
                tf.where(tf.equal(third, first) | tf.equal(third, second), none, third),
                tf.where(tf.equal(fourth, first) | tf.equal(fourth, second) | tf.equal(fourth, third), none, fourth),
            ],
            axis=2,
        )
        batch = tf.shape(state)[0]
        rows = tf.range(batch)[:, None, None] * (nn + 1)
        per_label = tf.math.unsorted_segment_sum(tf.ones_like(distinct), rows + distinct, batch * (nn + 1))
        per_label = tf.reshape(per_label, [batch, nn + 1])
        return tf.where(stone, tf.gather(per_label, label, batch_dims=1), 0)

    def _position_codes(self, state, captured, last_move):
        """int32 [B, NN]: the bits of channels ON_BOARD .. LEGAL (format/planes.py) of the board at t.

        ``state`` is the board at t from the side to move (+1 own, -1
        opponent's), ``captured`` the capture bits (bit 0: taken by move
        t-1) and ``last_move`` [B] that move, all after the symmetry, which
        keeps neighbours neighbours.
        """
        nn = self.points
        # Off the board (the padding column NN): colour 2, no liberties.
        neighbour_state = tf.gather(tf.pad(state, [[0, 0], [0, 1]], constant_values=2), self._neighbours, axis=1)
        liberties = self._chain_liberties(state, neighbour_state)
        padded_liberties = tf.pad(liberties, [[0, 0], [0, 1]])
        stone = tf.not_equal(state, 0)
        neighbour_liberties = tf.gather(padded_liberties, self._neighbours, axis=1)
        # The ko recapture: move t-1 took exactly one of our stones, and its
        # stone stands alone with one liberty (the taken point).
        taken = tf.not_equal(tf.bitwise.bitwise_and(captured, 1), 0)
        placed = tf.minimum(last_move, nn)[:, None]  # PASS or no move -> the padding column

        def at_placed(values):
            return tf.gather(
                tf.pad(values, [[0, 0], [0, 1]] + [[0, 0]] * (len(values.shape) - 2)), placed, batch_dims=1
            )[:, 0]

        placed_alone = tf.reduce_all(tf.not_equal(at_placed(neighbour_state), -1), axis=1)
        ko = (
            (last_move < nn)
            & tf.equal(at_placed(state), -1)
            & placed_alone
            & tf.equal(tf.gather(padded_liberties, placed, batch_dims=1)[:, 0], 1)
            & tf.equal(tf.reduce_sum(tf.cast(taken, tf.int32), axis=1), 1)
        )
        banned = taken & ko[:, None]
        breathes = tf.reduce_any(
            tf.equal(neighbour_state, 0)
            | (tf.equal(neighbour_state, 1) & (neighbour_liberties >= 2))
            | (tf.equal(neighbour_state, -1) & tf.equal(neighbour_liberties, 1)),
            axis=2,
        )
        legal = tf.equal(state, 0) & breathes & tf.logical_not(banned)

        def bit(mask, channel):
            return tf.cast(mask, tf.int32) * (1 << channel)

        first = plane_layout.LIBERTIES_1
        return (
            (1 << plane_layout.ON_BOARD)
            + bit(stone & tf.equal(liberties, 1), first)
            + bit(stone & tf.equal(liberties, 2), first + 1)
            + bit(liberties >= 3, first + 2)
            + bit(legal, plane_layout.LEGAL)
        )


@functools.lru_cache(maxsize=None)
def plane_expander(board_size: int, input_planes: int, jit: bool) -> PlaneExpander:
    """The process's one `PlaneExpander` for this board shape (see its docstring for why one)."""
    return PlaneExpander(board_size, input_planes, jit)


def load_game_table(path: str, board_size: int):
    """A window's game table (format.game_table.GameTable) from a local path or URL tf reads.

    Read once per dataset; missing or damaged, it raises FormatError naming the file.
    """
    from format.game_table import MissingGameTable, decode_game_table

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        raise MissingGameTable(
            path,
            "is missing: a window's ownership labels and generations are its "
            "game table, kept beside its shards (the manifest's 'game_table')",
        ) from None
    return decode_game_table(data, path, board_size=board_size)


def shard_record_version(path: str) -> int:
    """The position-record version of a shard, read from its first record: the one this release
    reads, or FormatError naming the file (an older version: rebuild the window)."""
    for record in tf.data.TFRecordDataset(path, compression_type="GZIP").take(1):
        return position_records.decode_version(record.numpy(), path)
    raise ValueError(f"{path}: the shard holds no record")


def training_dataset(
    shard_paths: Sequence[str],
    *,
    board_size: int,
    batch_size: int,
    seed: int,
    skip_batches: int = 0,
    shuffle_buffer: int = 8192,
    augment: bool = True,
    repeat: bool = True,
    reader_parallelism: int = 4,
    record_version: int | None = None,
    game_table: str | None = None,
    input_planes: int = schema.BASIC_INPUT_PLANES,
) -> tf.data.Dataset:
    """Batches of decoded positions from GZIP shards, in a reproducible order.

    ``record_version`` (the manifest's) is read from the first shard when not
    given; a window's shards all hold one version (the job writes them
    together), and any but ``schema.POSITION_RECORD_VERSION`` is refused with
    FormatError naming the first shard.  The window's game table is read
    once: the file ``game_table`` (a path or URL), by default the one beside
    the shards (`format.layout.game_table_beside` of the first shard, which
    is where the lake keeps it and where a staged copy must put it).
    ``input_planes`` is the network's input width, 17 or 22 (format/planes.py).

    The order of batches depends only on ``shard_paths`` and ``seed`` (file
    order, shuffle and symmetries are all seeded, interleave is
    deterministic), so a resumed run passes ``skip_batches`` = steps already
    trained and sees exactly the batches it would have seen.  Skipping
    happens on serialized batches, before the costly decode.
    """
    if not shard_paths:
        raise ValueError("training_dataset needs at least one shard")
    if record_version is None:
        record_version = shard_record_version(shard_paths[0])
    problem = schema.position_record_version_problem(record_version)
    if problem:
        raise FormatError(shard_paths[0], schema.P_VERSION, problem)
    table = load_game_table(game_table or layout.game_table_beside(shard_paths[0]), board_size)
    decoder = GroupDecoder(board_size, table=table, input_planes=input_planes)
    return _group_dataset(
        shard_paths,
        decoder,
        batch_size=batch_size,
        seed=seed,
        skip_batches=skip_batches,
        shuffle_buffer=shuffle_buffer,
        augment=augment,
        repeat=repeat,
        reader_parallelism=reader_parallelism,
    )


def _shuffled_files(shard_paths, seed: int, repeat: bool, reader_parallelism: int):
    """(dataset of shard paths in a seeded order, repeated if asked; how many to read at once)."""
    files = tf.data.Dataset.from_tensor_slices(list(shard_paths))
    files = files.shuffle(len(shard_paths), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        files = files.repeat()
    return files, max(1, min(reader_parallelism, len(shard_paths)))


def _read_shuffled(files, cycle: int, *, per_element: int, shuffle_buffer: int, seed: int) -> tf.data.Dataset:
    """Records of ``cycle`` shards read at once, then shuffled with a buffer of ``shuffle_buffer``
    positions, ``per_element`` positions per element."""

    def read(path):
        return tf.data.TFRecordDataset(path, compression_type="GZIP", buffer_size=1 << 20)

    elements = files.interleave(read, cycle_length=cycle, block_length=1, num_parallel_calls=cycle, deterministic=True)
    if shuffle_buffer > per_element:
        elements = elements.shuffle(shuffle_buffer // per_element, seed=seed + 1, reshuffle_each_iteration=True)
    return elements


def _numbered_batches(elements, batch_size: int, skip_batches: int) -> tf.data.Dataset:
    """(batch number, batch) pairs of exactly ``batch_size`` positions, the first ``skip_batches`` left out
    (a resumed window continues where its checkpoint stopped)."""
    batches = elements.rebatch(batch_size, drop_remainder=True).enumerate()
    return batches.skip(skip_batches) if skip_batches else batches


def _symmetries(augment: bool, seed: int, batch_number, batch_size: int) -> tf.Tensor:
    """int32 [batch_size]: one random symmetry per example, seeded by (seed, batch number)."""
    if not augment:
        return tf.zeros([batch_size], tf.int32)
    return tf.random.stateless_uniform(
        [batch_size],
        seed=tf.stack([tf.cast(seed, tf.int64), batch_number]),
        minval=0,
        maxval=NUM_SYMMETRIES,
        dtype=tf.int32,
    )


def _group_dataset(
    shard_paths,
    decoder: GroupDecoder,
    *,
    batch_size,
    seed,
    skip_batches,
    shuffle_buffer,
    augment,
    repeat,
    reader_parallelism,
) -> tf.data.Dataset:
    """training_dataset's pipeline (module docstring, "Data flow")."""
    files, cycle = _shuffled_files(shard_paths, seed, repeat, reader_parallelism)
    # A record already holds 64 positions: no .batch() per reader.
    groups = _read_shuffled(files, cycle, per_element=schema.POSITION_GROUP, shuffle_buffer=shuffle_buffer, seed=seed)
    records_per_call = max(1, batch_size // schema.POSITION_GROUP)
    rows = groups.batch(records_per_call).map(decoder.stage1, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = _numbered_batches(rows, batch_size, skip_batches)

    def decode(batch_number, batch_rows):
        return decoder.decode_rows(batch_rows, _symmetries(augment, seed, batch_number, batch_size))

    return batches.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)

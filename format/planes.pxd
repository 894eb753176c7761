# cython: language_level=3
"""The input-plane layout of format/planes.py, for compiled builders.

Cython cannot read Python constants at compile time, so the layout's free
numbers are stated here once more and everything else is derived as in
planes.py; tests/format/test_planes.py asserts both files agree and checks the
compiled builders (engine/board.pyx's features, pipeline/_history.pyx)
against `format.planes.input_planes` bit for bit.  Compile-time constants,
so the hot loops pay nothing for them.
"""

cdef enum:
    HISTORY_LENGTH = 8                              # schema.HISTORY_LENGTH: positions t .. t-7
    OWN_STONES = 0                                  # channel of the side to move's stones at t
    OPPONENT_STONES = OWN_STONES + HISTORY_LENGTH   # channel of the opponent's stones at t
    COLOUR_PLANE = OPPONENT_STONES + HISTORY_LENGTH  # 1 when COLOUR_PLANE_SIDE moves
    PACKED_PLANES = 2 * HISTORY_LENGTH              # channels a position record stores
    BASIC_INPUT_PLANES = COLOUR_PLANE + 1           # AlphaGo Zero's 17
    ON_BOARD = COLOUR_PLANE + 1                     # all ones
    LIBERTIES_1 = ON_BOARD + 1                      # stones of chains with 1 liberty; +1: 2; +2: 3 or more
    LEGAL = LIBERTIES_1 + 3                         # basic-rules legal points of the side to move
    INPUT_PLANES = LEGAL + 1                        # channels of the full layout (22)
    COLOUR_PLANE_SIDE = 1                           # schema.BLACK

"""A naive pure-Python Go board: the floor the Cython engine is measured against.

Same rules and playout policy as engine/board.pyx (suicide illegal,
positional superko, captures, the eye rule of random playouts), written the
obvious way: a flat list of colours, a flood fill to find a chain and its
liberties every time one is needed, and a set of board tuples for superko.
Points are flat indices ``row * N + col``; PASS = N * N.
"""

import random

EMPTY, BLACK, WHITE = 0, 1, -1


class NaiveBoard:
    def __init__(self, size, max_moves=0):
        self.size = size
        self.points = [EMPTY] * (size * size)
        self.to_play = BLACK
        self.passes = 0
        self.move_number = 0
        self.max_moves = max_moves or 3 * size * size
        self.history = {tuple(self.points)}
        self.neighbours = [self._neighbours(p) for p in range(size * size)]
        self.diagonals = [self._diagonals(p) for p in range(size * size)]

    def _neighbours(self, p):
        n = self.size
        r, c = divmod(p, n)
        return [
            (r + dr) * n + c + dc
            for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
            if 0 <= r + dr < n and 0 <= c + dc < n
        ]

    def _diagonals(self, p):
        n = self.size
        r, c = divmod(p, n)
        return [
            (r + dr) * n + c + dc
            for dr, dc in ((-1, -1), (-1, 1), (1, -1), (1, 1))
            if 0 <= r + dr < n and 0 <= c + dc < n
        ]

    @property
    def is_over(self):
        return self.passes >= 2 or self.move_number >= self.max_moves

    def chain_and_liberties(self, points, p):
        colour = points[p]
        chain, libs, frontier = {p}, set(), [p]
        while frontier:
            q = frontier.pop()
            for n in self.neighbours[q]:
                if points[n] == EMPTY:
                    libs.add(n)
                elif points[n] == colour and n not in chain:
                    chain.add(n)
                    frontier.append(n)
        return chain, libs

    def result_of(self, p):
        """The points after the side to move plays p, or None if illegal."""
        if self.points[p] != EMPTY:
            return None
        colour = self.to_play
        points = list(self.points)
        points[p] = colour
        for n in self.neighbours[p]:
            if points[n] == -colour:
                chain, libs = self.chain_and_liberties(points, n)
                if not libs:
                    for q in chain:
                        points[q] = EMPTY
        if not self.chain_and_liberties(points, p)[1]:
            return None  # suicide
        if tuple(points) in self.history:
            return None  # positional superko
        return points

    def is_own_eye(self, p, colour):
        if any(self.points[n] != colour for n in self.neighbours[p]):
            return False
        bad = sum(self.points[d] == -colour for d in self.diagonals[p])
        on_edge = 1 if len(self.diagonals[p]) < 4 else 0
        return bad + on_edge < 2

    def play(self, move, points=None):
        if move == self.size * self.size:
            self.passes += 1
        else:
            self.points = points if points is not None else self.result_of(move)
            self.history.add(tuple(self.points))
            self.passes = 0
        self.to_play = -self.to_play
        self.move_number += 1

    def random_playout(self, rng):
        moves = 0
        while not self.is_over:
            candidates = [p for p, c in enumerate(self.points) if c == EMPTY]
            rng.shuffle(candidates)
            for p in candidates:
                if self.is_own_eye(p, self.to_play):
                    continue
                points = self.result_of(p)
                if points is not None:
                    self.play(p, points)
                    break
            else:
                self.play(self.size * self.size)
            moves += 1
        return moves

    def area_score(self, komi):
        total = 0
        seen = set()
        for p, c in enumerate(self.points):
            if c != EMPTY:
                total += c
            elif p not in seen:
                region, reach, frontier = {p}, set(), [p]
                while frontier:
                    q = frontier.pop()
                    for n in self.neighbours[q]:
                        if self.points[n] == EMPTY and n not in region:
                            region.add(n)
                            frontier.append(n)
                        elif self.points[n] != EMPTY:
                            reach.add(self.points[n])
                seen |= region
                if len(reach) == 1:
                    total += len(region) * reach.pop()
        return total - komi


def naive_playout(size, seed):
    """One playout on an empty board; returns (moves, area score)."""
    board = NaiveBoard(size)
    moves = board.random_playout(random.Random(seed))
    return moves, board.area_score(7.5)

"""The Go engine, in Cython: rules, tree search and the batched search driver.

Everything here computes per move, with the GIL released in the hot loops;
Python above it (the self-play worker, the arena's players, the Beam job's
endstate labels) only orchestrates.  Data flows upward:

* `engine.board` (board.pyx/.pxd): a position under Tromp-Taylor rules:
  legality, captures, superko, scoring, input features, random playouts.
* `engine.search` (search.pyx/.pxd): one game's Monte Carlo tree (PUCT,
  Gumbel root, noise); it never touches a board.
* `engine.driver` (driver.pyx/.pxd): many games' searches at once; gathers
  leaves into one network batch and applies the evaluations.
* `engine.playouts`: evaluators built on random playouts (generation 0's
  player, ownership labels without a model) and the judge of dead stones
  and seki (GTP's final_status_list).
* `engine.move_choice` (Python): how a finished search becomes a move and
  when a side resigns, the one rule of the worker and the arena's players.
* `engine/rng.pxd`: the seeded generator every kernel draws from.

The engine imports only `format` (the input-plane layout, format/planes.pxd)
and knows nothing of networks, files or processes.
"""

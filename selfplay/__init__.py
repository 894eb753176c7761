"""The self-play worker: ``python -m selfplay.worker`` (see selfplay/worker.py).

`selfplay.worker` plays many games at once on the engine's batched search
(`engine.driver`) with an evaluator from `inference`, keeps finished games in
its local spool (`selfplay.spool`) until their chunk is in the lake, and
picks up each newly published model.  `selfplay.config` is its settings;
`engine.move_choice` is how a search becomes a move and when a side
resigns, shared with the arena's players.
"""

"""The arena: players, matches, GTP and the rating ladder.

Where a model meets an opponent rather than itself.  `arena.player` holds
the players (random, the project's search, an external GTP engine such as
GNU Go through `arena.gtp_client`); `arena.match` plays two of them
(``python -m arena.match``); `arena.gtp` is a GTP engine for GUIs
(``python -m arena.gtp``; its commands in `arena.gtp_engine` and
`arena.gtp_referee`, its game in `arena.gtp_game`, its analysis reports in
`arena.gtp_analysis`); `arena.ladder` rates published generations
against fixed anchors with `arena.elo`, and `arena.ladder_report` writes
its report.  The stored anchor games are in ``arena/anchor_games/``.
"""

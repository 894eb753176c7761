"""The shuffle job: ``python -m pipeline.shuffle``, an Apache Beam pipeline (see pipeline/shuffle.py).

Data flows: the lake's chunks --`pipeline.window_plan` (which chunks)--> Beam
(`pipeline.transforms`: decode, deduplicate, endstate labels from
`pipeline.labels`, positions from `pipeline.positions`, shuffle) --> the
window's shards, game table and manifest.  `pipeline.follow` runs it again
whenever enough new games arrived (``--follow``); `pipeline.retention`
deletes windows the trainer has finished; `pipeline.lake_view` is what
the job and its follower both read of the lake; `pipeline.config` is its
settings; `pipeline.beam_worker` the local runner's worker process.
"""

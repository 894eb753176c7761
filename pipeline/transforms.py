"""The shuffle job's Beam transforms: stages, elements and the memory bound.

    bundles: (bundle, [(chunk index, ChunkRef)])     # the driver's window plan
      | LabelAndScatter   read + verify + decode each chunk once, label, build positions;
                          outputs .skipped, .games, .game_ids, .parts (early positions),
                          .pieces (shard pieces), .stats
      games | FindDuplicateGames       -> sorted int64 instances to drop
      game_ids | BuildGameTable        -> the window's games (WindowGames), indexed by positions
      parts | CapOpenings              per partition: drop duplicates, cap over-represented keys,
                                       merge their targets -> more shard pieces
      pieces | WriteShards             per shard: read pieces, drop duplicates, permute, write
      small outputs | WriteManifest    the game table file, then MANIFEST.json

Each stage is a composite PTransform.  A chunk is read whole and decoded by
`format.codec.iter_chunk` in one pass (a damaged one is skipped and reported).  Elements stay coarse
(a bundle is about bundle_positions positions, a piece one bundle's positions for one shard), so
peak memory is one bundle, partition or shard.  Random choices are seeded by (seed, stage,
element), so retries rewrite identical pieces; shards, game table and manifest are create-only.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import tempfile
import time
from typing import Sequence

import apache_beam as beam
import numpy as np

from format import codec, layout, schema
from format.tfrecord import compress_gzip, frame_records
from format.window_manifest import WINDOW_MANIFEST_VERSION, parse_window_manifest, window_manifest_bytes
from pipeline import labels as L
from pipeline import positions as P
from pipeline.config import ShuffleConfig

log = logging.getLogger(__name__)

SKIPPED, GAMES, GAME_IDS, PARTS, PIECES, STATS = "skipped", "games", "game_ids", "parts", "pieces", "stats"


@dataclasses.dataclass(frozen=True)
class JobContext:
    """Everything a worker needs, decided once by the driver (picklable)."""

    root_url: str
    config: ShuffleConfig
    board_size: int
    komi: float
    target_generation: int
    attempt: str
    seed: int
    num_shards: int
    num_partitions: int
    model_generation: int | None
    """Published model used for play-outs, or None for random playouts."""
    plan_summary: tuple = ()
    """(key, value) pairs for the manifest (window rule, estimates)."""
    model_cache_dir: str | None = None
    """A local folder the driver made for this job's model copies and removes when the job ends, or
    None (a remote runner: each worker machine keeps a private temporary cache)."""

    @property
    def window_dir(self) -> str:
        return layout.window_dir(self.target_generation)

    @property
    def tmp_dir(self) -> str:
        return layout.job_tmp_dir("shuffle", self.target_generation, self.attempt)

    def shard_name(self, shard: int) -> str:
        return layout.shard_name(self.attempt, shard, self.num_shards)

    @property
    def game_table_name(self) -> str:
        return layout.game_table_name(self.attempt)

    def rng(self, stage: int, element: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, stage, element])


class _LakeDoFn(beam.DoFn):
    """A DoFn of this job: holds the JobContext and opens the lake once per worker (setup)."""

    def __init__(self, context: JobContext):
        self.context = context

    def setup(self):
        from cloud.storage import open_storage

        self.storage = open_storage(self.context.root_url, retry=self.context.config.storage_retry)


def _sum_counters(dicts) -> dict:
    total: dict = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


# ---------------------------------------------------------------------------
# Phase 1: chunks -> labelled positions -> temp pieces
# ---------------------------------------------------------------------------


def chunk_problem(items, board_size: int, komi: float) -> str | None:
    """Why a decoded chunk must be skipped, or None if every game is usable."""
    for item in items:
        if isinstance(item, codec.FormatError):
            return str(item)
        if item.board_size != board_size:
            return f"foreign: game {item.game_id} is {item.board_size}x{item.board_size}, run.json says {board_size}"
        if item.komi != komi:
            return f"foreign: game {item.game_id} has komi {item.komi}, run.json says {komi}"
    if not items:
        return "empty chunk"
    return None


class LabelBundleFn(_LakeDoFn):
    """One bundle of chunks -> temp pieces plus small reports (tagged outputs).

    Input: ``(bundle index, [(chunk index, ChunkRef), ...])``.  Main output:
    none; see the module docstring for the tags.
    """

    def setup(self):
        super().setup()
        self.policy_fn = None
        if self.context.model_generation is not None:
            from inference.model_files import load_model

            self.policy_fn = load_model(self.storage, self.context.model_generation, cache_dir=self.model_cache())

    def model_cache(self) -> str | None:
        """This worker's model cache: a folder of its own (two workers never race to create one generation
        folder) inside the job's, which the driver removes when the job ends.  Not a private temporary
        cache of the worker's own: the local runner's workers end with os._exit (pipeline.beam_worker),
        or are killed, so nothing of theirs runs at exit, and each run left one model copy per worker."""
        if self.context.model_cache_dir is None:
            return None
        return tempfile.mkdtemp(prefix="worker-", dir=self.context.model_cache_dir)

    def process(self, element):
        bundle, chunks = element
        ctx, cfg = self.context, self.context.config
        started = time.monotonic()
        games, instances, stats = [], [], L.empty_stats()
        # --sample-games: a random share of the records is decoded at all (a stream of its own, stage 6).
        share, draw = cfg.game_share, ctx.rng(6, bundle)
        keep = None if share >= 1 else (lambda: bool(draw.random() < share))
        stats.update(
            chunks_read=0,
            chunks_skipped=0,
            games_read=0,
            positions_read=0,
            value_only_rows_dropped=0,
            after_resignation_rows_dropped=0,
        )
        for chunk_index, ref in chunks:
            url = self.storage.url(ref.path)
            try:
                items = list(codec.iter_chunk(self.storage.read(ref.path), url, keep))
            except Exception as exc:  # unreadable object: cost only this chunk
                items = [codec.FormatError(url, None, f"cannot read ({exc})")]
            if not items and keep is not None:
                continue  # every record of the chunk sampled out
            problem = chunk_problem(items, ctx.board_size, ctx.komi)
            if problem is not None:
                stats["chunks_skipped"] += 1
                yield beam.pvalue.TaggedOutput(SKIPPED, {"chunk": ref.path, "reason": problem})
                continue
            stats["chunks_read"] += 1
            for g, game in enumerate(items):
                games.append(game)
                instances.append(chunk_index << P.INSTANCE_SHIFT | g)
        if not games:
            yield beam.pvalue.TaggedOutput(STATS, stats)
            return
        rng = ctx.rng(1, bundle)
        endstates = L.label_games(
            games,
            policy_fn=self.policy_fn,
            random_playouts=cfg.random_playouts,
            model_playout_moves=cfg.model_playout_moves,
            temperature=cfg.model_temperature,
            playout_weight=cfg.playout_ownership_weight,
            rng=rng,
            stats=stats,
            accelerated_weight=cfg.accelerated_label_weight,
        )
        batch = P.games_positions(games, endstates, instances, cfg.dedup_max_move)
        stats["games_read"] += len(games)
        stats["positions_read"] += len(batch) if batch is not None else 0
        if batch is not None:
            # A stream of its own (stage 4), so keeping every row draws nothing and the
            # shards are what they were before the setting existed.
            batch, dropped = P.thin_after_resignation_rows(
                batch, P.after_resignation(games), cfg.after_resignation_rows, ctx.rng(5, bundle)
            )
            stats["after_resignation_rows_dropped"] += dropped
            batch, dropped = P.thin_value_only_rows(batch, cfg.value_only_rows, ctx.rng(4, bundle))
            stats["value_only_rows_dropped"] += dropped
        yield beam.pvalue.TaggedOutput(
            GAME_IDS,
            (
                np.asarray(instances, np.int64),
                [g.game_id for g in games],
                np.array([g.generation for g in games], np.int64),
                P.game_label_rows(endstates),
            ),
        )
        yield beam.pvalue.TaggedOutput(
            GAMES, (np.asarray(instances, np.int64), np.array([P.game_digest(g) for g in games], dtype="S16"))
        )
        if batch is None:  # only games without positions
            yield beam.pvalue.TaggedOutput(STATS, stats)
            return
        early = batch.key != 0
        if early.any():
            early_batch = batch.take(np.flatnonzero(early))
            parts = P.dedup_partition(early_batch.key, ctx.num_partitions)
            for part in np.unique(parts).tolist():
                path = f"{ctx.tmp_dir}/parts/{part:05d}/b{bundle:06d}.npz"
                self.storage.write_replace(
                    path, early_batch.take(np.flatnonzero(parts == part)).to_bytes(), durable=False
                )
                yield beam.pvalue.TaggedOutput(PARTS, (part, path))
        late = batch.take(np.flatnonzero(~early))
        for shard, piece in P.split_for_shards(late, cfg.row_reuse, ctx.num_shards, rng).items():
            path = f"{ctx.tmp_dir}/shards/{shard:05d}/b{bundle:06d}.npz"
            self.storage.write_replace(path, piece.to_bytes(), durable=False)
            yield beam.pvalue.TaggedOutput(PIECES, (shard, path))
        yield beam.pvalue.TaggedOutput(STATS, stats)
        log.info(
            "bundle %d: %d chunks, %d games, %d positions in %.1fs",
            bundle,
            len(chunks),
            len(games),
            len(batch),
            time.monotonic() - started,
        )


class LabelAndScatter(beam.PTransform):
    """Bundles -> tagged outputs skipped/games/game_ids/parts/pieces/stats (phase 1)."""

    def __init__(self, context: JobContext):
        super().__init__()
        self.context = context

    def expand(self, bundles):
        # No Reshuffle here: beam.Create already redistributes its elements,
        # and each extra one is a stage boundary (a barrier) on every runner.
        return bundles | "Label and scatter" >> beam.ParDo(LabelBundleFn(self.context)).with_outputs(
            SKIPPED, GAMES, GAME_IDS, PARTS, PIECES, STATS
        )


# ---------------------------------------------------------------------------
# Exact duplicate games
# ---------------------------------------------------------------------------


def duplicate_instances(instances: np.ndarray, digests: np.ndarray) -> np.ndarray:
    """Sorted instances to drop: every copy of a game but the lowest instance."""
    if not len(instances):
        return np.zeros(0, np.int64)
    order = np.lexsort((instances, digests))
    d = digests[order]
    repeat = np.r_[False, d[1:] == d[:-1]]
    return np.sort(instances[order][repeat])


class _GatherPerBundle(beam.CombineFn):
    """Gathers one element per bundle into a list; subclasses turn the list into the result."""

    def create_accumulator(self):
        return []

    def add_input(self, acc, element):
        acc.append(element)
        return acc

    def merge_accumulators(self, accs):
        return [x for acc in accs for x in acc]


class _ConcatGames(_GatherPerBundle):
    """Gathers (instances, digests) arrays; 24 bytes per game."""

    def extract_output(self, acc):
        if not acc:
            return np.zeros(0, np.int64)
        return duplicate_instances(np.concatenate([a for a, _ in acc]), np.concatenate([d for _, d in acc]))


class FindDuplicateGames(beam.PTransform):
    """(instances, digests) per bundle -> one sorted int64 array of instances to drop."""

    def expand(self, games):
        return games | "Duplicates" >> beam.CombineGlobally(_ConcatGames())


@dataclasses.dataclass
class WindowGames:
    """The window's games: every game read, sorted by instance.

    A position stores its game as an index into this order; the manifest
    lists the ids in it (``games``) and the game table file holds each
    game's ownership label and generation in it (``table``), so a shard
    keeps an integer per position, not the id string, the label and the
    generation.
    """

    instances: np.ndarray
    """int64[G], ascending."""
    game_ids: list
    table: codec.GameTable | None
    """Row g: game ``instances[g]``'s label and generation; None when the window read no game."""


class _ConcatGameIds(_GatherPerBundle):
    """Gathers (instances, game ids, generations, label rows) per bundle into one WindowGames."""

    def extract_output(self, acc):
        if not acc:
            return WindowGames(np.zeros(0, np.int64), [], None)
        instances = np.concatenate([part[0] for part in acc])
        ids = [game_id for part in acc for game_id in part[1]]
        order = np.argsort(instances, kind="stable")
        rows = np.concatenate([part[3] for part in acc])[order]
        table = codec.GameTable(
            board_size=math.isqrt(rows.shape[1]),
            generation=np.concatenate([part[2] for part in acc])[order],
            ownership=rows,
        )
        return WindowGames(instances[order], [ids[k] for k in order.tolist()], table)


class BuildGameTable(beam.PTransform):
    """(instances, game ids, generations, label rows) per bundle -> one WindowGames (a singleton side input)."""

    def expand(self, game_ids):
        return game_ids | "Game table" >> beam.CombineGlobally(_ConcatGameIds())


def _drop_mask(instance: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    return np.isin(instance, dropped, assume_unique=False)


# ---------------------------------------------------------------------------
# Capping over-represented positions
# ---------------------------------------------------------------------------


class CapPartitionFn(_LakeDoFn):
    """(partition, [piece paths]) -> shard pieces of the capped positions."""

    def process(self, element, dropped):
        part, paths = element
        ctx, cfg = self.context, self.context.config
        paths = sorted(set(paths))
        batch = P.concat(P.PositionBatch.from_bytes(self.storage.read(p)) for p in paths)
        stats = {"duplicate_game_positions_removed": 0, "capped_keys": 0, "capped_positions_removed": 0}
        if batch is not None:
            duplicate = _drop_mask(batch.instance, dropped)
            stats["duplicate_game_positions_removed"] = int(duplicate.sum())
            batch = batch.take(np.flatnonzero(~duplicate))
            capped, cap_stats = P.cap_positions(batch, cfg.position_cap)
            stats.update(cap_stats)
            rng = ctx.rng(2, part)
            for shard, piece in P.split_for_shards(capped, cfg.row_reuse, ctx.num_shards, rng).items():
                path = f"{ctx.tmp_dir}/shards/{shard:05d}/c{part:05d}.npz"
                self.storage.write_replace(path, piece.to_bytes(), durable=False)
                yield beam.pvalue.TaggedOutput(PIECES, (shard, path))
        yield beam.pvalue.TaggedOutput(STATS, stats)
        for p in paths:
            self.storage.delete(p)


class CapOpenings(beam.PTransform):
    """(partition, path) pieces -> tagged pieces/stats; ``dropped`` is a singleton side input."""

    def __init__(self, context: JobContext, dropped):
        super().__init__()
        self.context, self.dropped = context, dropped

    def expand(self, parts):
        return (
            parts
            | "Group by partition" >> beam.GroupByKey()
            | "Cap and merge"
            >> beam.ParDo(CapPartitionFn(self.context), dropped=beam.pvalue.AsSingleton(self.dropped)).with_outputs(
                PIECES, STATS
            )
        )


# ---------------------------------------------------------------------------
# Phase 2: one shard at a time
# ---------------------------------------------------------------------------


def count_records(data: bytes, source: str, table: codec.GameTable | None) -> tuple[int, dict]:
    """(records, {generation: count}) of a written shard (retry path; ``table``: the window's game table)."""
    shard = codec.read_shard(data, source, table=table)
    gens: dict = {}
    for record in shard:
        gens[record.generation] = gens.get(record.generation, 0) + 1
    return len(shard), gens


class WriteShardFn(_LakeDoFn):
    """(shard, [piece paths]) -> the shard file; outputs its manifest entry."""

    def process(self, element, dropped, game_table):
        shard, paths = element
        ctx = self.context
        name = ctx.shard_name(shard)
        path = layout.shard_path(ctx.target_generation, name)
        paths = sorted(set(paths))
        if self.storage.exists(path):  # a retry after the shard was written
            count, gens = count_records(self.storage.read(path), self.storage.url(path), game_table.table)
            yield {"name": name, "positions": count, "generations": gens, "duplicate_game_records_removed": 0}
            return
        pieces = [P.ShardPiece.from_bytes(self.storage.read(p)) for p in paths]
        instance = np.concatenate([piece.instance for piece in pieces])
        generation = np.concatenate([piece.generation for piece in pieces])
        keep = np.flatnonzero(~_drop_mask(instance, dropped))
        order = keep[ctx.rng(3, shard).permutation(len(keep))]
        # The positions in order, as records of the version the manifest names (schema.POSITION_RECORD_VERSION).
        batch = P.concat([piece.batch for piece in pieces])
        frames = b""
        if batch is not None and len(order):
            batch = batch.take(order)
            compact = batch.compact(P.game_table_index(game_table.instances, batch.instance), game_table.table)
            frames = frame_records(codec.encode_groups(compact))
        self.storage.write_new(path, compress_gzip(frames, ctx.config.shard_gzip_level))
        gens, counts = np.unique(generation[order], return_counts=True)
        yield {
            "name": name,
            "positions": int(len(order)),
            "generations": {int(g): int(c) for g, c in zip(gens, counts)},
            "duplicate_game_records_removed": int(len(instance) - len(keep)),
        }
        for p in paths:
            self.storage.delete(p)
        log.info("shard %s: %d records", name, len(order))


class WriteShards(beam.PTransform):
    """(shard, path) pieces -> one manifest entry (dict) per written shard.

    ``dropped`` (instances of duplicate games) and ``game_table`` (WindowGames) are singleton side inputs.
    """

    def __init__(self, context: JobContext, dropped, game_table):
        super().__init__()
        self.context, self.dropped, self.game_table = context, dropped, game_table

    def expand(self, pieces):
        return (
            pieces
            | "Group by shard" >> beam.GroupByKey()
            | "Permute and write"
            >> beam.ParDo(
                WriteShardFn(self.context),
                dropped=beam.pvalue.AsSingleton(self.dropped),
                game_table=beam.pvalue.AsSingleton(self.game_table),
            )
        )


# ---------------------------------------------------------------------------
# Manifest
# ---------------------------------------------------------------------------


class _ManifestParts(beam.CombineFn):
    """Combines ('shard'|'stats'|'skipped'|'dropped', payload) into one summary."""

    def create_accumulator(self):
        return {"shards": [], "stats": {}, "skipped": [], "duplicate_games": 0}

    def add_input(self, acc, element):
        kind, payload = element
        if kind == "shard":
            acc["shards"].append(payload)
        elif kind == "stats":
            acc["stats"] = _sum_counters([acc["stats"], payload])
        elif kind == "skipped":
            acc["skipped"].append(payload)
        else:
            acc["duplicate_games"] += int(len(payload))
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            out["shards"] += acc["shards"]
            out["skipped"] += acc["skipped"]
            out["stats"] = _sum_counters([out["stats"], acc["stats"]])
            out["duplicate_games"] += acc["duplicate_games"]
        return out

    def extract_output(self, acc):
        return acc


def build_manifest(context: JobContext, summary: dict, game_ids: Sequence[str] = ()) -> dict:
    """The MANIFEST.json document (format/SPEC.md "Windows"); ``game_ids``: the ids of the window's games."""
    shards = sorted(summary["shards"], key=lambda s: s["name"])
    stats = summary["stats"]
    removed_dup = stats.get("duplicate_game_positions_removed", 0) + sum(
        s["duplicate_game_records_removed"] for s in shards
    )
    generations: dict = {}
    for s in shards:
        for g, c in s["generations"].items():
            generations[str(g)] = generations.get(str(g), 0) + c
    label_keys = set(L.LABEL_STATS)
    return {
        "version": WINDOW_MANIFEST_VERSION,
        "record_version": schema.POSITION_RECORD_VERSION,
        "target_generation": context.target_generation,
        "board_size": context.board_size,
        "komi": context.komi,
        "attempt": context.attempt,
        "shards": [s["name"] for s in shards],
        "shard_positions": {s["name"]: s["positions"] for s in shards},
        "positions": int(sum(s["positions"] for s in shards)),
        "generations": dict(sorted(generations.items(), key=lambda kv: int(kv[0]))),
        "window": dict(context.plan_summary),
        "input": {
            k: stats.get(k, 0)
            for k in (
                "chunks_read",
                "chunks_skipped",
                "games_read",
                "positions_read",
                "value_only_rows_dropped",
                "after_resignation_rows_dropped",
            )
        },
        "chunks_skipped": sorted(summary["skipped"], key=lambda s: s["chunk"]),
        "dedup": {
            "duplicate_games": summary["duplicate_games"],
            "duplicate_game_records_removed": int(removed_dup),
            "position_cap": context.config.position_cap,
            "cap_max_move": context.config.dedup_max_move,
            "capped_keys": stats.get("capped_keys", 0),
            "capped_positions_removed": stats.get("capped_positions_removed", 0),
        },
        "labels": {k: v for k, v in stats.items() if k in label_keys},
        "label_model_generation": context.model_generation,
        "reuse": context.config.reuse,
        "seed": context.seed,
        "games": list(game_ids),
        "game_table": context.game_table_name,
    }


class WriteManifestFn(_LakeDoFn):
    """The single combined summary -> the game table file, then MANIFEST.json; both create-only."""

    def process(self, summary, game_table):
        from cloud.storage import AlreadyExists

        storage = self.storage
        manifest = build_manifest(self.context, summary, game_table.game_ids)
        if manifest["positions"] == 0:
            # Every chunk was skipped or empty: a window without positions is no
            # window.  No manifest; the driver reports it in one line.
            yield manifest
            return
        self.write_game_table(game_table.table)
        path = layout.window_manifest(self.context.target_generation)
        try:
            storage.write_new(path, window_manifest_bytes(manifest))
        except AlreadyExists:
            # A retried bundle of this attempt wrote it already; anyone else's
            # manifest (a racing follower that took over an expired claim) wins.
            existing = parse_window_manifest(storage.read(path), path, storage.url(path))
            if existing.attempt != self.context.attempt:
                raise RuntimeError(
                    f"{storage.url(path)} was written by attempt {existing.attempt} "
                    f"while attempt {self.context.attempt} ran"
                ) from None
        yield manifest

    def write_game_table(self, table: codec.GameTable) -> None:
        """The window's game table, before the manifest that names it (the manifest is the commit point)."""
        from cloud.storage import AlreadyExists

        path = layout.game_table_path(self.context.target_generation, self.context.game_table_name)
        data = codec.encode_game_table(table)
        try:
            self.storage.write_new(path, data)
        except AlreadyExists:
            # A retried manifest step of this attempt: the table (only this
            # attempt writes its name) must be the one this step would write.
            if self.storage.read(path) != data:
                raise RuntimeError(f"{self.storage.url(path)} exists with other contents") from None


class ShuffleWindow(beam.PTransform):
    """The whole job: bundles -> shards and MANIFEST.json; outputs the manifest dict."""

    def __init__(self, context: JobContext):
        super().__init__()
        self.context = context

    def expand(self, bundles):
        ctx = self.context
        scattered = bundles | "Phase 1" >> LabelAndScatter(ctx)
        dropped = scattered[GAMES] | "Find duplicate games" >> FindDuplicateGames()
        game_table = scattered[GAME_IDS] | "Build the game table" >> BuildGameTable()
        capped = scattered[PARTS] | "Cap openings" >> CapOpenings(ctx, dropped)
        shards = (
            (scattered[PIECES], capped[PIECES])
            | "All pieces" >> beam.Flatten()
            | "Phase 2" >> WriteShards(ctx, dropped, game_table)
        )
        parts = (
            shards | "Tag shards" >> beam.Map(lambda s: ("shard", s)),
            scattered[STATS] | "Tag bundle stats" >> beam.Map(lambda s: ("stats", s)),
            capped[STATS] | "Tag cap stats" >> beam.Map(lambda s: ("stats", s)),
            scattered[SKIPPED] | "Tag skipped" >> beam.Map(lambda s: ("skipped", s)),
            dropped | "Tag duplicates" >> beam.Map(lambda d: ("dropped", d)),
        )
        return (
            parts
            | "Manifest parts" >> beam.Flatten()
            | "Summarize" >> beam.CombineGlobally(_ManifestParts())
            | "Write manifest" >> beam.ParDo(WriteManifestFn(ctx), game_table=beam.pvalue.AsSingleton(game_table))
        )

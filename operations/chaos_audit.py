"""The chaos audit: after a cluster run, the lake checked against everything the roles reported.

`operations.cluster` runs every role as a child and, with ``--check`` or
``--chaos-kill-every``, calls `audit_run` once all have stopped.  Inputs: the
lake itself, and the launcher's ``Observer`` (every event each role wrote:
games finished, chunks uploaded, models loaded) and ``Role`` records (name,
kind, spool folder).  The audit decodes every chunk (`scan_chunks`, as
``format.inspect verify`` does) and counts what must be zero for a run that
loses nothing (`ZERO_LOSS_KEYS`: games reported finished but in no chunk,
games in two chunks, chunks that do not verify, LATEST moving backwards),
plus what explains a figure (games still only in a spool, identical move
sequences, temporary pieces, how fresh each worker's model was).  Its report
is the JSON line that bench/cluster.py reads.
"""

from __future__ import annotations

import hashlib
import os

from format import layout
from format.registry import latest_generation
from pipeline.lake_view import claim_attempt, live_claim
from selfplay.spool import entries_dir as spool_entries_dir

FRESH_MODEL_SECONDS = 60.0
"""A worker must play the newest model within this long of its publication."""


def scan_chunks(storage) -> dict:
    """Decode every chunk (format.codec.iter_chunk, as ``format.inspect verify`` does).

    Returns the bad chunks, where each game id lives, each game's move
    sequence digest, and the totals.
    """
    from format.codec import FormatError, iter_chunk

    bad: dict[str, str] = {}
    where: dict[str, list[str]] = {}
    by_moves: dict[bytes, list[str]] = {}
    games = positions = 0
    paths = [i.path for i in storage.list(layout.games_prefix()) if layout.parse_chunk_path(i.path) is not None]
    for path in sorted(paths):
        url = storage.url(path)
        try:
            data = storage.read(path)
        except Exception as exc:  # noqa: BLE001 - an unreadable chunk is a verify failure
            bad[url] = f"unreadable: {exc}"
            continue
        for item in iter_chunk(data, url):
            if isinstance(item, FormatError):
                bad[url] = str(item)
                continue
            games += 1
            positions += item.num_positions
            where.setdefault(item.game_id, []).append(path)
            digest = hashlib.sha256(item.moves.astype("<i2").tobytes()).digest()
            by_moves.setdefault(digest, []).append(item.game_id)
    return {
        "chunks": len(paths),
        "bad": bad,
        "where": where,
        "by_moves": by_moves,
        "games": games,
        "positions": positions,
    }


def _in_spool(event: dict, spool_dir: str) -> bool:
    """Whether the finished game's entry (its ``game_finished`` event's ``spool_entry``, a name in the
    spool's games folder) is still on the worker's disk: the spool keeps an entry until its chunk is in
    the lake (selfplay.spool)."""
    entry = str(event.get("spool_entry") or "")
    if not entry or os.path.basename(entry) != entry:
        return False
    return os.path.exists(os.path.join(spool_entries_dir(spool_dir), entry))


def _temporary_pieces(storage) -> tuple[list[str], list[str]]:
    """(the in-flight attempt's tmp folders, every other tmp folder) under tmp/.

    A window being built when the run stopped (or whose builder was just
    killed, its claim not yet expired) keeps its pieces until a follower
    finishes or takes over that window; those belong to the attempt named by
    the window's claim.  Anything else is a leftover.
    """
    current: list[str] = []
    leftovers: list[str] = []
    for folder in sorted({"/".join(i.path.split("/")[:2]) for i in storage.list(layout.tmp_prefix())}):
        parsed = layout.parse_job_tmp_dir(folder)
        claim = None
        if parsed is not None and not storage.exists(layout.window_manifest(parsed[1])):
            claim = live_claim(storage, parsed[1])  # damaged or absent: the pieces are a leftover
        in_flight = parsed is not None and claim is not None and claim_attempt(claim) == parsed[2]
        (current if in_flight else leftovers).append(folder)
    return current, leftovers


def audit_run(storage, observer, roles: list, *, wall_seconds: float, stopped_wall: float, kills_by_kind: dict) -> dict:
    """Verify the lake against what the roles reported; the final JSON report.

    Zero-loss keys (all must be 0): games_lost (finished games in no chunk and
    in no spool), games_duplicated (extra copies of a game id across chunks),
    chunk_verify_failures, latest_regressions.
    """
    scan = scan_chunks(storage)
    spool_of = {r.name: r.spec.spool_dir for r in roles}
    finished: dict[str, dict] = {}
    finished_by: dict[str, str] = {}
    for name, events in observer.events.items():
        for e in events:
            if e["role"] == "worker" and e["event"] == "game_finished":
                finished[e["game_id"]] = e
                finished_by[e["game_id"]] = name
    lost = [g for g in finished if g not in scan["where"] and not _in_spool(finished[g], spool_of[finished_by[g]])]
    in_spool_only = [g for g in finished if g not in scan["where"] and g not in lost]
    duplicated = sum(len(paths) - 1 for paths in scan["where"].values() if len(paths) > 1)
    identical = sum(len(set(ids)) - 1 for ids in scan["by_moves"].values() if len(set(ids)) > 1)

    # Generations: the trainer's published events (in order, once each) and the lake.
    published = [int(e["generation"]) for e in observer.events.get("trainer", []) if e["event"] == "published"]
    in_order = all(a < b for a, b in zip(published, published[1:]))
    lake_generations = sorted(
        {
            g
            for g in (
                layout.parse_generation(i.path.split("/")[1])
                for i in storage.list(layout.models_prefix())
                if i.path.endswith("/" + layout.MANIFEST)
            )
            if g is not None
        }
    )
    latest = latest_generation(storage) or 0

    # Freshness: each worker alive at the end must have played the newest model
    # within FRESH_MODEL_SECONDS of its publication.
    published_at = [
        e["time"]
        for e in observer.events.get("trainer", [])
        if e["event"] == "published" and int(e["generation"]) == latest
    ]
    published_at += [t for t, g in observer.latest_changes if g == latest]
    fresh = {}
    if latest and published_at:
        t0 = min(published_at)
        for role in roles:
            if role.kind != "worker":
                continue
            times = [
                e["time"]
                for e in observer.events[role.name]
                if e["event"] in ("model_loaded", "progress", "started")
                and int(e.get("generation", -1)) >= latest
                and e["time"] >= t0 - 1
            ]
            if times:
                fresh[role.name] = round(max(0.0, min(times) - t0), 1)
            elif stopped_wall - t0 >= FRESH_MODEL_SECONDS:
                fresh[role.name] = None  # never picked it up in time
            else:
                fresh[role.name] = "pending"  # the run ended before the 60 s were up
    stale = sum(1 for v in fresh.values() if v is None or (isinstance(v, float) and v > FRESH_MODEL_SECONDS))

    tmp_current, tmp = _temporary_pieces(storage)
    return {
        "kills": sum(kills_by_kind.values()),
        "kills_by_role": dict(kills_by_kind),
        "restarts": {r.name: r.restarts for r in roles},
        "games_finished": len(finished),
        "games_lost": len(lost),
        "games_lost_ids": lost[:10],
        "games_in_spool_only": len(in_spool_only),
        "games_duplicated": duplicated,
        "games_identical_moves": identical,
        "games_in_lake": scan["games"],
        "positions_in_lake": scan["positions"],
        "chunks": scan["chunks"],
        "chunk_verify_failures": len(scan["bad"]),
        "bad_chunks": dict(list(scan["bad"].items())[:5]),
        # The trainer trains only the newest window, so generation numbers may
        # skip (windows 1-3 superseded by 4): count what was published.
        "generations": len(lake_generations),
        "latest": latest,
        "generations_in_lake": lake_generations,
        "published_events": published,
        "published_in_order_once": in_order
        and sorted(set(published)) == published
        and set(published) <= set(lake_generations),
        "latest_regressions": observer.latest_regressions,
        "latest_samples": observer.latest_samples,
        "worker_model_lag_s": fresh,
        "stale_workers": stale,
        "tmp_leftovers": tmp,
        "tmp_current_attempt": tmp_current,
        "bad_event_lines": observer.bad_events,
        "positions_per_s": round(scan["positions"] / max(wall_seconds, 1e-9), 2),
        "wall_s": round(wall_seconds, 1),
    }


ZERO_LOSS_KEYS = ("games_lost", "games_duplicated", "chunk_verify_failures", "latest_regressions")

"""The ladder's report: ratings table, per-generation lake figures and PNG plots.

Data flows: the `arena.elo.Fit` of the ladder's distinct games (and a second
fit under the other prior, for the sensitivity column) plus the lake ->
figures per generation -> files under ``ROOT/report/`` (derived views,
replaced on every run).  From the lake: ``models/<gen>/MANIFEST.json`` (the
publication time ``metadata.created_unix`` and the window's last
``metadata.training_metrics``: head losses and ``occupied_policy_mass``, the
policy's mass on occupied, so illegal, points) and ``games/<gen>/`` chunks
(games and positions per chunk, cached by path in
``report/ladder/chunk-counts.json`` since chunks never change; the run's
start is the earliest chunk's time, from its name).

Terms, for generation G: *hours* = its publication time minus the run's
start; *games* and *positions* = the self-play games (and positions) of
every generation before G, the data its training window could draw from.

Output: ``ratings.txt`` (the table), ``ratings.json`` (an infinite estimate
or interval end is ``null``; ``estimate`` and ``interval_text`` hold the
table's texts such as ``412`` or ``>= 140``; ``stored_anchor_games`` and
``closing_matches`` say which stored and closing-match games were folded
in), and with plots ``rating-vs-hours.png``, ``rating-vs-games.png``,
``rating-vs-positions.png`` (95% intervals; an open-ended estimate as a
triangle at its bound; anchors as dashed lines; closing players as
crosses), ``training-losses.png`` and ``illegal-move-mass.png``.
"""

from __future__ import annotations

import io
import json
import math
import re
from typing import Sequence

import numpy as np

from arena import elo
from cloud.base import NotFound, TooLarge
from format import codec, lake_json, layout
from format.documents import MAX_DOCUMENT_BYTES, MAX_DOCUMENT_NUMBER, too_large
from format.registry import RegistryError, read_manifest
from format.tfrecord import MAX_DECOMPRESSED_BYTES


def generation_name(generation: int) -> str:
    """The ladder's name of a published generation: ``gen:G``."""
    return f"gen:{generation}"


def parse_generation_name(name: str) -> int | None:
    """G for ``gen:G``; None for an anchor (and for a closing player)."""
    match = re.fullmatch(r"gen:(\d+)", name)
    return int(match[1]) if match else None


def closing_player_name(generation: int, visits: int) -> str:
    """The ladder's name of generation G's network at V visits in the loop's closing match: ``gen:G@V``."""
    return f"gen:{generation}@{visits}"


def parse_closing_player_name(name: str) -> tuple[int, int] | None:
    """(G, V) for ``gen:G@V``; None for any other player."""
    match = re.fullmatch(r"gen:(\d+)@(\d+)", name)
    return (int(match[1]), int(match[2])) if match else None


def closing_player(name: str) -> tuple[int, int]:
    """(G, V) of a closing match's player ``gen:G@V`` (ValueError for any other name)."""
    parsed = parse_closing_player_name(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a closing match's player (gen:G@V)")
    return parsed


def _generation_of(name: str) -> int | None:
    """The generation whose network a player is (``gen:G`` or ``gen:G@V``); None for an anchor."""
    closing = parse_closing_player_name(name)
    return closing[0] if closing else parse_generation_name(name)


LOSS_NAMES = ("loss", "policy_loss", "value_loss", "ownership_loss", "score_loss")
MASS_NAME = "occupied_policy_mass"


# --------------------------------------------------------------------------
# lake figures
# --------------------------------------------------------------------------

MAX_CHUNK_BYTES = MAX_DECOMPRESSED_BYTES
"""The largest chunk counted: a chunk expands to at most this (SPEC.md, size bounds), and its records
compress, so a larger one is damaged (named, left out, never read whole)."""


def list_chunks(storage) -> list:
    """The lake's chunks as listed (`cloud.base.ObjectInfo`: path and size), other names passed by."""
    return [info for info in storage.list(layout.games_prefix()) if layout.parse_chunk_path(info.path) is not None]


def chunk_counts(
    storage, *, save: bool = True, problems: list[str] | None = None, listed: list | None = None
) -> dict[str, list[int]]:
    """{chunk path: [games, positions]} of every chunk, reading only chunks not cached yet.

    ``save``: write the counts of newly read chunks back to the cache; a reader that must
    not write to the lake (`arena.run_page`) passes False and still uses what is cached.
    The cache and the chunks are read within their bounds: a damaged cache is counted
    again, a chunk past MAX_CHUNK_BYTES is left out; ``problems`` (when given) names each.
    ``listed``: `list_chunks` when the caller has listed them already."""
    problems = [] if problems is None else problems
    cache_path = layout.ladder_chunk_counts()
    try:
        cached = lake_json.parse(storage.read(cache_path, max_bytes=MAX_DOCUMENT_BYTES), MAX_DOCUMENT_BYTES)
    except NotFound:
        cached = {}
    except TooLarge as exc:
        problems.append(f"{exc}; its chunks are counted again")
        cached = {}
    except lake_json.NotADocument as exc:
        problems.append(f"{storage.url(cache_path)}: {exc}; its chunks are counted again")
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    counts, changed = {}, False
    for info in list_chunks(storage) if listed is None else listed:
        if _counts_entry(cached.get(info.path)):
            counts[info.path] = cached[info.path]
            continue
        try:
            data = read_chunk_bytes(storage, info)
        except TooLarge as exc:
            problems.append(f"{exc}; not counted")
            continue
        games = positions = 0
        for item in codec.iter_chunk(data, storage.url(info.path)):
            if isinstance(item, codec.GameRecord):  # a bad record costs only itself
                games += 1
                positions += item.num_positions
        counts[info.path] = [games, positions]
        changed = True
    if changed and save:
        storage.write_replace(cache_path, json.dumps(counts, sort_keys=True).encode())
    return counts


def read_chunk_bytes(storage, info) -> bytes:
    """The bytes of the listed chunk ``info``; TooLarge naming it when its listed size is past
    MAX_CHUNK_BYTES (nothing read) or it holds more than that size (read no further).

    The read is bounded by the listed size, not by MAX_CHUNK_BYTES: a local read allocates its bound
    up front, and chunks are written once, so a real one never grows."""
    url = storage.url(info.path)
    if info.size > MAX_CHUNK_BYTES:
        raise TooLarge(f"{url} is larger than {MAX_CHUNK_BYTES:,} bytes, more than any chunk holds; not read", url=url)
    try:
        return storage.read(info.path, max_bytes=info.size)
    except TooLarge:
        raise TooLarge(
            f"{url} grew past its listed {info.size:,} bytes while being read; not read further", url=url
        ) from None


def _counts_entry(entry) -> bool:
    """Whether a cache entry is ``[games, positions]`` as a chunk can hold them; any other (a damaged or
    doctored cache) is counted again from the chunk, never trusted."""
    return (
        isinstance(entry, list)
        and len(entry) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= MAX_DOCUMENT_NUMBER for n in entry)
    )


def generation_figures(
    storage, generations: Sequence[int], counts: dict[str, list[int]] | None = None
) -> dict[int, dict]:
    """Per generation: hours, games, positions (module docstring) and training metrics.

    ``counts``: `chunk_counts` when the caller has them already (default: read them here)."""
    counts = chunk_counts(storage) if counts is None else counts
    names = {path: name for path in counts if (name := layout.parse_chunk_path(path)) is not None}
    start_ms = min((name.time_ms for name in names.values()), default=None)
    figures = {}
    for generation in generations:
        try:
            metadata = read_manifest(storage, generation).metadata
        except RegistryError:
            metadata = {}
        created = metadata.get("created_unix")
        before = [counts[p] for p, name in names.items() if name.generation < generation]
        figures[generation] = {
            "hours": (created - start_ms / 1000.0) / 3600.0
            if isinstance(created, (int, float)) and start_ms is not None
            else None,
            "games": sum(c[0] for c in before),
            "positions": sum(c[1] for c in before),
            "training_metrics": metadata.get("training_metrics") or {},
        }
    return figures


# --------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------


def _position(rating: elo.Rating) -> float:
    """Where a rating sits for sorting and plotting: its estimate, else its bound (NaN: none)."""
    if rating.finite:
        return rating.elo
    if rating.elo > 0:
        return rating.low if math.isfinite(rating.low) else math.nan
    if rating.elo < 0:
        return rating.high if math.isfinite(rating.high) else math.nan
    return math.nan


def _strongest_first(fit: elo.Fit) -> list[elo.Rating]:
    """Ratings by estimate or bound, highest first; those with neither last."""

    def key(rating: elo.Rating):
        position = _position(rating)
        return (math.isnan(position), 0.0 if math.isnan(position) else -position, rating.player)

    return sorted(fit.ratings.values(), key=key)


def prior_sensitivity(fit: elo.Fit, comparison: elo.Fit) -> tuple[float, str | None, list[str]]:
    """(largest |change| of a finite estimate between the two fits, whose, players finite in only one)."""
    largest, whose, only_one = 0.0, None, []
    for name, rating in fit.ratings.items():
        other = comparison.ratings.get(name)
        if other is None:
            continue
        if rating.finite and other.finite:
            if abs(other.elo - rating.elo) > largest:
                largest, whose = abs(other.elo - rating.elo), name
        elif rating.finite != other.finite:
            only_one.append(name)
    return largest, whose, sorted(only_one)


def ratings_table(
    fit: elo.Fit,
    figures: dict[int, dict],
    conditions: str,
    *,
    comparison: elo.Fit | None = None,
    distinct: int | None = None,
    duplicates: int = 0,
    stored: dict | None = None,
    closing: Sequence[dict] = (),
) -> str:
    """The printed table: one row per rated player, strongest first, then what the numbers mean.

    ``stored``: the stored anchor games (``folder``, ``held``, ``in_fit``), None when not used;
    ``closing``: the closing matches folded in (`arena.ladder.ClosingMatch.summary`).
    """
    other = f"{comparison.prior_draws:g} draws" if comparison is not None else ""
    lines = [
        f"Elo ({conditions}): {fit.method_text()}",
        f"anchor: {fit.anchor_reason or fit.anchor}",
        f"{'player':<14} {'Elo':>8} {'95% interval':>17} {other:>9} {'games':>6} {'hours':>7} "
        f"{'sp games':>9} {'positions':>10}",
    ]
    for rating in _strongest_first(fit):
        generation = _generation_of(rating.player)
        figure = figures.get(generation, {}) if generation is not None else {}
        hours = figure.get("hours")
        compared = comparison.ratings.get(rating.player) if comparison is not None else None
        lines.append(
            f"{rating.player:<14} {rating.estimate_text():>8} {rating.interval_text():>17} "
            f"{compared.estimate_text() if compared is not None else '':>9} "
            f"{rating.games:>6} {'' if hours is None else f'{hours:.2f}':>7} "
            f"{figure.get('games', ''):>9} {figure.get('positions', ''):>10}"
        )
    if any(not r.finite for r in fit.ratings.values()):
        lines.append(
            ">= x / <= x: no finite estimate (the player won / lost every game linking it to "
            f"{fit.anchor}, directly or through others); x is its 95% interval's end.  ?: its games say "
            f"nothing about its gap to {fit.anchor}"
        )
    if comparison is not None:
        largest, whose, only_one = prior_sensitivity(fit, comparison)
        text = (
            f"prior sensitivity: with {comparison.prior_draws:g} instead of {fit.prior_draws:g} virtual draws "
            "per pairing "
        )
        text += (
            f"the largest change of a finite estimate is {largest:.0f} Elo ({whose})"
            if whose
            else "no player has a finite estimate under both"
        )
        if only_one:
            text += f"; finite under only one of the two: {', '.join(only_one)}"
        lines.append(text)
    for match in closing:
        generation, visits = closing_player(match["player"])
        lines.append(
            f"{match['player']}: generation {generation}'s network at {visits} visits a move in the "
            f"loop's closing match ({match['source']}), {match['games']} games against {match['opponent']}"
            + ("" if match["per_game"] else " (no per-game results kept: every game counted as distinct)")
        )
    if distinct is not None:
        parts = []
        if stored is not None:
            parts.append(f"{stored['in_fit']} stored anchor games")
        if closing:
            parts.append(f"{sum(m['distinct'] for m in closing)} closing-match games")
        lines.append(
            f"{distinct} distinct games in the fit"
            + (f" ({', '.join(parts)})" if parts else "")
            + f"; {duplicates} repeated games (same colours, moves and result as an earlier one) "
            "counted once"
        )
    if stored is not None:
        lines.append(
            f"stored anchor games: {stored['held']} for these conditions in {stored['folder']}"
            + ("" if stored["held"] else " (none: every anchor game is played in this lake)")
        )
    if fit.unrated:
        lines.append(f"not connected to {fit.anchor} by any game (unrated): {', '.join(fit.unrated)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def rating_plot(fit: elo.Fit, figures: dict[int, dict], axis: str, label: str) -> bytes:
    """Generations' Elo (with 95% intervals) against ``axis`` ('hours', 'games' or 'positions')."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(8, 5))
    points = [
        (figures[g][axis], fit.ratings[generation_name(g)])
        for g in sorted(figures)
        if generation_name(g) in fit.ratings
        and figures[g][axis] is not None
        and not math.isnan(_position(fit.ratings[generation_name(g)]))
    ]
    closing = [
        (figures[c[0]][axis], r)
        for r in fit.ratings.values()
        for c in [parse_closing_player_name(r.player)]
        if c and c[0] in figures and figures[c[0]][axis] is not None and not math.isnan(_position(r))
    ]
    estimated = [(x, r) for x, r in points if r.finite]
    if estimated:
        xs = np.array([x for x, _ in estimated], float)
        ys = np.array([r.elo for _, r in estimated])
        # A finite estimate has a finite interval (arena.elo): both ends are drawn.
        errors = np.array([[r.elo - r.low for _, r in estimated], [r.high - r.elo for _, r in estimated]])
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label="generations (95% interval)")
    for marker, sign, text in (("^", 1, "at least (no finite estimate)"), ("v", -1, "at most (no finite estimate)")):
        bounded = [(x, r) for x, r in points if not r.finite and np.sign(r.elo) == sign]
        if bounded:
            ax.scatter([x for x, _ in bounded], [_position(r) for _, r in bounded], marker=marker, label=text)
    if closing:
        ax.scatter(
            [x for x, _ in closing],
            [_position(r) for _, r in closing],
            marker="x",
            color="black",
            label="the loop's closing match (gen:G@visits; a bound if no estimate)",
        )
    for x, rating in points + closing:
        ax.annotate(
            rating.player[len("gen:") :], (x, _position(rating)), textcoords="offset points", xytext=(4, 4), fontsize=8
        )
    if points or closing:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no rated generation yet", transform=ax.transAxes, ha="center")
    for rating in fit.ratings.values():
        if _generation_of(rating.player) is None and rating.finite:
            ax.axhline(rating.elo, linestyle="--", linewidth=0.8, color="grey")
            ax.annotate(
                rating.player,
                (0.0, rating.elo),
                xycoords=("axes fraction", "data"),
                fontsize=8,
                color="grey",
                va="bottom",
            )
    ax.set_xlabel(label)
    ax.set_ylabel(f"Elo ({fit.anchor} = 0)")
    ax.set_title(f"Rating against {label}")
    ax.grid(alpha=0.3)
    data = _png(figure)
    plt.close(figure)
    return data


def metrics_plot(figures: dict[int, dict], names: Sequence[str], title: str, ylabel: str) -> bytes:
    """Training metrics ``names`` per generation (from the model manifests)."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(8, 5))
    drawn = False
    for name in names:
        points = [(g, figures[g]["training_metrics"].get(name)) for g in sorted(figures)]
        points = [(g, v) for g, v in points if isinstance(v, (int, float)) and math.isfinite(v)]
        if points:
            ax.plot([g for g, _ in points], [v for _, v in points], marker="o", label=name)
            drawn = True
    if drawn:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no training metrics in the model manifests", transform=ax.transAxes, ha="center")
    ax.set_xlabel("generation")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    data = _png(figure)
    plt.close(figure)
    return data


PLOTS = {
    "rating-vs-hours.png": ("hours", "hours since the first self-play chunk"),
    "rating-vs-games.png": ("games", "self-play games before the generation"),
    "rating-vs-positions.png": ("positions", "self-play positions before the generation"),
}


def read_ratings_document(storage) -> dict | None:
    """The document `write_report` last wrote to ``report/ratings.json``; None when the ladder has not
    written one.  ValueError names the file when it is too large for a lake document, not JSON, or
    not an object with a ``ratings`` object (a derived view: rerunning the ladder rewrites it)."""
    path = layout.report_path("ratings.json")
    url = storage.url(path)
    try:
        data = storage.read(path, max_bytes=MAX_DOCUMENT_BYTES)
    except NotFound:
        return None
    except TooLarge:
        raise ValueError(f"{url}: {too_large(MAX_DOCUMENT_BYTES)}") from None
    try:
        document = lake_json.parse(data, MAX_DOCUMENT_BYTES)
    except lake_json.NotADocument as exc:
        raise ValueError(f"{url}: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("ratings"), dict):
        raise ValueError(f"{url}: not an object with a 'ratings' object")
    return document


def _number(value: float) -> float | None:
    """JSON's stand-in for an infinite or undefined Elo: null."""
    return float(value) if math.isfinite(value) else None


def write_report(
    storage,
    fit: elo.Fit,
    games,
    conditions: str,
    generations: Sequence[int],
    *,
    plots: bool = True,
    played: int = 0,
    comparison: elo.Fit | None = None,
    distinct: int | None = None,
    duplicates: int = 0,
    stored: dict | None = None,
    closing: Sequence[dict] = (),
) -> dict:
    """Write ratings.txt, ratings.json and the plots; returns the JSON document (with ``table``).

    ``comparison``: the same games fitted under the other prior (the sensitivity column);
    ``distinct`` / ``duplicates``: the games the fit counted, and the repeats it dropped;
    ``stored`` and ``closing``: as for `ratings_table`.
    """
    figures = generation_figures(storage, sorted(set(generations) | {closing_player(m["player"])[0] for m in closing}))
    table = ratings_table(
        fit,
        figures,
        conditions,
        comparison=comparison,
        distinct=distinct,
        duplicates=duplicates,
        stored=stored,
        closing=closing,
    )
    written = []
    if plots:
        for name, (axis, label) in PLOTS.items():
            storage.write_replace(layout.report_path(name), rating_plot(fit, figures, axis, label))
            written.append(name)
        storage.write_replace(
            layout.report_path("training-losses.png"),
            metrics_plot(figures, LOSS_NAMES, "Training losses (each window's last report)", "loss"),
        )
        storage.write_replace(
            layout.report_path("illegal-move-mass.png"),
            metrics_plot(figures, (MASS_NAME,), "Policy mass on occupied points (illegal moves)", "softmax mass"),
        )
        written += ["training-losses.png", "illegal-move-mass.png"]
    games_of_conditions = sum(1 for g in games if g.conditions == conditions)
    largest, whose, only_one = prior_sensitivity(fit, comparison) if comparison is not None else (None, None, [])
    document = {
        "conditions": conditions,
        "anchor": fit.anchor,
        "anchor_reason": fit.anchor_reason or fit.anchor,
        "unrated": list(fit.unrated),
        "method": fit.method_text(),
        "prior_draws": fit.prior_draws,
        "games_in_fit": games_of_conditions if distinct is None else distinct,
        "duplicate_games_dropped": duplicates,
        "games_played_now": played,
        "interval": fit.interval,
        "ratings": {
            r.player: {
                "elo": _number(r.elo),
                "low": _number(r.low),
                "high": _number(r.high),
                "estimate": r.estimate_text(),
                "interval_text": r.interval_text(),
                "games": r.games,
                **(
                    {"elo_under_compared_prior": _number(comparison.ratings[r.player].elo)}
                    if comparison is not None and r.player in comparison.ratings
                    else {}
                ),
            }
            for r in fit.ratings.values()
        },
        "prior_sensitivity": None
        if comparison is None
        else {
            "compared_prior_draws": comparison.prior_draws,
            "largest_change": largest,
            "player": whose,
            "finite_under_one_prior_only": only_one,
        },
        "stored_anchor_games": stored,
        "closing_matches": list(closing),
        "generations": {str(g): figures[g] for g in generations},
        "plots": [layout.report_path(name) for name in written],
    }
    storage.write_replace(layout.report_path("ratings.txt"), (table + "\n").encode())
    storage.write_replace(layout.report_path("ratings.json"), json.dumps(document, indent=1, sort_keys=True).encode())
    return {**document, "table": table}

"""The ladder's report: ratings table, per-generation lake figures and PNG plots.

Input: the `selfplay.elo.Fit` of the ladder's games, and the lake itself:

* ``models/<gen>/MANIFEST.json``: when each generation was published
  (``metadata.created_unix``) and, from trainers that record it, the
  window's last training report (``metadata.training_metrics``: the head
  losses and ``occupied_policy_mass``, the policy's mass on occupied points,
  i.e. on moves the input planes show are illegal);
* ``games/<gen>/*.tfrecord.zst``: games and positions per chunk (read once;
  chunks never change, so the counts are cached in
  ``report/ladder/chunk-counts.json`` by chunk path) and the run's start
  (the earliest chunk's time, from its name).

For generation G: *hours* = its publication time minus the run's start;
*games* and *positions* = the self-play games (and their positions) of every
generation before G, i.e. the data its training window could draw from.

Output (all under ``ROOT/report/``, replaced on every run: derived views):
``ratings.txt`` (the printed table), ``ratings.json``, and with plots on
``rating-vs-hours.png``, ``rating-vs-games.png``, ``rating-vs-positions.png``
(generations with 95% intervals; anchors as dashed lines),
``training-losses.png`` and ``illegal-move-mass.png`` (per generation).
"""
from __future__ import annotations

import io
import json
import math
import re
from typing import Sequence

import numpy as np

from cloud.base import NotFound
from format import codec, layout
from format.registry import RegistryError, read_manifest
from selfplay import elo

def generation_name(generation: int) -> str:
    """The ladder's name of a published generation: ``gen:G``."""
    return f"gen:{generation}"


def parse_generation_name(name: str) -> int | None:
    """G for ``gen:G``; None for an anchor."""
    match = re.fullmatch(r"gen:(\d+)", name)
    return int(match[1]) if match else None


LOSS_NAMES = ("loss", "policy_loss", "value_loss", "ownership_loss", "score_loss")
MASS_NAME = "occupied_policy_mass"


# --------------------------------------------------------------------------
# lake figures
# --------------------------------------------------------------------------

def chunk_counts(storage) -> dict[str, list[int]]:
    """{chunk path: [games, positions]} of every chunk, reading only chunks not cached yet."""
    cache_path = layout.ladder_chunk_counts()
    try:
        cached = json.loads(storage.read(cache_path))
    except (NotFound, ValueError, UnicodeDecodeError):
        cached = {}
    counts, changed = {}, False
    for info in storage.list(layout.games_prefix()):
        if layout.parse_chunk_path(info.path) is None:
            continue
        if isinstance(cached.get(info.path), list):
            counts[info.path] = cached[info.path]
            continue
        games = positions = 0
        for item in codec.iter_chunk(storage.read(info.path), storage.url(info.path)):
            if isinstance(item, codec.GameRecord):   # a bad record costs only itself
                games += 1
                positions += item.num_positions
        counts[info.path] = [games, positions]
        changed = True
    if changed:
        storage.write_replace(cache_path, json.dumps(counts, sort_keys=True).encode())
    return counts


def generation_figures(storage, generations: Sequence[int]) -> dict[int, dict]:
    """Per generation: hours, games, positions (module docstring) and training metrics."""
    counts = chunk_counts(storage)
    names = {path: layout.parse_chunk_path(path) for path in counts}
    start_ms = min((name.time_ms for name in names.values()), default=None)
    figures = {}
    for generation in generations:
        try:
            metadata = read_manifest(storage, generation)["metadata"]
        except RegistryError:
            metadata = {}
        created = metadata.get("created_unix")
        before = [counts[p] for p, name in names.items() if name.generation < generation]
        figures[generation] = {
            "hours": (created - start_ms / 1000.0) / 3600.0
            if isinstance(created, (int, float)) and start_ms is not None else None,
            "games": sum(c[0] for c in before),
            "positions": sum(c[1] for c in before),
            "training_metrics": metadata.get("training_metrics") or {},
        }
    return figures


# --------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------

def ratings_table(fit: elo.Fit, figures: dict[int, dict], conditions: str) -> str:
    """The printed table: one row per rated player, strongest first."""
    lines = [f"Elo ({conditions}); random = 0; 95% interval from the fit's Hessian",
             f"{'player':<14} {'Elo':>7} {'95% interval':>17} {'games':>6} {'hours':>7} "
             f"{'sp games':>9} {'positions':>10}"]
    for rating in sorted(fit.ratings.values(), key=lambda r: -r.elo):
        generation = parse_generation_name(rating.player)
        figure = figures.get(generation, {}) if generation is not None else {}
        hours = figure.get("hours")
        lines.append(
            f"{rating.player:<14} {rating.elo:>7.0f} {f'[{rating.low:.0f}, {rating.high:.0f}]':>17} "
            f"{rating.games:>6} {'' if hours is None else f'{hours:.2f}':>7} "
            f"{figure.get('games', ''):>9} {figure.get('positions', ''):>10}")
    if fit.unrated:
        lines.append(f"not connected to random by any game (unrated): {', '.join(fit.unrated)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")   # files only: no display on a server
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
    points = [(figures[g][axis], fit.ratings[generation_name(g)]) for g in sorted(figures)
              if generation_name(g) in fit.ratings and figures[g][axis] is not None]
    if points:
        xs = np.array([x for x, _ in points], float)
        ys = np.array([r.elo for _, r in points])
        errors = np.array([[r.elo - r.low for _, r in points], [r.high - r.elo for _, r in points]])
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label="generations (95% interval)")
        for (x, rating) in points:
            ax.annotate(str(parse_generation_name(rating.player)), (x, rating.elo), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    else:
        ax.text(0.5, 0.5, "no rated generation yet", transform=ax.transAxes, ha="center")
    for rating in fit.ratings.values():
        if parse_generation_name(rating.player) is None:
            ax.axhline(rating.elo, linestyle="--", linewidth=0.8, color="grey")
            ax.annotate(rating.player, (0.0, rating.elo), xycoords=("axes fraction", "data"),
                        fontsize=8, color="grey", va="bottom")
    ax.set_xlabel(label)
    ax.set_ylabel("Elo (random = 0)")
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


def write_report(storage, fit: elo.Fit, games, conditions: str, generations: Sequence[int], *,
                 plots: bool = True, played: int = 0) -> dict:
    """Write ratings.txt, ratings.json and the plots; returns the JSON document (with ``table``)."""
    figures = generation_figures(storage, generations)
    table = ratings_table(fit, figures, conditions)
    written = []
    if plots:
        for name, (axis, label) in PLOTS.items():
            storage.write_replace(layout.report_path(name), rating_plot(fit, figures, axis, label))
            written.append(name)
        storage.write_replace(layout.report_path("training-losses.png"),
                              metrics_plot(figures, LOSS_NAMES, "Training losses (each window's last report)",
                                           "loss"))
        storage.write_replace(layout.report_path("illegal-move-mass.png"),
                              metrics_plot(figures, (MASS_NAME,), "Policy mass on occupied points (illegal moves)",
                                           "softmax mass"))
        written += ["training-losses.png", "illegal-move-mass.png"]
    document = {
        "conditions": conditions, "anchor": fit.anchor, "unrated": list(fit.unrated),
        "games_in_fit": sum(1 for g in games if g.conditions == conditions), "games_played_now": played,
        "interval": "95%, +-1.96 standard errors from the inverse Hessian of the log-posterior",
        "ratings": {r.player: {"elo": r.elo, "low": r.low, "high": r.high, "games": r.games}
                    for r in fit.ratings.values()},
        "generations": {str(g): figures[g] for g in generations},
        "plots": [layout.report_path(name) for name in written],
    }
    storage.write_replace(layout.report_path("ratings.txt"), (table + "\n").encode())
    storage.write_replace(layout.report_path("ratings.json"), json.dumps(document, indent=1, sort_keys=True).encode())
    return {**document, "table": table}

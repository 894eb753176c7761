"""``python -m arena.run_page``: one self-contained HTML page that shows a training run.

    python -m arena.run_page --root ROOT --out run.html
    python -m arena.run_page --root gs://bucket/run --out run.html --recent-games 5

One file (no server, fetches nothing) instead of ``format.inspect summary``,
the ladder's report and TensorBoard; it lives in ``arena/`` because the
ratings it adds are the arena's.  Data flows lake -> numbers -> HTML:

1. `read_run` reads the lake, only through ``cloud.storage`` and writing
   nothing: the ``games/<g>/`` chunks (counted as the ladder counts them,
   `arena.ladder_report.chunk_counts`), ``windows/<g>/MANIFEST.json`` (else
   the model manifest's ``window_positions``), ``models/<g>/MANIFEST.json``
   (``global_step``, the losses), ``report/ratings.json`` (the ladder's
   ratings, shown as they are, never refitted) and the newest games.  A
   damaged object is named under "Problems" and the rest is drawn.
2. `RunFacts`: a row per generation, speed bins, rating points, the recent
   games' boards; plain dataclasses that tests compare with the sources.
3. `render_page`: tables, SVG plots and a small script stepping through the
   recent games; every checked number has a ``data-field`` attribute.

Units: hours are the ladder's (`arena.ladder_report.generation_figures`: a
model's publication time minus the earliest chunk's).  Self-play speed is
positions per hour of the chunks written in each of ``--speed-bins`` equal
stretches between the first and last chunk (by write time).
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import sys
import time
from typing import Sequence

import numpy as np

from arena import elo
from arena.ladder_report import (
    LOSS_NAMES,
    chunk_counts,
    generation_figures,
    generation_name,
    list_chunks,
    parse_closing_player_name,
    parse_generation_name,
    read_chunk_bytes,
    read_ratings_document,
)
from cloud.base import StorageError
from cloud.storage import open_storage
from format import codec, layout, schema
from format.cli import RoleCli, root_setting, setting, setting_problems
from format.coords import move_to_gtp
from format.documents import document_value
from format.registry import RegistryError, latest_generation, read_manifest
from format.run_config import RunConfigMismatch, read_run_config
from format.window_manifest import read_window_manifest

EXIT_OK, EXIT_USAGE = 0, 2


@dataclasses.dataclass(frozen=True)
class RunPageConfig:
    """Settings of `python -m arena.run_page` (see --help)."""

    root: str = root_setting()
    out: str = setting("", "the HTML file to write (a local path; replaced if it exists)", required=True)
    recent_games: int = setting(
        3, "how many of the newest self-play games the page lets you step through", at_least=0, at_most=20
    )
    speed_bins: int = setting(
        24, "self-play speed is plotted over this many equal stretches of the run", at_least=1, at_most=500
    )

    def __post_init__(self):
        for problem in setting_problems(self):  # root, declared ranges (format.cli)
            raise ValueError(problem)
        if not self.out:
            raise ValueError("--out: give the HTML file to write")


CLI = RoleCli(
    RunPageConfig,
    prog="python -m arena.run_page",
    description="Write one self-contained HTML page about the run in ROOT (a folder or gs://): per "
    "generation its self-play games and positions, window size, losses, rating with its "
    "95% interval (from the rating ladder's last report, ROOT/report/ratings.json) and "
    "hours; the rating against hours; self-play speed over time; and the newest games, "
    "to step through move by move. It reads the lake only and fetches nothing when "
    "opened.",
)


# --------------------------------------------------------------------------
# the numbers
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RatingShown:
    """One rated player as the ladder's table shows it (``estimate``, ``interval``: its text)."""

    player: str
    estimate: str
    interval: str
    games: int
    elo: float | None
    """The estimate as a number; None where the table shows a bound or ``?``."""
    low: float | None
    high: float | None
    """Interval ends; None for an open (infinite) end or none at all."""

    @property
    def plotted_at(self) -> float | None:
        """Where the rating plot draws it: the estimate, else the bound the table shows."""
        if self.elo is not None:
            return self.elo
        if self.estimate.startswith(">="):
            return self.low
        if self.estimate.startswith("<="):
            return self.high
        return None


@dataclasses.dataclass(frozen=True)
class GenerationRow:
    """One generation g: the games model g played (``games/<g>/``; generation 0 plays before any
    model), the window that trained model g, model g's training figures and rating."""

    generation: int
    games: int
    positions: int
    window_positions: int | None
    window_source: str
    """'window' (its manifest), 'model manifest' (the window was deleted) or '' (neither)."""
    global_step: int | None
    losses: dict
    hours: float | None
    rating: RatingShown | None


@dataclasses.dataclass(frozen=True)
class SpeedBin:
    """Self-play positions in the chunks written from ``start_hours`` to ``end_hours`` of the run."""

    start_hours: float
    end_hours: float
    positions: int

    @property
    def positions_per_hour(self) -> float:
        return self.positions / (self.end_hours - self.start_hours)


@dataclasses.dataclass(frozen=True)
class RecentGame:
    """A self-play game for the viewer: the board before each move and the move played from it."""

    game_id: str
    chunk: str
    generation: int
    board_size: int
    boards: tuple[str, ...]
    """Per position, the board row by row from the top edge: 'X' Black, 'O' White, '.' empty."""
    moves: tuple[str, ...]
    """The move played from each position, in GTP letters ('D4', 'pass')."""
    points: tuple[int | None, ...]
    """The same moves as points (row by row from the top edge, as ``boards``); None for a pass."""
    result: str


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """Everything the page shows, read from one lake."""

    root_url: str
    board_size: int | None
    komi: float | None
    latest: int | None
    chunks: int
    rows: tuple[GenerationRow, ...]
    ladder: dict | None
    """The ladder's report: ``conditions``, ``method``, ``anchor_reason``, ``games_in_fit``; None without one."""
    ratings: tuple[RatingShown, ...]
    """Every rated player, strongest first, as in the ladder's table."""
    rating_hours: dict
    """Hours of each generation the ratings name (for the plot and the ladder table's column)."""
    speed: tuple[SpeedBin, ...]
    recent: tuple[RecentGame, ...]
    problems: tuple[str, ...]

    @property
    def games(self) -> int:
        return sum(row.games for row in self.rows)

    @property
    def positions(self) -> int:
        return sum(row.positions for row in self.rows)


def _published_generations(storage) -> list[int]:
    """Generations with a model manifest (listed, not read: the rows read them)."""
    found = set()
    for info in storage.list(layout.models_prefix()):
        parts = info.path.split("/")
        generation = layout.parse_generation(parts[1]) if len(parts) == 3 else None
        if generation is not None and info.path == layout.model_manifest(generation):
            found.add(generation)
    return sorted(found)


def _window_generations(storage) -> list[int]:
    found = (
        layout.window_generation(info.path)
        for info in storage.list(layout.windows_prefix())
        if layout.is_window_manifest(info.path)
    )
    return sorted(generation for generation in found if generation is not None)


def _rated_generation(player: str) -> int | None:
    """The generation whose network a rated player is (``gen:G``, or ``gen:G@V`` from a closing
    match); None for an anchor."""
    closing = parse_closing_player_name(player)
    return closing[0] if closing else parse_generation_name(player)


def _number_or_none(value) -> float | None:
    """``value`` as a float when it is a number a lake document may hold (`format.document_value`:
    finite, at most MAX_DOCUMENT_NUMBER in magnitude), else None.  A 400-digit JSON integer is no such
    number: float() and isfinite() of it raise OverflowError."""
    try:
        return document_value(value, float, ValueError)
    except ValueError:
        return None


class _Damaged(ValueError):
    """A field of a rating that no ladder writes; the rating is left out, its problem named."""


def _rating_field(entry: dict, name: str, kinds, at_least: int | None = None):
    """``entry[name]`` if it is what the ladder writes there (`format.document_value`), else _Damaged."""
    return document_value(entry.get(name), kinds, lambda problem: _Damaged(f"field '{name}' {problem}"), at_least)


def read_ratings(storage, problems: list[str]) -> tuple[dict | None, list[RatingShown]]:
    """The ladder's last report (``report/ratings.json``) and its ratings, strongest first; (None, [])
    when the ladder has not run, or its report cannot be read (then ``problems`` says why)."""
    try:
        document = read_ratings_document(storage)
    except ValueError as exc:
        problems.append(f"{exc}; no ratings shown")
        return None, []
    if document is None:
        return None, []
    url = storage.url(layout.report_path("ratings.json"))
    ratings = []
    for player, entry in document["ratings"].items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("estimate"), str)
            or not isinstance(entry.get("games"), int)
        ):
            problems.append(f"{url}: ratings.{player} lacks its estimate or games; left out")
            continue
        try:
            # Each number as the ladder writes it (null for an open end); anything else, a 400-digit
            # Elo or 1e308 among them (OverflowError in the plot's arithmetic), damages this rating only.
            games = _rating_field(entry, "games", int, at_least=0)
            elo_value, low, high = (_rating_field(entry, name, (float, type(None))) for name in ("elo", "low", "high"))
        except _Damaged as exc:
            problems.append(f"{url}: ratings.{player}: {exc}; left out")
            continue
        interval = entry.get("interval_text")
        if not isinstance(interval, str):
            # A report written before the ladder kept its interval column's text: rebuild it the
            # ladder's way, from the ends (null is an open end; no intervals at all: none).
            interval = (
                ""
                if document.get("interval") == "none"
                else elo.Rating(
                    player, math.nan, -math.inf if low is None else low, math.inf if high is None else high, games
                ).interval_text()
            )
        ratings.append(RatingShown(player, entry["estimate"], interval, games, elo_value, low, high))

    def strongest_first(rating: RatingShown):
        at = rating.plotted_at
        return (at is None, 0.0 if at is None else -at, rating.player)

    ladder = {key: document.get(key) for key in ("conditions", "method", "anchor", "anchor_reason", "games_in_fit")}
    return ladder, sorted(ratings, key=strongest_first)


def speed_bins(chunk_times_ms: Sequence[tuple[int, int]], bins: int) -> list[SpeedBin]:
    """(time ms, positions) of each chunk -> ``bins`` equal stretches from the first chunk to the last;
    none when every chunk has the same time (a speed needs two)."""
    if not chunk_times_ms:
        return []
    start, end = min(t for t, _ in chunk_times_ms), max(t for t, _ in chunk_times_ms)
    if end == start:
        return []
    width_ms = (end - start) / bins
    positions = [0] * bins
    for time_ms, count in chunk_times_ms:
        positions[min(int((time_ms - start) / width_ms), bins - 1)] += count  # the last chunk ends the last bin
    hours = width_ms / 3.6e6
    return [SpeedBin(i * hours, (i + 1) * hours, positions[i]) for i in range(bins)]


def _result_text(game: codec.GameRecord) -> str:
    if game.winner == 0:
        return "draw or unknown"
    colour = "B" if game.winner == schema.BLACK else "W"
    if game.end_reason == schema.END_RESIGN:
        return f"{colour}+R"
    return f"{colour}+{abs(game.score):g}" if math.isfinite(game.score) else f"{colour}+"


def recent_games(storage, chunks: Sequence, count: int, problems: list[str]) -> list[RecentGame]:
    """The newest ``count`` games, newest first: the last games of the newest of the listed ``chunks``
    (by the time in their names), each read within its bound (`arena.ladder_report.read_chunk_bytes`)."""
    chosen: list[RecentGame] = []
    times = {i.path: name.time_ms for i in chunks if (name := layout.parse_chunk_path(i.path)) is not None}
    newest_first = sorted((i for i in chunks if i.path in times), key=lambda i: (times[i.path], i.path), reverse=True)
    for info in newest_first:
        if len(chosen) >= count:
            break
        url = storage.url(info.path)
        try:
            records = [
                item
                for item in codec.iter_chunk(read_chunk_bytes(storage, info), url)
                if isinstance(item, codec.GameRecord)
            ]  # a bad record costs only itself
        except StorageError as exc:
            problems.append(f"{url}: unreadable ({exc}); no game shown from it")
            continue
        for game in reversed(records):
            if len(chosen) >= count:
                break
            cells = np.where(game.planes[:, 0] != 0, "X", np.where(game.planes[:, 1] != 0, "O", "."))
            boards = tuple("".join(position.ravel()) for position in cells)
            pass_move = game.board_size**2  # a flat move index one past the last point
            chosen.append(
                RecentGame(
                    game.game_id,
                    url,
                    game.generation,
                    game.board_size,
                    boards,
                    tuple(move_to_gtp(int(m), game.board_size) for m in game.moves),
                    tuple(None if int(m) == pass_move else int(m) for m in game.moves),
                    _result_text(game),
                )
            )
    return chosen


def read_run(storage, config: RunPageConfig) -> RunFacts:
    """Every number of the page, read from the lake at ``storage`` (module docstring, step 1)."""
    problems: list[str] = []
    try:
        run = read_run_config(storage)
    except RunConfigMismatch as exc:
        problems.append(f"{exc}; board size and komi not shown")
        run = None
    # save=False: the page only reads; the ladder's cache is used where it already holds a chunk.
    listed = list_chunks(storage)
    counts = chunk_counts(storage, save=False, problems=problems, listed=listed)
    names = {path: name for path in counts if (name := layout.parse_chunk_path(path)) is not None}
    published = _published_generations(storage)
    windows = set(_window_generations(storage))
    if run is None and not problems and not counts and not published:
        # Most likely a mistyped root: an empty page would look like a run that has not started.
        raise ValueError(f"--root {storage.url('')}: no run.json, games or models; not a zerolake lake")
    ladder, ratings = read_ratings(storage, problems)
    by_player = {rating.player: rating for rating in ratings}
    rated = {g for g in (_rated_generation(r.player) for r in ratings) if g is not None}
    generations = sorted({name.generation for name in names.values()} | set(published) | windows)
    figures = generation_figures(storage, sorted(set(published) | rated), counts)
    rows = []
    for generation in generations:
        mine = [counts[p] for p, name in names.items() if name.generation == generation]
        metadata = {}
        if generation in published:
            try:
                metadata = read_manifest(storage, generation).metadata
            except (RegistryError, ValueError) as exc:
                problems.append(f"model {generation}: {exc}")
        window_positions, window_source = None, ""
        if generation in windows:
            try:
                window_positions = read_window_manifest(storage, generation).positions
                window_source = "window"
            except (ValueError, StorageError) as exc:
                problems.append(f"window {generation}: {exc}")
        if window_positions is None and isinstance(metadata.get("window_positions"), int):
            window_positions, window_source = metadata["window_positions"], "model manifest"
        found = metadata.get("training_metrics")
        metrics: dict = found if isinstance(found, dict) else {}
        step = metadata.get("global_step")
        rows.append(
            GenerationRow(
                generation=generation,
                games=sum(c[0] for c in mine),
                positions=sum(c[1] for c in mine),
                window_positions=window_positions,
                window_source=window_source,
                global_step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                losses={name: metrics[name] for name in LOSS_NAMES if _number_or_none(metrics.get(name)) is not None},
                hours=figures.get(generation, {}).get("hours"),
                rating=by_player.get(generation_name(generation)),
            )
        )
    try:
        latest = latest_generation(storage)
    except (RegistryError, ValueError) as exc:
        problems.append(f"{storage.url(layout.LATEST)}: {exc}")
        latest = None
    return RunFacts(
        root_url=storage.url(""),
        board_size=run.board_size if run else None,
        komi=run.komi if run else None,
        latest=latest,
        chunks=len(counts),
        rows=tuple(rows),
        ladder=ladder,
        ratings=tuple(ratings),
        rating_hours={g: f["hours"] for g, f in figures.items()},
        speed=tuple(speed_bins([(name.time_ms, counts[p][1]) for p, name in names.items()], config.speed_bins)),
        recent=tuple(recent_games(storage, [i for i in listed if i.path in counts], config.recent_games, problems)),
        problems=tuple(problems),
    )


# --------------------------------------------------------------------------
# SVG plots
# --------------------------------------------------------------------------


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) covering [low, high]."""
    if not high > low:
        low, high = low - 1.0, high + 1.0
    raw = (high - low) / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    return [first + i * step for i in range(int(math.ceil((high - first) / step - 1e-9)) + 1)]


@dataclasses.dataclass(frozen=True)
class PlotFrame:
    """Data coordinates -> SVG pixels, and the axes drawn around them."""

    x_ticks: tuple[float, ...]
    y_ticks: tuple[float, ...]
    width: int = 680
    height: int = 320
    left: int = 70
    right: int = 20
    top: int = 15
    bottom: int = 45

    @classmethod
    def around(cls, xs: Sequence[float], ys: Sequence[float]) -> "PlotFrame":
        return cls(tuple(nice_ticks(min(xs), max(xs))), tuple(nice_ticks(min(ys), max(ys))))

    def x(self, value: float) -> float:
        low, high = self.x_ticks[0], self.x_ticks[-1]
        return self.left + (value - low) / (high - low) * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        low, high = self.y_ticks[0], self.y_ticks[-1]
        return self.height - self.bottom - (value - low) / (high - low) * (self.height - self.top - self.bottom)

    def axes(self, x_label: str, y_label: str) -> list[str]:
        parts = []
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(
                f'<line class="grid" x1="{x:.1f}" y1="{self.top}" x2="{x:.1f}" y2="{self.height - self.bottom}"/>'
            )
            parts.append(
                f'<text class="tick" x="{x:.1f}" y="{self.height - self.bottom + 16}" '
                f'text-anchor="middle">{_tick_text(tick)}</text>'
            )
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(
                f'<line class="grid" x1="{self.left}" y1="{y:.1f}" x2="{self.width - self.right}" y2="{y:.1f}"/>'
            )
            parts.append(
                f'<text class="tick" x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick_text(tick)}</text>'
            )
        parts.append(
            f'<text class="label" x="{(self.left + self.width - self.right) / 2:.1f}" '
            f'y="{self.height - 6}" text-anchor="middle">{html.escape(x_label)}</text>'
        )
        parts.append(
            f'<text class="label" transform="translate(14 {(self.top + self.height - self.bottom) / 2:.1f}) '
            f'rotate(-90)" text-anchor="middle">{html.escape(y_label)}</text>'
        )
        return parts

    def svg(self, body: list[str], title: str) -> str:
        return (
            f'<svg class="plot" role="img" aria-label="{html.escape(title)}" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">' + "".join(body) + "</svg>"
        )


def _tick_text(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:.2g}"


def _empty_plot(text: str) -> str:
    return f'<p class="empty">{html.escape(text)}</p>'


def rating_plot(facts: RunFacts) -> str:
    """The generations' ratings against hours: a dot with its 95% interval for an estimate, a
    triangle at the bound pointing the open way for a bound, a cross for a closing-match player;
    anchors with a finite rating as dashed lines."""
    points = []  # (hours, rating, generation label, where it is plotted)
    for rating in facts.ratings:
        generation = _rated_generation(rating.player)
        hours = facts.rating_hours.get(generation) if generation is not None else None
        at = rating.plotted_at
        if hours is not None and at is not None:
            points.append((hours, rating, rating.player[len("gen:") :], at))
    if not points:
        return _empty_plot(
            "No rated generation with a publication time yet: run python -m arena.ladder --root "
            "ROOT, then write this page again."
        )
    anchors = [(r, elo) for r in facts.ratings if _rated_generation(r.player) is None and (elo := r.elo) is not None]
    ys = [at for *_, at in points] + [elo for _, elo in anchors]
    ys += [end for _, r, _, _ in points if r.elo is not None for end in (r.low, r.high) if end is not None]
    frame = PlotFrame.around([0.0] + [h for h, *_ in points], ys)
    body = frame.axes("hours since the first self-play chunk", f"Elo ({(facts.ladder or {}).get('anchor')} = 0)")
    for anchor, elo in anchors:
        y = frame.y(elo)
        body.append(
            f'<line class="anchor" x1="{frame.left}" y1="{y:.1f}" x2="{frame.width - frame.right}" '
            f'y2="{y:.1f}"/><text class="anchor-name" x="{frame.left + 4}" y="{y - 3:.1f}">'
            f"{html.escape(anchor.player)}</text>"
        )
    for hours, rating, label, at in points:
        x, y = frame.x(hours), frame.y(at)
        marker = f'data-player="{html.escape(rating.player)}" data-hours="{hours:.4f}"'
        if parse_closing_player_name(rating.player):
            body.append(
                f'<path class="closing" {marker} d="M{x - 5:.1f} {y - 5:.1f}L{x + 5:.1f} {y + 5:.1f}'
                f'M{x - 5:.1f} {y + 5:.1f}L{x + 5:.1f} {y - 5:.1f}"/>'
            )
        elif rating.elo is not None:
            if rating.low is not None and rating.high is not None:
                body.append(
                    f'<line class="interval" x1="{x:.1f}" y1="{frame.y(rating.low):.1f}" x2="{x:.1f}" '
                    f'y2="{frame.y(rating.high):.1f}"/>'
                )
            body.append(f'<circle class="estimate" {marker} cx="{x:.1f}" cy="{y:.1f}" r="4"/>')
        else:
            tip = -7 if rating.estimate.startswith(">=") else 7  # the open way: up for >=, down for <=
            body.append(
                f'<path class="bound" {marker} d="M{x:.1f} {y + tip:.1f}L{x - 6:.1f} {y:.1f}L{x + 6:.1f} {y:.1f}Z"/>'
            )
        body.append(f'<text class="point-name" x="{x + 6:.1f}" y="{y - 6:.1f}">{html.escape(label)}</text>')
    return frame.svg(body, "rating against hours")


def speed_plot(facts: RunFacts) -> str:
    """Self-play positions per hour in each stretch of the run, as bars."""
    if not facts.speed:
        return _empty_plot("Self-play speed needs chunks written at two different times.")
    frame = PlotFrame.around(
        [facts.speed[0].start_hours, facts.speed[-1].end_hours], [0.0] + [b.positions_per_hour for b in facts.speed]
    )
    body = frame.axes("hours since the first self-play chunk", "self-play positions per hour")
    for stretch in facts.speed:
        x0, x1 = frame.x(stretch.start_hours), frame.x(stretch.end_hours)
        y, base = frame.y(stretch.positions_per_hour), frame.y(0.0)
        body.append(
            f'<rect class="speed" data-positions="{stretch.positions}" x="{x0:.1f}" y="{y:.1f}" '
            f'width="{max(x1 - x0 - 1, 0.5):.1f}" height="{base - y:.1f}"><title>{stretch.start_hours:.2f}'
            f"-{stretch.end_hours:.2f} h: {stretch.positions:,} positions</title></rect>"
        )
    return frame.svg(body, "self-play speed over time")


# --------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1100px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; border-bottom: 1px solid #ddd; }
td.number, th.number { text-align: right; font-variant-numeric: tabular-nums; }
td.number { white-space: nowrap; }
.note, .empty { color: #666; } .problems li { color: #a00; }
svg.plot .grid { stroke: #e4e4e4; } svg.plot .tick, svg.plot .point-name, svg.plot .anchor-name { font-size: 11px; }
svg.plot .label { font-size: 12px; } svg.plot .anchor { stroke: #888; stroke-dasharray: 5 4; }
svg.plot .anchor-name { fill: #777; } svg.plot .interval { stroke: #1f5fa8; stroke-width: 2; }
svg.plot .estimate { fill: #1f5fa8; } svg.plot .bound { fill: #d0761a; }
svg.plot .closing { stroke: #000; stroke-width: 2; }
svg.plot .speed { fill: #5a9e5a; }
.game { display: inline-block; vertical-align: top; margin: 0 24px 16px 0; }
.game button { min-width: 32px; } .game input[type=range] { width: 200px; vertical-align: middle; }
"""

CONTENT_POLICY = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
"""The page's own rule that it loads nothing from outside itself (a browser enforces it)."""

VIEWER_SCRIPT = """
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var games = JSON.parse(document.getElementById("recent-games-data").textContent);
  function element(name, attributes) {
    var node = document.createElementNS(SVG, name);
    for (var key in attributes) node.setAttribute(key, attributes[key]);
    return node;
  }
  function draw(section, game, index) {
    var n = game.size, cell = 24, edge = cell, side = 2 * edge + (n - 1) * cell;
    var svg = section.querySelector("svg.board");
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute("width", side); svg.setAttribute("height", side);
    svg.setAttribute("viewBox", "0 0 " + side + " " + side);
    svg.appendChild(element("rect", {x: 0, y: 0, width: side, height: side, fill: "#dcb35c"}));
    for (var i = 0; i < n; i++) {
      var at = edge + i * cell, end = edge + (n - 1) * cell;
      svg.appendChild(element("line", {x1: edge, y1: at, x2: end, y2: at, stroke: "#333"}));
      svg.appendChild(element("line", {x1: at, y1: edge, x2: at, y2: end, stroke: "#333"}));
    }
    var board = game.boards[index];
    for (var p = 0; p < n * n; p++) {
      if (board[p] === ".") continue;
      var black = board[p] === "X";
      svg.appendChild(element("circle", {"class": "stone " + (black ? "black" : "white"),
        cx: edge + (p % n) * cell, cy: edge + Math.floor(p / n) * cell, r: cell * 0.46,
        fill: black ? "#111" : "#f4f4f4", stroke: "#111"}));
    }
    var move = game.moves[index], played = game.points[index];
    if (played !== null) {
      svg.appendChild(element("circle", {"class": "next-move", cx: edge + (played % n) * cell,
        cy: edge + Math.floor(played / n) * cell, r: cell * 0.2, fill: "none", stroke: "#d00", "stroke-width": 2}));
    }
    section.setAttribute("data-shown-position", index);
    section.querySelector("input[type=range]").value = index;
    section.querySelector(".caption").textContent = "position " + index + " of " + (game.boards.length - 1) +
      ": " + (index % 2 === 0 ? "Black" : "White") + " to play, played " + move;
  }
  games.forEach(function (game, number) {
    var section = document.getElementById("game-" + number), shown = game.boards.length - 1;
    var range = section.querySelector("input[type=range]");
    range.max = shown;
    function show(index) { shown = Math.max(0, Math.min(game.boards.length - 1, index)); draw(section, game, shown); }
    section.querySelector(".first").onclick = function () { show(0); };
    section.querySelector(".back").onclick = function () { show(shown - 1); };
    section.querySelector(".forward").onclick = function () { show(shown + 1); };
    section.querySelector(".last").onclick = function () { show(game.boards.length - 1); };
    range.oninput = function () { show(parseInt(range.value, 10)); };
    section.onkeydown = function (event) {
      if (event.key === "ArrowLeft") show(shown - 1);
      if (event.key === "ArrowRight") show(shown + 1);
    };
    show(shown);      // the last position first: where the game ended
  });
})();
"""


def _cell(value, field: str, text: str | None = None, *, title: str = "") -> str:
    """A number's table cell, which a test finds by its ``data-field``: ``text`` when given, else the
    value with thousands separators; '-' for None."""
    shown = (
        "-" if value is None else (text if text is not None else f"{value:,}" if isinstance(value, int) else str(value))
    )
    hover = f' title="{html.escape(title)}"' if title else ""
    return f'<td class="number" data-field="{field}"{hover}>{html.escape(shown)}</td>'


def _generations_table(facts: RunFacts) -> str:
    losses = [name for name in LOSS_NAMES if any(name in row.losses for row in facts.rows)]
    head = (
        "<tr><th class=number>generation</th><th class=number>self-play games</th>"
        "<th class=number>positions</th><th class=number>window positions</th>"
        "<th class=number>training steps</th>"
        + "".join(f"<th class=number>{html.escape(name.replace('_', ' '))}</th>" for name in losses)
        + "<th class=number>Elo</th><th class=number>95% interval</th><th class=number>hours</th></tr>"
    )
    body = []
    for row in facts.rows:
        cells = [
            _cell(row.generation, "generation", str(row.generation)),
            _cell(row.games, "games"),
            _cell(row.positions, "positions"),
            _cell(
                row.window_positions,
                "window_positions",
                title=f"from the {row.window_source}" if row.window_source else "",
            ),
            _cell(row.global_step, "global_step"),
        ]
        cells += [
            _cell(row.losses.get(name), f"loss:{name}", None if name not in row.losses else f"{row.losses[name]:.4f}")
            for name in losses
        ]
        cells += [
            _cell(row.rating.estimate if row.rating else None, "elo", row.rating.estimate if row.rating else None),
            _cell(row.rating.interval if row.rating else None, "interval", row.rating.interval if row.rating else None),
            _cell(row.hours, "hours", None if row.hours is None else f"{row.hours:.2f}"),
        ]
        body.append(f'<tr data-generation="{row.generation}">' + "".join(cells) + "</tr>")
    total = (
        f'<tr class="total" data-generation="all"><th>all</th>{_cell(facts.games, "games")}'
        f'{_cell(facts.positions, "positions")}<td colspan="{5 + len(losses)}"></td></tr>'
    )
    return "<table id=generations>" + head + "".join(body) + total + "</table>"


def _ladder_table(facts: RunFacts) -> str:
    if facts.ladder is None:
        return _empty_plot(
            "No ladder report in this lake yet (python -m arena.ladder --root ROOT writes report/ratings.json)."
        )
    rows = []
    for rating in facts.ratings:
        generation = _rated_generation(rating.player)
        hours = facts.rating_hours.get(generation) if generation is not None else None
        rows.append(
            f'<tr data-player="{html.escape(rating.player)}"><td data-field="player">'
            f"{html.escape(rating.player)}</td>{_cell(rating.estimate, 'elo', rating.estimate)}"
            f"{_cell(rating.interval, 'interval', rating.interval)}{_cell(rating.games, 'games')}"
            f"{_cell(hours, 'hours', None if hours is None else f'{hours:.2f}')}</tr>"
        )
    ladder = facts.ladder
    note = (
        f'<p class="note">{html.escape(str(ladder.get("method")))}; '
        f"{html.escape(str(ladder.get('anchor_reason') or ladder.get('anchor')))}; conditions "
        f"{html.escape(str(ladder.get('conditions')))}; {html.escape(str(ladder.get('games_in_fit')))} "
        "distinct games in the fit.</p>"
    )
    return (
        note + "<table id=ladder><tr><th>player</th><th class=number>Elo</th><th class=number>95% interval"
        "</th><th class=number>games</th><th class=number>hours</th></tr>" + "".join(rows) + "</table>"
    )


def _games_section(facts: RunFacts) -> str:
    if not facts.recent:
        return _empty_plot("No self-play games in this lake yet.")
    sections, data = [], []
    for number, game in enumerate(facts.recent):
        sections.append(
            f'<div class="game" id="game-{number}" tabindex="0" data-game-id="{html.escape(game.game_id)}" '
            f'data-chunk="{html.escape(game.chunk)}"><div>generation {game.generation}, '
            f'{len(game.moves)} moves, {html.escape(game.result)}</div><svg class="board"></svg><div>'
            '<button class="first" title="first position">|&#x25C0;</button>'
            '<button class="back" title="back one move (left arrow)">&#x25C0;</button>'
            '<input type="range" min="0" value="0">'
            '<button class="forward" title="forward one move (right arrow)">&#x25B6;</button>'
            '<button class="last" title="last position">&#x25B6;|</button></div>'
            '<div class="caption note"></div></div>'
        )
        data.append(
            {
                "size": game.board_size,
                "boards": list(game.boards),
                "moves": list(game.moves),
                "points": list(game.points),
            }
        )
    # Only '.XO' boards, GTP moves and numbers are in the JSON, never "</", so the data cannot close
    # its script element early.
    payload = json.dumps(data, separators=(",", ":"))
    return (
        "".join(sections) + f'<script type="application/json" id="recent-games-data">{payload}</script>'
        f"<script>{VIEWER_SCRIPT}</script>"
    )


def render_page(facts: RunFacts, *, written_at: float | None = None) -> str:
    """The page (module docstring, step 3): one HTML document with nothing outside it."""
    written = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if written_at is None else written_at))
    board = f"{facts.board_size}x{facts.board_size}, komi {facts.komi:g}" if facts.board_size else "no run.json yet"
    speed_note = ""
    if facts.speed:
        hours = facts.speed[-1].end_hours
        speed_note = (
            f'<p class="note">{facts.positions:,} positions in {hours:.2f} hours between the first and the '
            f"last chunk; each bar is {hours / len(facts.speed) * 60:.1f} minutes.</p>"
        )
    problems = (
        (
            "<h2>Problems</h2><ul class=problems>"
            + "".join(f"<li>{html.escape(p)}</li>" for p in facts.problems)
            + "</ul>"
        )
        if facts.problems
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CONTENT_POLICY}">
<title>zerolake run: {html.escape(facts.root_url)}</title><style>{STYLE}</style></head>
<body>
<h1>zerolake run <code>{html.escape(facts.root_url)}</code></h1>
<p class="note">{board}; {facts.chunks:,} chunks; latest published generation {
        "none" if facts.latest is None else facts.latest
    }; page written {written} by python -m arena.run_page.</p>
{problems}
<h2>Generations</h2>
<p class="note">Generation g: the self-play games model g played (generation 0: before any model), the window that
trained model g, its training steps and the window's last losses, its rating from the ladder's last report and the
hours from the first self-play chunk to its publication.</p>
{_generations_table(facts)}
<h2>Rating against hours</h2>
{rating_plot(facts)}
<h2>Rating ladder</h2>
{_ladder_table(facts)}
<h2>Self-play speed</h2>
{speed_plot(facts)}
{speed_note}
<h2>Recent games</h2>
<p class="note">The newest self-play games, shown where they ended; step with the buttons, the slider or the arrow
keys. The red ring marks the move played from the position shown.</p>
{_games_section(facts)}
</body></html>
"""


def write_page(config: RunPageConfig, *, retry=None) -> RunFacts:
    """Read the lake at ``config.root`` and write its page to ``config.out``; returns the numbers shown."""
    facts = read_run(open_storage(config.root, retry=retry), config)
    page = render_page(facts)
    try:
        with open(config.out, "w", encoding="utf-8") as handle:
            handle.write(page)
    except OSError as exc:
        raise ValueError(f"--out {config.out}: cannot write it ({exc.strerror})") from None
    return facts


def main(argv=None) -> int:
    config, retry = CLI.parse(argv)
    try:
        facts = write_page(config, retry=retry)
    except (ValueError, StorageError, RegistryError, OSError) as exc:
        print(f"arena.run_page: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"wrote {config.out}: {len(facts.rows)} generations, {facts.games:,} games, {len(facts.ratings)} "
        f"rated players, {len(facts.recent)} recent games"
        + (f"; {len(facts.problems)} problems named on the page" if facts.problems else "")
    )
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

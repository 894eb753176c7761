"""arena.run_page: the page of a small lake, rendered by headless Chromium, shows the numbers that
``format.inspect summary`` and the rating ladder's table compute on the same lake.

The lake: a 7x7 run.json; synthetic self-play chunks of generations 0 to 2 written over about three
hours; windows 1 and 2 (window 3 written, then deleted as retention deletes one, so only model 3's
manifest remembers its size); models 1 to 3 published with the metadata a trainer records (no network:
the ladder below plays no game, so no model is loaded); and ladder results for every pairing of a
ladder with two anchors, fitted and reported by `arena.ladder.run` itself.  Nothing in the checks is a
number written here: each is what inspect or the ladder says about this lake.

Chromium is Debian's ``chromium-headless-shell`` (``scripts/setup.sh --test`` installs it); the
screenshot is left in the test's tmp folder (its path is recorded as the test's ``screenshot``
property and printed) for a person to look at.
"""
import json
import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser

import numpy as np
import pytest

from cloud.storage import open_storage
from format import codec, layout, schema
from format.inspect import main as inspect_main
from format.registry import publish_model, read_manifest
from format.run_config import RunConfig, ensure_run_config
from arena.ladder import (LadderConfig, LadderGame, Pairing, anchor_chain, game_digest, ladder_conditions, run,
                          write_results)
from arena.ladder_report import generation_name
from arena.run_page import CLI, RunPageConfig, main, read_run, write_page
from testdata.synthetic_games import synthetic_game
from testdata.synthetic_windows import write_synthetic_window

N = 7
MINUTE_MS = 60_000
CHROMIUM_NAMES = ("chromium-headless-shell", "chromium")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ladder_config(root):
    # Two anchors and tiny budgets: the results below give every pairing its games, so nothing is played.
    return LadderConfig(root=root, anchors="random,playouts:2", games=3, visits=4, opening_moves=2,
                        give_up_score=-1.0, plots=False, stored_anchor_games=False)


def pairings(config, generations):
    """Every pairing the ladder's schedule asks for (arena.ladder.Ladder.schedule_and_play)."""
    anchors = config.anchor_names()
    wanted = anchor_chain(anchors) + [Pairing(generation_name(g), a) for g in generations for a in anchors]
    return wanted + [Pairing(generation_name(new), generation_name(old))
                     for old, new in zip(generations, generations[1:])]


def write_ladder_results(storage, config, generations, run_config):
    """Three games a pairing: the newest generation wins all of its own (a bound in the table); in the
    others the stronger side wins two (a generation over the anchors) or one (over the one before it),
    so that the finite estimates differ."""
    conditions = ladder_conditions(N, run_config.komi, config.visits, config.opening_moves, config.max_moves)
    games, serial = [], 0
    for pairing in pairings(config, generations):
        for index in range(config.games):
            black, white = (pairing.a, pairing.b) if index % 2 == 0 else (pairing.b, pairing.a)
            newest = pairing.a == generation_name(generations[-1])
            a_wins = newest or index < (1 if pairing.b.startswith("gen:") else 2)
            winner = schema.BLACK if (black == pairing.a) == a_wins else schema.WHITE
            serial += 1                                  # each game its own moves: all distinct
            games.append(LadderGame(
                pairing=pairing.name, index=index, a=pairing.a, b=pairing.b, black=black, white=white,
                winner=winner, score=None, end_reason="resign", moves=1, conditions=conditions,
                sgf=layout.ladder_game_sgf(pairing.name, index), time=time.time(),
                digest=game_digest(black, white, [serial], winner, "resign")))
    write_results(storage, games)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """(root, the ladder's report document) of the small lake (module docstring)."""
    root = str(tmp_path_factory.mktemp("run-page") / "lake")
    storage = open_storage(root)
    run_config = ensure_run_config(storage, RunConfig(board_size=N))
    rng = np.random.default_rng(40)
    start_ms = int(time.time() * 1000) - 180 * MINUTE_MS
    chunk_minutes = {0: (0, 20, 45), 1: (70, 100), 2: (130, 160)}
    for generation, minutes in chunk_minutes.items():
        for seq, minute in enumerate(minutes):
            games = [synthetic_game(rng, N, visits=8, generation=generation) for _ in range(3)]
            path = layout.chunk_path(generation, "w0", start_ms + minute * MINUTE_MS, seq)
            storage.write_new(path, codec.encode_chunk(games))
    windows = {g: write_synthetic_window(storage, target_generation=g, board_size=N, positions=40 + 30 * g,
                                         shards=1, seed=g) for g in (1, 2, 3)}
    for info in storage.list(layout.window_dir(3) + "/"):       # retention deleted window 3
        storage.delete(info.path)
    model_files = tmp_path_factory.mktemp("model")
    (model_files / "saved_model.pb").write_bytes(b"not a network: the ladder here loads no model")
    for generation in (1, 2, 3):
        publish_model(storage, generation, str(model_files), {
            "board_size": N, "created_unix": start_ms / 1000 + (50 + 55 * generation) * 60,
            "global_step": 120 * generation, "window_positions": windows[generation]["positions"],
            "training_metrics": {"loss": 4.5 / generation, "policy_loss": 3.2 / generation,
                                 "value_loss": 0.9 / generation, "occupied_policy_mass": 0.1}})
    config = ladder_config(root)
    write_ladder_results(storage, config, [1, 2, 3], run_config)
    report = run(config, log=lambda line: None)
    assert report["games_played_now"] == 0       # every pairing had its games: no model was needed
    return root, report


# --------------------------------------------------------------------------
# what inspect says
# --------------------------------------------------------------------------

def inspect_summary(target, capsys):
    assert inspect_main(["summary", target, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------
# what the page shows, as Chromium left it
# --------------------------------------------------------------------------

class PageDom(HTMLParser):
    """The numbers of a dumped page: table cells by ``data-field``, speed bars, the game viewers."""

    def __init__(self, text):
        super().__init__()
        self.tables, self.speed_positions, self.games = {}, [], []
        self._table = self._row = self._field = self._game = None
        self._game_depth = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "table":
            self._table = self.tables.setdefault(attributes.get("id"), {})
        elif tag == "tr" and self._table is not None:
            key = attributes.get("data-generation") or attributes.get("data-player")
            self._row = self._table.setdefault(key, {}) if key else None
        elif tag in ("td", "th") and self._row is not None and "data-field" in attributes:
            self._field = attributes["data-field"]
            self._row[self._field] = ""
        elif tag == "rect" and "speed" in classes:
            self.speed_positions.append(int(attributes["data-positions"]))
        elif tag == "div" and "game" in classes:
            self._game = {"id": attributes["data-game-id"], "shown": attributes.get("data-shown-position"),
                          "black": 0, "white": 0}
            self.games.append(self._game)
            self._game_depth = 1
        elif tag == "div" and self._game is not None:
            self._game_depth += 1
        elif tag == "circle" and self._game is not None and "stone" in classes:
            self._game["black" if "black" in classes else "white"] += 1

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self._field = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "div" and self._game is not None:
            self._game_depth -= 1
            if self._game_depth == 0:
                self._game = None

    def handle_data(self, data):
        if self._field is not None:
            self._row[self._field] += data


def chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(f"no {' or '.join(CHROMIUM_NAMES)} on PATH: Debian's chromium-headless-shell renders the page "
                "(scripts/setup.sh --test installs it)")


def run_chromium(tmp_path, *arguments):
    # Its own profile folder, so that nothing is written to the home folder; no sandbox: tests may run as root.
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'chromium-profile'}", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


# --------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------

def test_the_page_in_chromium_shows_what_inspect_and_the_ladder_compute(lake, tmp_path, capsys,
                                                                        record_property):
    root, report = lake
    storage = open_storage(root)
    page = tmp_path / "run.html"
    assert main(["--root", root, "--out", str(page)]) == 0
    assert "wrote" in capsys.readouterr().out
    dom = PageDom(run_chromium(tmp_path, "--dump-dom", page.as_uri()))
    generations = dom.tables["generations"]

    # Self-play games and positions: the whole lake's, and each generation's folder's.
    summary = inspect_summary(root, capsys)
    assert int(generations["all"]["games"].replace(",", "")) == summary["games"]
    assert int(generations["all"]["positions"].replace(",", "")) == summary["positions"]
    assert {g for g in generations if g != "all"} == {"0", "1", "2", "3"}
    for generation, games in summary["generations"].items():
        mine = inspect_summary(os.path.join(root, layout.games_prefix(int(generation))), capsys)
        assert mine["games"] == games
        assert int(generations[generation]["games"].replace(",", "")) == games
        assert int(generations[generation]["positions"].replace(",", "")) == mine["positions"]
    assert generations["3"]["games"] == "0"          # model 3 has played no game yet

    # Window sizes: the shards' positions as inspect decodes them; a deleted window's from its model.
    for generation in (1, 2):
        window = inspect_summary(os.path.join(root, layout.window_dir(generation)), capsys)
        assert int(generations[str(generation)]["window_positions"].replace(",", "")) == window["shard_positions"]
    assert not storage.exists(layout.window_manifest(3))
    assert int(generations["3"]["window_positions"]) == read_manifest(storage, 3).metadata["window_positions"]
    assert generations["0"]["window_positions"] == "-"

    # Training steps and losses: the model manifests'.
    for generation in (1, 2, 3):
        metadata = read_manifest(storage, generation).metadata
        assert int(generations[str(generation)]["global_step"].replace(",", "")) == metadata["global_step"]
        for name in ("loss", "policy_loss", "value_loss"):
            shown = float(generations[str(generation)][f"loss:{name}"])
            assert shown == pytest.approx(metadata["training_metrics"][name], abs=1e-4)

    # Ratings, intervals, games and hours: each line of the ladder's printed table.
    table_lines = report["table"].splitlines()
    ladder = dom.tables["ladder"]
    assert set(ladder) == set(report["ratings"])
    for player, shown in ladder.items():
        [line] = [line for line in table_lines if line.split(" ", 1)[0] == player]
        hours = report["generations"].get(player[len("gen:"):], {}).get("hours")
        assert shown["hours"] == ("-" if hours is None else f"{hours:.2f}")
        # player, Elo, interval, (the other prior's estimate), games, hours: as the table prints them.
        pattern = (rf"{re.escape(player)}\s+{re.escape(shown['elo'])}\s+{re.escape(shown['interval'])}\s+.*?"
                   rf"\s{shown['games']}\s+{'' if hours is None else re.escape(shown['hours'])}(\s|$).*")
        assert re.fullmatch(pattern, line), (shown, line)
    assert any(shown["elo"].startswith(">=") for shown in ladder.values())     # a bound, as the table has
    assert any(re.fullmatch(r"-?\d+", shown["elo"]) for shown in ladder.values())
    for generation in (1, 2, 3):
        row, rated = generations[str(generation)], ladder[generation_name(generation)]
        assert (row["elo"], row["interval"], row["hours"]) == (rated["elo"], rated["interval"], rated["hours"])

    # Speed: every position of the lake falls in one of the bars.
    assert dom.speed_positions and sum(dom.speed_positions) == summary["positions"]

    # The viewer ran: each recent game shows its last position, stone for stone, and they are the
    # newest games (the last games of the newest chunk).
    chunks = sorted((info.path for info in storage.list(layout.games_prefix())),
                    key=lambda path: layout.parse_chunk_path(path).time_ms)
    newest = codec.read_chunk(storage.read(chunks[-1]), chunks[-1])[::-1]
    assert [game["id"] for game in dom.games] == [game.game_id for game in newest[:len(dom.games)]]
    assert len(dom.games) == RunPageConfig(root=root, out=str(page)).recent_games      # the default
    for shown, game in zip(dom.games, newest):
        assert int(shown["shown"]) == game.num_positions - 1
        assert (shown["black"], shown["white"]) == (int(game.planes[-1, 0].sum()), int(game.planes[-1, 1].sum()))

    # A screenshot for a person to look at.
    screenshot = tmp_path / "run-page.png"
    run_chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1200,2600", page.as_uri())
    assert screenshot.read_bytes().startswith(PNG_MAGIC)
    record_property("screenshot", str(screenshot))
    print(f"run page screenshot: {screenshot}")


def test_the_page_is_self_contained_and_the_lake_is_only_read(lake, tmp_path):
    root, _ = lake
    before = {info.path: info.size for info in open_storage(root).list("")}
    page = tmp_path / "run.html"
    write_page(RunPageConfig(root=root, out=str(page)))
    text = page.read_text()
    # Nothing is fetched: no URL of any scheme in an attribute, and the page's policy forbids it.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "default-src 'none'" in text
    assert {info.path: info.size for info in open_storage(root).list("")} == before


def test_a_gs_lake_gives_the_page_a_folder_gives(lake, fake_gcs):
    root, _ = lake
    local = open_storage(root)
    for info in local.list(""):
        fake_gcs.storage.write_new(info.path, local.read(info.path))
    config = RunPageConfig(root=root, out="unused.html")
    from_folder, from_bucket = read_run(local, config), read_run(fake_gcs.storage, config)
    assert from_bucket.root_url.startswith("gs://")
    assert from_bucket.rows == from_folder.rows and from_bucket.ratings == from_folder.ratings
    assert from_bucket.speed == from_folder.speed
    assert [g.boards for g in from_bucket.recent] == [g.boards for g in from_folder.recent]


def test_bad_flags_and_outputs_are_refused_in_one_line(lake, tmp_path, capsys):
    root, _ = lake
    for argv, named in ((["--root", root, "--out", "x.html", "--recent-games", "99"], "--recent-games"),
                        (["--root", root, "--out", "x.html", "--speed-bins", "0"], "--speed-bins"),
                        (["--root", root], "--out")):
        with pytest.raises(SystemExit) as exc:
            CLI.parse(argv)
        assert exc.value.code == 2 and named in capsys.readouterr().err
    missing = tmp_path / "no-such-folder" / "run.html"
    assert main(["--root", root, "--out", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("arena.run_page: --out ") and "\n" not in err
    # A mistyped root is not shown as a run that has not started.
    assert main(["--root", str(tmp_path / "no-lake"), "--out", str(tmp_path / "run.html")]) == 2
    assert "not a zerolake lake" in capsys.readouterr().err and not (tmp_path / "run.html").exists()


def test_a_lake_without_a_ladder_or_with_a_damaged_report_still_gets_its_page(lake, tmp_path):
    root, _ = lake
    copy = tmp_path / "lake"
    shutil.copytree(root, copy)
    storage = open_storage(str(copy))
    storage.write_replace(layout.report_path("ratings.json"), b"{not json")
    facts = write_page(RunPageConfig(root=str(copy), out=str(tmp_path / "damaged.html")))
    assert facts.ratings == () and any("ratings.json: not valid JSON" in p for p in facts.problems)
    assert "ratings.json: not valid JSON" in (tmp_path / "damaged.html").read_text()
    storage.delete(layout.report_path("ratings.json"))
    facts = write_page(RunPageConfig(root=str(copy), out=str(tmp_path / "none.html")))
    assert facts.ladder is None and not facts.problems
    assert "No ladder report in this lake yet" in (tmp_path / "none.html").read_text()


def test_a_damaged_rating_is_left_out_and_named_while_the_rest_of_the_page_renders(lake, tmp_path):
    """A 400-digit Elo or +-1e308 in ratings.json raised OverflowError (float() of the one, the plot's
    tick arithmetic on the other), and no page was written at all."""
    root, _ = lake
    copy = tmp_path / "lake"
    shutil.copytree(root, copy)
    storage = open_storage(str(copy))
    document = json.loads(storage.read(layout.report_path("ratings.json")))
    huge, wide, *kept = sorted(document["ratings"])
    document["ratings"][huge]["elo"] = 10 ** 400
    document["ratings"][wide].update(low=-1e308, high=1e308)
    storage.write_replace(layout.report_path("ratings.json"), json.dumps(document).encode())
    out = tmp_path / "run.html"
    assert main(["--root", str(copy), "--out", str(out)]) == 0
    facts = write_page(RunPageConfig(root=str(copy), out=str(out)))
    assert sorted(r.player for r in facts.ratings) == kept
    url = storage.url(layout.report_path("ratings.json"))
    assert [p for p in facts.problems if "ratings." in p] == [
        f"{url}: ratings.{huge}: field 'elo' is {'1' + '0' * 35}..., expected float or null; left out",
        f"{url}: ratings.{wide}: field 'low' is -1e+308, expected float or null; left out"]
    page = out.read_text()
    assert f"ratings.{huge}: field" in page and "<table id=generations>" in page and "<svg" in page

"""format.match_record: the one owner of the loop's match documents (loop/eval-<G>.json, loop/final-<G>.json).

What matters: a record survives the lake unchanged, what arena.match emits
is what the owner reads, and a damaged document is one ValueError naming the
file and the field, never a KeyError or TypeError from a reader's dict access.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from format.match_record import ClosingRecord, MatchGame, MatchRecord
from format import schema
from arena.match import GameResult, summarize

URL = "gs://bucket/run/loop/final-000004.json"


def played_match() -> MatchRecord:
    games = [GameResult(i, "model-g4" if i % 2 == 0 else "gnugo-l1", "gnugo-l1" if i % 2 == 0 else "model-g4",
                        (1, 2, 3), schema.BLACK if i < 3 else schema.WHITE, None if i else -3.5, "resign",
                        f"loop/final-000004-gnugo-1/{i:05d}.sgf") for i in range(4)]
    return summarize("model-g4", "gnugo-l1", 9, 7.5, games, 12.5).to_record()


def test_what_the_match_emits_is_what_the_lake_keeps_and_reads_back():
    record = dataclasses.replace(played_match(), visits=256)
    assert record.game_results[0] == MatchGame(0, "model-g4", "gnugo-l1", "B+R", -3.5, "resign", 3,
                                               "loop/final-000004-gnugo-1/00000.sgf")
    closing = ClosingRecord(vs_random=dataclasses.replace(record, game_results=None), vs_generation_0=record,
                            vs_gnugo_1=record)
    assert ClosingRecord.from_bytes(closing.to_bytes(), URL) == closing
    assert ClosingRecord.from_bytes(ClosingRecord(record, record).to_bytes(), URL).vs_gnugo_1 is None
    assert MatchRecord.from_bytes(record.to_bytes(), URL) == record
    assert record.text() == "3/4 vs gnugo-l1 (75%, 95% CI 30%-95%)"


def test_a_field_a_newer_writer_adds_is_ignored():
    document = {**played_match().to_json_dict(), "elo": 12.0}
    assert MatchRecord.from_json_dict(document, URL) == played_match()


@pytest.mark.parametrize("damage, field", [
    (lambda d: d.pop("player_b"), "'player_b'"),
    (lambda d: d.update(wins="2"), "wins is '2'"),
    (lambda d: d.update(games=True), "games is True"),
    (lambda d: d.update(komi=float("nan")), "komi is nan"),
    (lambda d: d.update(seconds=1e400), "seconds is inf"),
    (lambda d: d.update(losses=-1), "losses is -1"),
    (lambda d: d.update(wins=d["wins"] + 1), "do not add up"),
    (lambda d: d.update(ci_high=1.5), "do not add up"),
    (lambda d: d.update(visits="256"), "visits is '256'"),
    (lambda d: d.update(game_results={}), "game_results must be a list"),
    (lambda d: d["game_results"].__setitem__(1, "B+R"), "game_results[1]: not a game"),
    (lambda d: d["game_results"][2].pop("end_reason"), "game_results[2]: end_reason is None"),
    (lambda d: d["game_results"][0].update(moves=-3), "game_results[0]: moves is -3"),
    # Any account that can write the lake could set the operator's window title or clipboard.
    (lambda d: d.update(player_a="\x1b]52;c;cm0gLXJmIH4K\x07model"), "player_a is '\\x1b]52;c"),
    (lambda d: d["game_results"][1].update(black="\x1b[2J"), "game_results[1]: black is '\\x1b[2J'"),
])
def test_a_damaged_match_result_is_one_error_naming_the_file_and_field(damage, field):
    document = json.loads(json.dumps(played_match().to_json_dict()))
    damage(document)
    with pytest.raises(ValueError) as error:
        MatchRecord.from_bytes(json.dumps(document).encode(), URL)
    assert str(error.value).startswith(URL) and field in str(error.value) and "\x1b" not in str(error.value)


@pytest.mark.parametrize("data, field", [
    (b"{not json", "not valid JSON"),
    (b"[" * 3000 + b"]" * 3000, "nested too deeply"),      # json raised RecursionError: a traceback
    (b"[1, 2]", "not the closing matches"),
    (b'{"vs_generation_0": {}}', "no 'vs_random'"),
    (b'{"vs_random": {}, "vs_generation_0": {}}', "vs_random: the match result has no 'player_a'"),
])
def test_a_damaged_closing_document_is_one_error_naming_it(data, field):
    with pytest.raises(ValueError) as error:
        ClosingRecord.from_bytes(data, URL)
    assert str(error.value).startswith(URL) and field in str(error.value)

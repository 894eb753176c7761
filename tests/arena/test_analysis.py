"""``python -m arena.analysis``: KataGo's JSON analysis protocol (its docs/Analysis_Engine.md), point by point.

The protocol-level tests drive `arena.analysis.Server` in process with the uniform evaluator's search and
stand-in network heads (fast, exact values); one test runs the command on a published model as a client
would, queries on stdin and responses on stdout.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from arena import analysis as A
from arena.player import MctsConfig, MctsPlayer, SearchBudget
from format import schema
from inference.evaluator import UniformEvaluator

REPO = Path(__file__).resolve().parents[2]

DOC_QUERY = {"id": "foo", "initialStones": [["B", "Q4"], ["B", "C4"]], "moves": [["W", "P5"], ["B", "P6"]],
             "rules": "tromp-taylor", "komi": 7.5, "boardXSize": 19, "boardYSize": 19, "analyzeTurns": [0, 1, 2]}
"""The example query of KataGo's document, word for word."""


class StandInHeads:
    """Network heads with known values: the score head says the player to move leads by 2.5 points,
    ownership +0.25 everywhere for the player to move, and a policy that prefers the first point."""

    def __init__(self, size: int = 9):
        self.size = size
        self.calls = 0

    def __call__(self, boards):
        self.calls += 1
        n = self.size * self.size
        logits = np.zeros((len(boards), n + 1))
        logits[:, 0] = 3.0
        return {"policy_logits": logits, "ownership": np.full((len(boards), n), 0.25), "score": np.full(len(boards), 2.5)}


def serve(*queries, visits: int = 16, perspective: int = schema.BLACK, heads=None) -> list[dict]:
    """Every response to ``queries`` (dicts, or raw lines), the input then closed."""
    lines: queue.Queue = queue.Queue()
    for q in queries:
        lines.put(q if isinstance(q, str) else json.dumps(q))
    lines.put(None)
    out: list[dict] = []
    player = MctsPlayer(UniformEvaluator(9), MctsConfig(budget=SearchBudget(visits, None), seed=1))
    server = A.Server(player, heads or StandInHeads(), 9, 7.5, visits, perspective, lines,
                      lambda obj: out.append(json.loads(json.dumps(obj))))
    server.run()
    return out


def query(**fields) -> dict:
    return {"id": "q", "moves": [["B", "E5"], ["W", "C3"]], "rules": "chinese", "komi": 7.5, "boardXSize": 9,
            "boardYSize": 9, **fields}


# ---------------------------------------------------------------------------
# Queries, as KataGo's document and source word them
# ---------------------------------------------------------------------------

def test_the_documents_example_query_parses_to_its_three_turns():
    parsed = A.parse_query(DOC_QUERY, 19, 7.5, 500, schema.BLACK)
    assert parsed.turns == [0, 1, 2] and parsed.size == 19 and parsed.komi == 7.5
    assert [(c, m) for c, m in parsed.moves] == [(schema.WHITE, 14 * 19 + 14), (schema.BLACK, 13 * 19 + 14)]
    assert int(np.count_nonzero(parsed.stones == schema.BLACK)) == 2
    assert parsed.warnings == [("rules", "Rules tromp-taylor not supported by zerolake, using chinese (area "
                                         "scoring) instead")]
    boards = A.positions(parsed)
    assert sorted(boards) == [0, 1, 2] and boards[0].to_play == schema.WHITE   # moves[0] is White's
    assert boards[2].to_play == schema.WHITE and int(np.count_nonzero(boards[2].stones())) == 4


@pytest.mark.parametrize("change, field, message", [
    (lambda q: q.pop("boardXSize"), "boardXSize", "Must provide an integer from 2 to 19"),
    (lambda q: q.update(boardYSize=9.5), "boardYSize", "Must provide an integer from 2 to 19"),
    (lambda q: q.update(boardXSize=13, boardYSize=13), "boardXSize", "Must be 9: the network plays 9x9"),
    (lambda q: q.pop("moves"), "moves", "Must specify an array of [player,location] pairs"),
    (lambda q: q.update(moves=[["B", "E5", "x"]]), "moves", 'Must be an array of pairs of the form: ["b" or "w", '
                                                            'GTP board vertex]'),
    (lambda q: q.update(moves=[["X", "E5"]]), "moves", "Could not parse player: X"),
    (lambda q: q.update(moves=[["B", "Z9"]]), "moves", "Could not parse board location: Z9"),
    (lambda q: q.update(initialStones=[["B", "pass"]]), "initialStones", "Could not parse board location: pass"),
    (lambda q: q.update(moves=[["B", "E5"], ["W", "E5"]]), "moves", "Illegal move 1: E5"),
    (lambda q: q.update(analyzeTurns=[3]), "analyzeTurns", "Invalid turn number: 3"),
    (lambda q: q.update(analyzeTurns="all"), "analyzeTurns", "Must specify an array of integers indicating turns"),
    (lambda q: q.pop("rules"), "rules", "Must specify rules string"),
    (lambda q: q.update(rules="backgammon"), "rules", "Could not parse rules: backgammon"),
    (lambda q: q.update(komi=7.25), "rules", "Must be a integer or half-integer from -150.0 to 150.0"),
    (lambda q: q.update(komi=200), "komi", "Must be a integer or half-integer from -150.0 to 150.0"),
    (lambda q: q.update(maxVisits=0), "maxVisits", "Must be an integer from 1 to 2^50"),
    (lambda q: q.update(includeOwnership="yes"), "includeOwnership", "Must be a boolean"),
    (lambda q: q.update(priority=1, priorities=[1]), "priorities", "Can only specify when also specifying"),
    (lambda q: q.update(avoidMoves=[], allowMoves=[]), "allowMoves", "Cannot specify both allowMoves and avoidMoves"),
    (lambda q: q.update(avoidMoves=[{"player": "B", "moves": ["C3"]}]), "avoidMoves",
     "Must be a list of dicts with subfields 'player', 'moves', 'untilDepth'"),
    (lambda q: q.update(reportDuringSearchEvery=0), "reportDuringSearchEvery", "Must be number of seconds"),
    (lambda q: q.update(overrideSettings=[]), "overrideSettings", "Must be an object"),
])
def test_a_bad_field_is_one_error_naming_it_and_the_query_is_dropped(change, field, message):
    bad = query()
    change(bad)
    [error] = serve(bad)
    assert error["id"] == "q" and error["field"] == field and error["error"].startswith(message), error


@pytest.mark.parametrize("line, message", [
    ("{not json", "could not parse input line as json request: {not json"),
    ("[1, 2]", "Request line was valid json but was not an object, ignoring: [1, 2]"),
    ('{"id": 3}', 'Request must have a string "id" field'),
    ('{"id": "a", "action": "explode"}', "'action' field must be 'query_version'"),
    ("[" * 5000 + "]" * 5000, "could not parse input line as json request"),
])
def test_a_line_that_is_no_query_is_one_general_error(line, message):
    [error] = serve(line)
    assert set(error) == {"error"} and message in error["error"]


def test_settings_zerolake_lacks_are_warnings_and_the_query_goes_on():
    out = serve(query(rules="japanese", overrideSettings={"wideRootNoise": 0.04, "maxTime": 10},
                      includeOwnershipStdev=True))
    warnings = {(r["field"], r["warning"].split(":")[0]) for r in out if "warning" in r}
    assert warnings == {("rules", "Rules japanese not supported by zerolake, using chinese (area scoring) instead"),
                        ("overrideSettings", "Unknown config params"), ("includeOwnershipStdev", "not supported")}
    assert [r["turnNumber"] for r in out if "moveInfos" in r] == [2]


# ---------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------

def test_a_response_holds_the_documents_fields_from_blacks_side():
    [response] = serve(query(includeOwnership=True, includePolicy=True, includePVVisits=True,
                             includeMovesOwnership=True), visits=24)
    assert response["id"] == "q" and response["turnNumber"] == 2 and response["isDuringSearch"] is False
    infos = response["moveInfos"]
    assert infos and [m["order"] for m in infos] == list(range(len(infos)))
    assert sum(m["visits"] for m in infos) <= response["rootInfo"]["visits"] <= 24
    for m in infos:
        assert {"move", "visits", "winrate", "scoreMean", "scoreLead", "scoreSelfplay", "prior", "utility", "lcb",
                "utilityLcb", "order", "pv", "pvVisits", "ownership"} <= set(m)
        assert 0 <= m["winrate"] <= 1 and 0 <= m["prior"] <= 1 and m["pv"][0] == m["move"]
        assert len(m["pvVisits"]) == len(m["pv"]) and len(m["ownership"]) == 81
        # Black to move at turn 2: the heads say the player to move after the move (White) leads by 2.5.
        assert m["scoreLead"] == -2.5 and m["ownership"] == [-0.25] * 81
    root = response["rootInfo"]
    assert root["scoreLead"] == 2.5 and root["currentPlayer"] == "B" and len(root["thisHash"]) == 32
    assert response["ownership"] == [0.25] * 81
    policy = response["policy"]
    assert len(policy) == 82 and policy[40] == -1.0 and policy[6 * 9 + 2] == -1.0   # E5 and C3 are taken
    assert abs(sum(p for p in policy if p >= 0) - 1.0) < 1e-4 and policy[0] == max(policy)


def test_values_are_from_the_side_asked_for():
    white_to_move = query(moves=[["B", "E5"]])
    [black] = serve(white_to_move)
    [white] = serve(white_to_move, perspective=schema.WHITE)
    [mover] = serve(query(moves=[["B", "E5"]], overrideSettings={"reportAnalysisWinratesAs": "SIDETOMOVE"}))
    assert black["rootInfo"]["currentPlayer"] == "W"
    assert black["rootInfo"]["scoreLead"] == -2.5 and white["rootInfo"]["scoreLead"] == 2.5
    assert mover["rootInfo"]["scoreLead"] == 2.5
    assert abs(black["rootInfo"]["winrate"] + white["rootInfo"]["winrate"] - 1) < 1e-6


def test_analyze_turns_each_get_a_response_and_priorities_order_them():
    out = serve(query(analyzeTurns=[0, 1, 2], priorities=[0, 5, 1]))
    assert [r["turnNumber"] for r in out] == [1, 2, 0]
    assert [r["rootInfo"]["currentPlayer"] for r in sorted(out, key=lambda r: r["turnNumber"])] == ["B", "W", "B"]


def test_avoid_and_allow_restrict_the_roots_moves():
    [avoided] = serve(query(avoidMoves=[{"player": "B", "moves": ["D4", "F6", "pass"], "untilDepth": 1}]), visits=60)
    assert not {"D4", "F6", "pass"} & {m["move"] for m in avoided["moveInfos"]}
    [allowed] = serve(query(allowMoves=[{"player": "B", "moves": ["D4", "F6"], "untilDepth": 1}]), visits=30)
    assert {m["move"] for m in allowed["moveInfos"]} <= {"D4", "F6", "pass"}
    out = serve(query(avoidMoves=[{"player": "B", "moves": ["D4"], "untilDepth": 3}]))
    assert out[0]["field"] == "avoidMoves" and "root's moves only" in out[0]["warning"]


def test_query_version_and_clear_cache_echo_the_query():
    out = serve({"id": "v", "action": "query_version"}, {"id": "c", "action": "clear_cache"})
    assert out == [{"id": "v", "action": "query_version", "version": A.VERSION, "git_hash": "<omitted>"},
                   {"id": "c", "action": "clear_cache"}]


def test_terminate_drops_queued_turns_with_no_results_and_is_echoed():
    out = serve(query(id="long", analyzeTurns=[0, 1, 2]), {"id": "t", "action": "terminate", "terminateId": "long",
                                                          "turnNumbers": [1, 2]})
    # The terminate is read before any turn is searched (input is taken while a search runs, too).
    assert {"id": "long", "isDuringSearch": False, "noResults": True, "turnNumber": 1} in out
    assert {"id": "long", "isDuringSearch": False, "noResults": True, "turnNumber": 2} in out
    assert {"id": "t", "action": "terminate", "terminateId": "long", "turnNumbers": [1, 2]} in out
    assert [r["turnNumber"] for r in out if "moveInfos" in r] == [0]
    [error] = serve({"id": "t", "action": "terminate"})
    assert error == {"error": 'Requests for a terminate action must have a string "terminateId" field',
                     "field": "terminateId", "id": "t"}


def test_reports_during_search_come_before_the_final_one(monkeypatch):
    clock = iter(range(10**6))             # a second a look: every search step is past the next report's time
    monkeypatch.setattr(A.time, "monotonic", lambda: float(next(clock)))
    out = serve(query(reportDuringSearchEvery=0.5, maxVisits=200), visits=200)
    assert len(out) >= 2 and all(r["isDuringSearch"] for r in out[:-1]) and out[-1]["isDuringSearch"] is False
    assert out[-1]["rootInfo"]["visits"] >= out[0]["rootInfo"]["visits"]


def test_the_command_answers_a_published_models_analysis_on_stdin(tmp_path):
    """As a client runs it: queries in, one response line each, exit 0 at the end of input."""
    from testdata.models import publish_untrained_model

    root = str(tmp_path / "lake")
    publish_untrained_model(root, 1, 9, seed=1)
    queries = [{"id": "v", "action": "query_version"},
               query(id="a", analyzeTurns=[1, 2], includeOwnership=True, includePolicy=True, maxVisits=12)]
    result = subprocess.run([sys.executable, "-m", "arena.analysis", "--root", root],
                            input="\n".join(json.dumps(q) for q in queries) + "\n", capture_output=True, text=True,
                            cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = [json.loads(line) for line in result.stdout.splitlines()]
    assert out[0]["version"] == A.VERSION
    answers = [r for r in out if "moveInfos" in r]
    assert [r["turnNumber"] for r in answers] == [1, 2]
    for r in answers:
        assert r["moveInfos"] and len(r["ownership"]) == 81 and len(r["policy"]) == 82
        assert all(abs(v) <= 1 for v in r["ownership"]) and all(isinstance(m["scoreLead"], float) for m in r["moveInfos"])
    bad = subprocess.run([sys.executable, "-m", "arena.analysis"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert bad.returncode == 2 and "--root or --model" in bad.stderr and "Traceback" not in bad.stderr

"""format.events: SPEC.md's event table is the one the code generates; writers and readers round-trip."""
import pathlib

import pytest

from format import events as E

SPEC = pathlib.Path(__file__).resolve().parents[2] / "format" / "SPEC.md"


def test_specs_events_table_is_the_one_the_code_generates():
    """SPEC.md's table is written from format/events.py (python -m format.events), never by hand."""
    assert E.spec_table() in SPEC.read_text()
    assert E.spec_table().count("\n") == 1 + sum(len(events) for events in E.REQUIRED.values())


def test_round_trip_and_refusals(tmp_path):
    path = tmp_path / "ev.jsonl"
    log = E.EventLog(str(path), "worker")
    log.emit("game_finished", game_id="g", generation=2, moves=80, spool_entry="x", extra=1)
    with pytest.raises(ValueError, match="lacks"):
        log.emit("progress", games=1)
    with pytest.raises(ValueError, match="no event"):
        log.emit("teleported")
    log.close()
    (event,) = E.read_events(str(path))
    assert (event["role"], event["event"], event["moves"], event["extra"]) == ("worker", "game_finished", 80, 1)
    assert E.parse_event("[selfplay] games 3 positions 40") is None      # a human line is not an event
    with pytest.raises(E.EventError, match="version"):
        E.parse_event('{"schema": "zerolake.event", "version": 99, "role": "worker", "event": "started"}')


def test_a_tail_keeps_a_partial_line_until_it_ends(tmp_path):
    path = tmp_path / "ev.jsonl"
    tail = E.EventTail(str(path))
    assert tail.poll() == []                                             # no file yet
    log = E.EventLog(str(path), "shuffle")
    log.emit("waiting", new_positions=5, needed=10)
    with open(path, "a") as handle:
        handle.write('{"schema": "zerolake.event", "version": 1, "role": "shuffle"')
    assert [e["event"] for e in tail.poll()] == ["waiting"]
    with open(path, "a") as handle:
        handle.write(', "event": "stopped", "reason": "done", "time": 1, "pid": 1}\n')
    assert [e["event"] for e in tail.poll()] == ["stopped"]

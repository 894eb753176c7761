"""Logs as data: operations/vm/ship-logs.sh, run by zerolake-logging.service.

Run with stand-in ``systemctl`` and ``curl`` on PATH: a failed Ops Agent
install exits 1 (the unit, Restart=on-failure every 2 minutes, runs it again:
tests/operations/deploy/test_vm.py checks the unit), and an installed agent gets a
configuration whose one journald pipeline excludes every unit but zerolake's
and the start-up script (mode ``on``) and parses each event line's MESSAGE
as JSON, so Cloud Logging filters on jsonPayload.role / .event / .generation.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from format.events import EventLog
from tests.operations.deploy.support import VM


def _ship(tmp_path, mode: str, *, agent_installed: bool, curl_works: bool):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho \"systemctl $*\" >> {calls}\n"
                                       f"[ \"$1\" = cat ] && exit {0 if agent_installed else 1}\nexit 0\n")
    (bin_dir / "curl").write_text(f"#!/bin/sh\necho \"curl $*\" >> {calls}\nexit {0 if curl_works else 6}\n")
    for tool in ("systemctl", "curl"):
        (bin_dir / tool).chmod(0o755)
    result = subprocess.run([str(VM / "ship-logs.sh"), mode], capture_output=True, text=True, timeout=30,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                                 "ZEROLAKE_OPS_AGENT_DIR": str(tmp_path / "agent")})
    result.calls = calls.read_text().splitlines() if calls.exists() else []
    return result


def test_a_failed_agent_install_exits_1_so_its_unit_tries_again(tmp_path):
    result = _ship(tmp_path, "on", agent_installed=False, curl_works=False)
    assert result.returncode == 1 and "tries again in 2 minutes" in result.stdout
    assert any("add-google-cloud-ops-agent-repo.sh" in call for call in result.calls)
    assert not (tmp_path / "agent" / "config.yaml").exists()
    assert not any("restart" in call for call in result.calls)


def test_the_agent_ships_the_zerolake_units_with_their_events_parsed(tmp_path, capsys):
    result = _ship(tmp_path, "on", agent_installed=True, curl_works=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "systemctl restart google-cloud-ops-agent" in result.calls and not any("curl" in c for c in result.calls)
    config = yaml.safe_load((tmp_path / "agent" / "config.yaml").read_text())["logging"]
    assert config["receivers"] == {"zerolake_journal": {"type": "systemd_journald"}}
    pipelines = config["service"]["pipelines"]
    assert pipelines["default_pipeline"] == {"receivers": []}          # no second copy through syslog files
    assert pipelines["zerolake"] == {"receivers": ["zerolake_journal"],
                                     "processors": ["zerolake_units_only", "zerolake_events"]}
    processors = config["processors"]
    assert processors["zerolake_events"] == {"type": "parse_json", "field": "MESSAGE"}
    [rule] = processors["zerolake_units_only"]["match_any"]
    assert processors["zerolake_units_only"]["type"] == "exclude_logs"
    assert rule == ('NOT (jsonPayload._SYSTEMD_UNIT =~ "^zerolake-" OR '
                    'jsonPayload._SYSTEMD_UNIT = "google-startup-scripts.service")')
    # What parse_json turns into fields: one event line as a role writes it to the journal (--events -).
    EventLog("-", "worker").emit("model_loaded", generation=7)
    event = json.loads(capsys.readouterr().out)
    assert {"role": "worker", "event": "model_loaded", "generation": 7}.items() <= event.items()


def test_all_ships_the_whole_journal_and_a_bad_mode_is_refused(tmp_path):
    result = _ship(tmp_path, "all", agent_installed=True, curl_works=True)
    config = yaml.safe_load((tmp_path / "agent" / "config.yaml").read_text())["logging"]
    assert result.returncode == 0 and config["service"]["pipelines"]["zerolake"]["processors"] == ["zerolake_events"]
    bad = _ship(tmp_path, "some", agent_installed=True, curl_works=True)
    assert bad.returncode == 2 and "must be on or all, not 'some'" in bad.stderr


@pytest.mark.parametrize("logging, ok", [("on", True), ("all", True), ("off", True), ("verbose", False)])
def test_startup_takes_the_logging_modes(logging, ok, tmp_path):
    env = {"PATH": os.environ["PATH"], "ZEROLAKE_ROLE": "worker", "ZEROLAKE_ROOT": "gs://b/r",
           "ZEROLAKE_PACKAGE": str(tmp_path / "missing.tar.gz"), "ZEROLAKE_LOGGING": logging,
           "ZEROLAKE_ACCELERATOR": "tpu"}     # no tpu-generation: refused just after the logging check
    result = subprocess.run([str(VM / "startup.sh")], capture_output=True, text=True, timeout=30, env=env)
    assert result.returncode == 2
    expected = "needs tpu-generation" if ok else "logging 'verbose' is not on, all or off"
    assert expected in result.stderr, result.stderr

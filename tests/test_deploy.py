"""``python -m cloud.deploy``: the plan for each role and accelerator, checked against the installed gcloud.

* Every plan passes ``bash -n``.
* Every gcloud command in every plan is checked against the installed
  gcloud's own ``--help``: the command path exists and is a command (not a
  group), each flag is documented for it (or is a gcloud-wide flag), a flag
  that takes a value is given one and a switch is not, and a value of a flag
  whose help lists its choices ("X must be one of: ...") is one of them.
  ``gcloud ... --help`` takes ~2.5 s, so each page is cached in pytest's cache
  under the SDK's version (the first run of this file on a machine is the slow one).
* ``--apply`` refuses without gcloud or without an active account, and runs
  the plan through a stand-in gcloud that records its calls.
* ``status`` reads a lake (chunks, LATEST, the trainer's lease) into one table.
* The start-up scripts pass ``bash -n`` and the systemd units pass
  ``systemd-analyze verify``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from cloud.deploy import plan as P
from cloud.deploy.__main__ import main as deploy_main
from cloud.deploy.config import DeployConfig
from cloud.deploy.status import read_status, table
from cloud.storage import open_storage
from format import codec, layout
from model.lease import LeaseRecord
from testdata.synthetic_games import synthetic_game

REPO = pathlib.Path(__file__).resolve().parents[1]
GCLOUD = shutil.which("gcloud")
needs_gcloud = pytest.mark.skipif(GCLOUD is None, reason="the Google Cloud CLI (gcloud) is not installed")

BASE = ["--project", "zl-test-project", "--root", "gs://zl-test-bucket/run1"]
SCENARIOS = {
    # the acceptance example: GPU workers, TPU trainer
    "gpu-workers-tpu-trainer": ["--workers", "8", "--worker-gpu", "nvidia-l4", "--trainer-tpu", "v5litepod-8"],
    "cpu-workers-cpu-trainer": ["--workers", "3", "--trainer-cpu", "--no-spot"],
    "t4-workers-multi-gpu-trainer": ["--workers", "2", "--worker-gpu", "nvidia-tesla-t4", "--worker-gpu-count", "2",
                                     "--trainer-gpu", "nvidia-a100-80gb", "--trainer-gpu-count", "4"],
    "dataflow-shuffle-spot-tpu": ["--workers", "20", "--worker-gpu", "nvidia-tesla-a100", "--trainer-tpu", "v4-8",
                                  "--trainer-spot", "--worker-args", "--visits 128 --board-size 19"],
    "forced-dataflow-t4-trainer": ["--workers", "1", "--shuffle-runner", "dataflow", "--trainer-gpu",
                                   "nvidia-tesla-t4"],
}
DOWN_SCENARIOS = {
    "down-all": ["down", "--delete-account"],
    "scale-down-workers": ["down", "--workers-only", "--keep-workers", "4"],
}


def run_deploy(argv, capsys) -> tuple[int, str, str]:
    try:
        code = deploy_main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def plan_text(argv, capsys) -> str:
    code, out, err = run_deploy(argv, capsys)
    assert code == 0, err
    return out


# ---- reading gcloud's own help ---------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _sdk_version() -> str:
    root = pathlib.Path(os.path.realpath(GCLOUD)).parent.parent
    version = root / "VERSION"
    return version.read_text().strip() if version.exists() else "unknown"


@pytest.fixture(scope="module")
def gcloud_help(request):
    """help(path) -> gcloud's --help text for a command path, cached per SDK version."""
    cache, memory = request.config.cache, {}
    version = _sdk_version() if GCLOUD else "none"

    def help_text(path: tuple[str, ...]) -> str:
        if path not in memory:
            key = f"zerolake/gcloud-help/{version}/{'_'.join(path) or 'gcloud'}"
            text = cache.get(key, None)
            if text is None:
                result = subprocess.run([GCLOUD, *path, "--help"], capture_output=True, text=True, timeout=120,
                                        env={**os.environ, "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "PAGER": "cat"})
                text = ANSI.sub("", result.stdout + result.stderr)
                if result.returncode == 0:
                    cache.set(key, text)
            memory[path] = text
        return memory[path]

    return help_text


@dataclasses.dataclass
class HelpPage:
    """What one leaf command's help documents."""

    name: str
    flags: dict          # flag -> True if it takes a value
    choices: dict        # flag -> allowed values (only where the help lists them)


def is_group(text: str) -> bool:
    return bool(re.search(r"^(GROUPS|COMMANDS)$", text, re.M))


def parse_help(text: str) -> HelpPage:
    name = re.search(r"^NAME\n\s+(gcloud[^\n]*?) - ", text, re.M)
    flags: dict = {}
    metavars: dict = {}
    for match in re.finditer(r"(?<![\w-])--(\[no-\])?([a-z0-9][a-z0-9-]*)(=\[?([A-Za-z][A-Za-z0-9_]*)?)?", text):
        negatable, flag, valued, metavar = match.group(1), "--" + match.group(2), match.group(3), match.group(4)
        flags[flag] = flags.get(flag, False) or bool(valued)
        metavar = metavar if metavar and metavar.isupper() else None
        if negatable:
            flags["--no-" + match.group(2)] = False
        if metavar:
            metavars.setdefault(metavar, flag)
    wide = re.search(r"GCLOUD WIDE FLAGS\n\s+These flags are available to all commands: (.*?)\.\n", text, re.S)
    assert wide, "no GCLOUD WIDE FLAGS section in the help"
    for flag in re.findall(r"--[a-z-]+", wide.group(1)):
        flags[flag] = flag not in ("--help", "--log-http", "--quiet", "--user-output-enabled")
    choices = {}
    for match in re.finditer(r"([A-Z][A-Z0-9_]*) must be one of:(.*?)(?:\n\n(?=\s{5}--)|\n\S|\Z)", text, re.S):
        body = match.group(2)
        inline = body.split("\n")[0].strip()
        values = re.findall(r"[A-Za-z0-9_.-]+", inline) if inline else \
            re.findall(r"^\s{8,10}([A-Za-z0-9_.-]+)\s*$", body, re.M)
        if match.group(1) in metavars and values:
            choices[metavars[match.group(1)]] = set(values)
    return HelpPage(name.group(1) if name else "", flags, choices)


def gcloud_invocations(script: str) -> list[list[str]]:
    """Every gcloud command line in a shell script, as words (up to a shell operator)."""
    joined = script.replace("\\\n", " ")
    invocations = []
    for line in joined.splitlines():
        if line.lstrip().startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
        lexer.whitespace_split = True
        words = list(lexer)
        for i, word in enumerate(words):
            if word == "gcloud":
                rest = []
                for w in words[i + 1:]:
                    if w and set(w) <= set(";&|()<>"):
                        break
                    rest.append(w)
                invocations.append(rest)
    return invocations


def check_invocation(words: list[str], help_text) -> list[str]:
    """Problems of one gcloud command line against gcloud's help ([] = none)."""
    positional = [w for w in words if not w.startswith("-")]
    path: tuple[str, ...] = ()
    for word in positional:
        text = help_text(path)
        if not is_group(text):
            break
        path += (word,)
    text = help_text(path)
    if is_group(text) or "ERROR" in text[:200]:
        return [f"`gcloud {' '.join(path)}` is not a gcloud command: {text[:200]}"]
    page = parse_help(text)
    if page.name.split() != ["gcloud", *path]:
        return [f"help of `gcloud {' '.join(path)}` names {page.name!r}"]
    problems = []
    for word in words:
        if not word.startswith("--"):
            continue
        flag, has_value, value = word.partition("=")
        if flag not in page.flags:
            problems.append(f"gcloud {' '.join(path)}: {flag} is not documented")
        elif page.flags[flag] != bool(has_value):
            problems.append(f"gcloud {' '.join(path)}: {word} " +
                            ("needs =VALUE" if page.flags[flag] else "takes no value"))
        elif flag in page.choices and value not in page.choices[flag]:
            problems.append(f"gcloud {' '.join(path)}: {word}: not one of {sorted(page.choices[flag])}")
    return problems


# ---- the plans -------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", sorted(SCENARIOS) + sorted(DOWN_SCENARIOS))
def test_every_plan_is_valid_bash(scenario, capsys, tmp_path):
    argv = DOWN_SCENARIOS.get(scenario, ["plan"] + SCENARIOS.get(scenario, [])) + BASE
    script = tmp_path / "plan.sh"
    script.write_text(plan_text(argv, capsys))
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@needs_gcloud
def test_every_gcloud_command_and_flag_is_documented_by_the_installed_gcloud(capsys, gcloud_help):
    problems, checked = [], set()
    for argv in [["plan", *s] for s in SCENARIOS.values()] + list(DOWN_SCENARIOS.values()):
        for words in gcloud_invocations(plan_text(argv + BASE, capsys)):
            key = tuple(words)
            if key not in checked:
                checked.add(key)
                problems += check_invocation(words, gcloud_help)
    assert len(checked) > 20
    assert not problems, "\n".join(problems)


@needs_gcloud
def test_the_checker_catches_an_undocumented_flag_a_missing_value_and_a_bad_choice(gcloud_help):
    good = ["compute", "instances", "create", "vm", "--zone=us-central1-a", "--provisioning-model=SPOT"]
    assert check_invocation(good, gcloud_help) == []
    assert check_invocation(good + ["--no-such-flag=1"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--zone"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--provisioning-model=CHEAP"], gcloud_help)
    assert check_invocation(["compute", "instances", "create", "vm", "--preemptible=yes"], gcloud_help)
    assert check_invocation(["compute", "instances", "launch", "vm"], gcloud_help)
    assert check_invocation(["compute", "instances"], gcloud_help)


def test_invocations_are_found_inside_conditions_and_pipelines():
    script = ("if ! gcloud a b --x=1 >/dev/null 2>&1; then\n  gcloud c d \\\n    --y=2\nfi\n"
              "gcloud e f --z='p q' | while read -r n; do gcloud g \"$n\" --w </dev/null; done\n")
    assert gcloud_invocations(script) == [["a", "b", "--x=1"], ["c", "d", "--y=2"], ["e", "f", "--z=p q"],
                                          ["g", "$n", "--w"]]


def _creates(script: str, what: tuple[str, ...]) -> list[list[str]]:
    n = len(what)
    return [w for w in gcloud_invocations(script) if tuple(w[:n]) == what]


def test_the_acceptance_plan_holds_every_part(capsys):
    script = plan_text(["plan"] + SCENARIOS["gpu-workers-tpu-trainer"] + BASE, capsys)
    workers = [w for w in _creates(script, ("compute", "instances", "create")) if "-worker-" in w[3]]
    assert [w[3] for w in workers] == [f"zerolake-worker-{i:03d}" for i in range(8)]
    for words in workers:
        assert {"--provisioning-model=SPOT", "--instance-termination-action=STOP", "--machine-type=g2-standard-8",
                "--maintenance-policy=TERMINATE", "--image-project=deeplearning-platform-release"} <= set(words)
        assert not any(w.startswith("--accelerator") for w in words)     # G2 machines come with their L4
        metadata = next(w for w in words if w.startswith("--metadata="))
        assert "zerolake-accelerator=gpu" in metadata and "install-nvidia-driver=True" in metadata
        assert f"--metadata-from-file=startup-script={P.STARTUP_SCRIPT}" in words
    [tpu] = _creates(script, ("compute", "tpus", "tpu-vm", "create"))
    assert "--accelerator-type=v5litepod-8" in tpu and "zerolake-accelerator=tpu" in " ".join(tpu)
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    # auto: 8 workers' windows start small, on the follower VM; the large ones later go to Dataflow.
    assert "--image-family=debian-12" in shuffle and "--dataflow-above-positions=1000000" in " ".join(shuffle)
    assert _creates(script, ("storage", "buckets", "create")) and _creates(script, ("iam", "service-accounts",
                                                                                    "create"))
    assert _creates(script, ("storage", "cp"))[0][-2] == "gs://zl-test-bucket/zerolake-deploy/zerolake/zerolake.tar.gz"
    # Section order: bucket and account before anything that uses them, VMs last.
    order = [script.index(marker) for marker in ("buckets create", "service-accounts create", "storage cp",
                                                 "instances create", "tpu-vm create")]
    assert order == sorted(order)


def test_accelerator_kinds(capsys):
    t4 = plan_text(["plan"] + SCENARIOS["t4-workers-multi-gpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(t4, ("compute", "instances", "create"))}
    assert "--accelerator=type=nvidia-tesla-t4,count=2" in creates["zerolake-worker-000"]   # N1: attached
    assert "--machine-type=a2-ultragpu-4g" in creates["zerolake-trainer"]
    assert "zerolake-processes=8" in " ".join(creates["zerolake-worker-000"])                  # 4 per GPU
    assert not any("SPOT" in w for w in creates["zerolake-trainer"])                            # trainer: standard
    cpu = plan_text(["plan"] + SCENARIOS["cpu-workers-cpu-trainer"] + BASE, capsys)
    creates = {w[3]: w for w in _creates(cpu, ("compute", "instances", "create"))}
    assert "--image-family=debian-12" in creates["zerolake-worker-002"]
    assert not any("SPOT" in w or "nvidia" in w for w in creates["zerolake-worker-002"])         # --no-spot, CPU
    assert "zerolake-accelerator=cpu" in " ".join(creates["zerolake-trainer"])
    assert "tpu.googleapis.com" not in cpu and not _creates(cpu, ("compute", "tpus", "tpu-vm", "create"))


def test_dataflow_shuffle_gets_its_apis_roles_and_beam_flags(capsys):
    script = plan_text(["plan"] + SCENARIOS["dataflow-shuffle-spot-tpu"] + BASE, capsys)
    [shuffle] = [w for w in _creates(script, ("compute", "instances", "create")) if w[3] == "zerolake-shuffle"]
    metadata = next(w for w in shuffle if w.startswith("--metadata="))
    for flag in ("--runner=DataflowRunner", "--region=us-central1", "--setup_file=/opt/zerolake/src/setup.py",
                 "--temp_location=gs://zl-test-bucket/zerolake-deploy/zerolake/dataflow-tmp",
                 "--service_account_email=zerolake-runner@zl-test-project.iam.gserviceaccount.com"):
        assert flag in metadata
    assert "dataflow.googleapis.com" in script
    roles = {w[w.index("add-iam-policy-binding") + 2] for w in gcloud_invocations(script)
             if "add-iam-policy-binding" in w and w[0] == "projects"}
    assert {"--member=serviceAccount:zerolake-runner@zl-test-project.iam.gserviceaccount.com"} == roles
    assert "--spot" in _creates(script, ("compute", "tpus", "tpu-vm", "create"))[0]
    worker = _creates(script, ("compute", "instances", "create"))[0]
    assert "zerolake-args=--visits 128 --board-size 19" in " ".join(worker)
    # --shuffle-runner auto (the default): the follower chooses per window, by its size.
    assert "--dataflow-above-positions=1000000 --runner=DataflowRunner" in metadata
    assert "up to 1,000,000 positions, larger ones on Dataflow" in script
    # local: never Dataflow; dataflow: every window there.
    local = plan_text(["plan", "--workers", "2", "--shuffle-runner", "local"] + BASE, capsys)
    assert "DataflowRunner" not in local and "dataflow.googleapis.com" not in local
    forced = plan_text(["plan", "--dataflow-above-positions", "5"] + SCENARIOS["forced-dataflow-t4-trainer"] + BASE,
                       capsys)
    assert "--runner=DataflowRunner" in forced and "--dataflow-above-positions" not in forced


def test_the_follower_parses_the_plans_shuffle_flags_and_chooses_per_window(capsys):
    """The plan's shuffle args, as startup.sh passes them, give pipeline.shuffle --follow its per-window choice."""
    import shlex

    from cloud.deploy.config import DeployConfig
    from cloud.deploy.plan import shuffle_runner_args
    from pipeline import follow as F
    from pipeline.shuffle import build_parser

    config = DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/run1", workers=2,
                          dataflow_above_positions=300_000)
    args, beam_args = build_parser().parse_known_args(["--root", config.root, "--follow",
                                                       *shlex.split(shuffle_runner_args(config))])
    assert args.dataflow_above_positions == 300_000 and F.names_dataflow(beam_args)
    code, _, err = run_deploy(["plan", "--dataflow-above-positions", "0"] + BASE, capsys)
    assert code == 2 and "--dataflow-above-positions: must be at least 1" in err


def test_only_prints_the_sections_asked_for(capsys):
    script = plan_text(["plan", "--only", "workers", "--workers", "2"] + BASE, capsys)
    assert [w[:3] for w in gcloud_invocations(script)] == [["compute", "instances", "describe"],
                                                           ["compute", "instances", "create"]] * 2


def test_down_selects_by_label_and_keeps_the_bucket(capsys):
    script = plan_text(DOWN_SCENARIOS["down-all"] + BASE, capsys)
    assert "buckets delete" not in script and "storage rm" not in script
    assert "labels.zerolake-deployment=zerolake" in script
    assert _creates(script, ("iam", "service-accounts", "delete"))
    scale = plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys)
    assert ">= 4" in scale and "tpu-vm" not in scale


def test_scale_down_deletes_only_workers_from_the_index_up(tmp_path, capsys):
    """Run the scale-down plan with a stand-in gcloud that lists five workers."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    f"echo \"$*\" >> {log}\n"
                    "if [[ $1 == compute && $3 == list ]]; then\n"
                    "  for i in 000 001 003 004 009; do echo \"zerolake-worker-$i us-central1-a\"; done\nfi\n")
    fake.chmod(0o755)
    script = tmp_path / "down.sh"
    script.write_text(plan_text(DOWN_SCENARIOS["scale-down-workers"] + BASE, capsys))
    subprocess.run(["bash", str(script)], check=True, env={**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"})
    deleted = [line.split()[3] for line in log.read_text().splitlines() if " delete " in line]
    assert deleted == ["zerolake-worker-004", "zerolake-worker-009"]


def test_nothing_secret_is_in_any_plan(capsys):
    for argv in [["plan", *s] for s in SCENARIOS.values()] + list(DOWN_SCENARIOS.values()):
        script = plan_text(argv + BASE, capsys)
        for secret in ("keys create", "private_key", "GOOGLE_APPLICATION_CREDENTIALS", "access_token", "password",
                       "print-access-token"):
            assert secret not in script, (argv, secret)


@pytest.mark.parametrize("argv, flag", [
    (["--worker-gpu", "nvidia-gtx-1080"], "--worker-gpu"),
    (["--root", "/local/lake"], "--root"),
    (["--project", "X"], "--project"),
    (["--trainer-tpu", "v5litepod-8", "--trainer-gpu", "nvidia-l4"], "--trainer-tpu"),
    (["--worker-gpu", "nvidia-l4", "--worker-gpu-count", "3"], "--worker-gpu-count"),
    (["--worker-args", "--visits 1,2"], "--worker-args"),
    (["--only", "workers,nonsense"], "--only"),
])
def test_bad_flags_exit_2_naming_the_flag(argv, flag, capsys):
    code, out, err = run_deploy(["plan"] + BASE + argv, capsys)
    assert code == 2 and flag in err and "Traceback" not in err and out == ""


def test_apply_refuses_without_gcloud_or_without_an_account(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))          # no gcloud on PATH
    code, out, err = run_deploy(["plan", "--workers", "1", "--apply"] + BASE, capsys)
    assert code == 2 and "`gcloud` is not on PATH" in err and out == ""
    fake = tmp_path / "gcloud"
    fake.write_text("#!/bin/sh\nexit 0\n")             # installed, nobody logged in
    fake.chmod(0o755)
    code, out, err = run_deploy(["plan", "--workers", "1", "--apply"] + BASE, capsys)
    assert code == 2 and "no active account" in err and "gcloud auth login" in err


def test_apply_runs_the_plan_through_gcloud(tmp_path, capsys, monkeypatch):
    """A stand-in gcloud: logged in, every describe fails (nothing exists), so each create runs."""
    log = tmp_path / "calls"
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir()
    fake.write_text("#!/usr/bin/env bash\n"
                    "if [[ $1 == auth ]]; then echo someone@example.com; exit 0; fi\n"
                    f"echo \"$*\" >> {log}\n"
                    "[[ $* == *describe* ]] && exit 1\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    argv = ["plan", "--only", "workers,trainer", "--workers", "2", "--trainer-tpu", "v4-8", "--apply"] + BASE
    code, _, err = run_deploy(argv, capsys)
    assert code == 0, err
    calls = log.read_text().splitlines()
    assert [c.split()[:4] for c in calls if "create" in c] == [
        ["compute", "instances", "create", "zerolake-worker-000"],
        ["compute", "instances", "create", "zerolake-worker-001"],
        ["compute", "tpus", "tpu-vm", "create"]]


# ---- status -----------------------------------------------------------------------------

def test_status_reads_generations_games_workers_and_the_lease(tmp_path, capsys):
    storage = open_storage(str(tmp_path / "lake"))
    rng = np.random.default_rng(1)
    now = time.time()
    for seq, (worker, minutes_ago, games) in enumerate([("vmA_11_aa", 5, 4), ("vmB_12_bb", 20, 4),
                                                        ("vmA_13_cc", 300, 2)]):
        chunk = codec.encode_chunk([synthetic_game(rng, 9, visits=8) for _ in range(games)])
        storage.write_new(layout.chunk_path(0, worker, int((now - minutes_ago * 60) * 1000), seq), chunk)
    storage.write_new(layout.LATEST, b"3\n")
    lease = LeaseRecord(holder="tpu-host:42:abcd", host="tpu-host", pid=42, acquired=now - 100, renewed=now - 5,
                        expires=now + 55)
    storage.write_new(layout.TRAINER_LEASE, lease.to_bytes())
    status = read_status(storage, recent_minutes=60, now=now)
    assert (status.latest_model, status.chunks, status.recent_chunks, status.worker_processes) == (3, 3, 2, 2)
    assert status.worker_machines == ("vmA", "vmB")
    assert status.games_per_hour == pytest.approx(8.0)          # 8 games in the last hour (all sampled)
    assert "held by tpu-host:42:abcd" in status.lease
    text = table(status)
    assert len(text.splitlines()) == 8 and "games per hour" in text
    code, out, err = run_deploy(["status", "--root", str(tmp_path / "lake")], capsys)
    assert code == 0 and "tpu-host:42:abcd" in out, err


def test_status_of_an_empty_lake_and_of_a_released_lease(tmp_path):
    storage = open_storage(str(tmp_path / "lake"))
    status = read_status(storage)
    assert (status.latest_model, status.newest_window, status.games_per_hour) == (None, None, 0.0)
    assert status.lease.startswith("none")
    now = time.time()
    storage.write_new(layout.TRAINER_LEASE, LeaseRecord("h:1:x", "h", 1, now - 9, now - 9, now - 1, True).to_bytes())
    assert read_status(storage, now=now).lease.startswith("released by h:1:x")


# ---- the VM files -----------------------------------------------------------------------

VM = REPO / "cloud" / "vm"


@pytest.mark.parametrize("script", ["install.sh", "startup.sh", "run-role.sh"])
def test_vm_scripts_are_valid_bash_and_executable(script):
    path = VM / script
    assert os.access(path, os.X_OK), f"{path} is not executable"
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_units_verify(tmp_path):
    """systemd-analyze verify, with ExecStart pointed at this checkout's run-role.sh
    (verify checks that the command exists; on a VM it is /opt/zerolake/src/...)."""
    units = []
    for unit in sorted((VM / "systemd").glob("*.service")):
        text = unit.read_text()
        assert "Restart=always" in text and "StandardOutput=journal" in text and "KillSignal=SIGTERM" in text
        assert "ExecStart=/opt/zerolake/src/cloud/vm/run-role.sh" in text
        text = text.replace("/opt/zerolake/src/cloud/vm/run-role.sh", str(VM / "run-role.sh"))
        name = unit.name.replace("@.service", "@0.service")
        (tmp_path / name).write_text(text)
        units.append(name)
    assert units == ["zerolake-shuffle.service", "zerolake-trainer.service", "zerolake-worker@0.service"]
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


def test_the_worker_stops_within_the_spot_notice():
    """The worker unit's stop timeout fits in the ~30 s a spot VM gets after its preemption notice."""
    text = (VM / "systemd" / "zerolake-worker@.service").read_text()
    timeout = int(re.search(r"^TimeoutStopSec=(\d+)$", text, re.M).group(1))
    assert 0 < timeout < 30 and "KillMode=mixed" in text


def test_the_plan_points_at_files_that_exist():
    assert P.STARTUP_SCRIPT.exists() and (REPO / "Dockerfile").exists()
    assert "cloud/vm/install.sh" in (REPO / "Dockerfile").read_text()
    assert "cloud/vm/install.sh" in P.STARTUP_SCRIPT.read_text()
    json.dumps(dataclasses.asdict(DeployConfig(project="zl-test-project", root="gs://zl-test-bucket/r")))
    assert sys.executable

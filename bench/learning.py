"""A/B test of a learning change: two arms of short loop runs from one generation-0 lake, then matches.

    python bench/learning.py --out /work/ab/gumbel --arm-b "--worker-gumbel --worker-visits 16"
    python bench/learning.py --out /work/ab/gumbel ...      # the same command resumes where it stopped

Terms
-----
* *arm*: the loop's flags of one side.  Arm A is the baseline (``--arm-a``,
  default none: current main's defaults), arm B the change (``--arm-b``).
* *run*: one ``python -m pipeline.loop`` of one arm with one seed, for
  ``--minutes`` of wall clock (long-run planning: full self-play generations,
  no generation limit; the closing matches cut to a minimum).
* *base*: the shared generation-0 lake (run.json and the generation-0 games
  of random-playout MCTS, made once by the worker as the loop would, and the
  loop's own "self-play 0 done" marker).  Every run starts from a copy of it,
  so the arms differ only from generation 1 on.
* *CPU seconds* of a run: user + system time of the loop and every process
  under it (``os.wait4``'s rusage), summed over its invocations.
* *Outside load* of a run: CPU time the machine spent on anything else
  while the run went (the busy time of /proc/stat's ``cpu`` line over the
  run, less the run's own CPU seconds), as a share of the machine's
  capacity (wall seconds x cores).  A result is refused, not judged, when
  any run's outside load is above ``--max-outside-load``: the machine was
  loaded, and that run got less than the others.  The arms' CPU seconds are
  reported, not judged: a change that keeps the cores busier (fewer idle
  phases) makes more of the same machine-hour, which is what is measured.
  Runs recorded before the outside load was measured fall back to the old
  rule: refused when the arms' mean CPU seconds differ by more than
  ``--max-cpu-gap``.

The protocol (what makes a result worth keeping):

1. ``--seeds`` runs per arm (2; 3 when the expected effect is under 75 Elo).
2. Cross-arm matches between the final models, every B run against every A
   run, ``--cross-games`` games in all (400) at ``--visits`` (64) a move.
   Each opening is played with both colours: games 2k and 2k+1 start with
   the same ``--paired-openings`` random moves (``selfplay.match
   --paired-openings``), and the players then search without sampling, so a
   colour's edge in an opening cancels.  Only distinct games count (two
   games with the same colours and moves are one).
3. Within-arm matches (seed against seed, ``--within-games`` each) are the
   noise control: how far apart two runs of the same code land.
4. Keep B only if the cross-arm effect's 95% lower bound is above 0 and the
   effect exceeds the within-arm spread (the larger |Elo| of the within-arm
   matches).

Elo from a score fraction p is ``400 log10(p / (1 - p))``; its interval is
the Wilson interval of p mapped the same way (monotone), clamped at
+-800 for shut-outs.  Ends with one JSON line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from format import layout  # noqa: E402
from format.match_record import MatchRecord  # noqa: E402
from format.sgf import game_from_sgf  # noqa: E402
from selfplay.match import wilson_interval  # noqa: E402

ELO_CLAMP = 800.0
"""|Elo| reported for a shut-out (a score of 0 or 1 has no finite Elo)."""


# --------------------------------------------------------------------------
# Statistics: pure functions, unit-tested
# --------------------------------------------------------------------------

def elo_of(score: float) -> float:
    """Elo difference implied by a score fraction (clamped at +-ELO_CLAMP)."""
    if score <= 0:
        return -ELO_CLAMP
    if score >= 1:
        return ELO_CLAMP
    return max(-ELO_CLAMP, min(ELO_CLAMP, 400.0 * math.log10(score / (1.0 - score))))


@dataclasses.dataclass(frozen=True)
class MatchTally:
    """Distinct games of one side against another: ``score`` = wins + draws / 2."""

    games: int
    score: float

    def __add__(self, other: "MatchTally") -> "MatchTally":
        return MatchTally(self.games + other.games, self.score + other.score)

    def elo(self) -> tuple[float, float, float]:
        """(Elo, 95% low, 95% high) of this side."""
        if not self.games:
            return 0.0, -ELO_CLAMP, ELO_CLAMP
        low, high = wilson_interval(self.score, self.games)
        return elo_of(self.score / self.games), elo_of(low), elo_of(high)


def cpu_gap(cpu_a: list[float], cpu_b: list[float]) -> float:
    """Relative gap between the arms' mean CPU seconds per run (0 = equal)."""
    mean_a, mean_b = sum(cpu_a) / len(cpu_a), sum(cpu_b) / len(cpu_b)
    return abs(mean_a - mean_b) / max(mean_a, mean_b, 1e-9)


def outside_load(record: dict) -> float | None:
    """A run's outside load (module docstring), or None for a run recorded before it was measured."""
    if "outside_cpu_seconds" not in record or not record.get("wall_seconds"):
        return None
    return max(0.0, record["outside_cpu_seconds"]) / (record["wall_seconds"] * record.get("cores", 1))


def decide(cross: MatchTally, within: list[MatchTally], gap: float, max_gap: float,
           loads: dict[str, float | None] | None = None, max_load: float = 0.05) -> dict:
    """The protocol's verdict: 'keep', 'drop', or 'refused' (a loaded machine).

    ``loads``: each run's outside load; when every run has one, a run above
    ``max_load`` refuses the result; otherwise (older records) a CPU-time
    ``gap`` between the arms above ``max_gap`` does."""
    effect, low, high = cross.elo()
    spread = max((abs(t.elo()[0]) for t in within if t.games), default=float("nan"))
    verdict = {"cross_elo": round(effect, 1), "cross_elo_low": round(low, 1), "cross_elo_high": round(high, 1),
               "cross_games": cross.games, "within_spread_elo": round(spread, 1) if math.isfinite(spread) else None,
               "cpu_gap": round(gap, 3)}
    measured = bool(loads) and all(load is not None for load in loads.values())
    if measured:
        verdict["outside_load"] = {run: round(load, 3) for run, load in loads.items()}
    loaded = sorted(run for run, load in (loads or {}).items() if measured and load > max_load)
    if loaded:
        verdict["decision"] = "refused"
        verdict["why"] = (f"the machine was loaded during run {', '.join(loaded)}: other processes took "
                          f"{max(loads[r] for r in loaded):.0%} of its CPU (more than {max_load:.0%})")
    elif not measured and gap > max_gap:
        verdict["decision"] = "refused"
        verdict["why"] = (f"the arms' CPU time differs by {gap:.0%} (more than {max_gap:.0%}), and the runs "
                          f"do not record the outside load that would tell a loaded machine from the arm's own use")
    elif low > 0 and math.isfinite(spread) and effect > spread:
        verdict["decision"] = "keep"
        verdict["why"] = f"B is {effect:+.0f} Elo [{low:+.0f}, {high:+.0f}], above the within-arm spread {spread:.0f}"
    else:
        verdict["decision"] = "drop"
        verdict["why"] = (f"B is {effect:+.0f} Elo [{low:+.0f}, {high:+.0f}]; keeping needs the low end above 0 "
                          f"and the effect above the within-arm spread ({spread:.0f})")
    return verdict


def tally_match(record: MatchRecord) -> MatchTally:
    """Player A's tally over the distinct games of one ``selfplay.match --json`` result.

    Each game's moves come from its SGF file (the match's ``--sgf-dir``); two
    games with the same colours and moves are one game."""
    if not record.game_results or any(game.sgf is None for game in record.game_results):
        raise ValueError(f"the match {record.player_a} vs {record.player_b} kept no SGF of its games "
                         "(bench/learning.py plays its matches with --sgf-dir)")
    seen, score = set(), 0.0
    for game in record.game_results:
        with open(game.sgf, "rb") as handle:
            key = (game.black, tuple(game_from_sgf(handle.read())[2]))
        if key in seen:
            continue
        seen.add(key)
        if game.result.startswith("0") or game.result.lower().startswith("draw"):
            score += 0.5
        elif (game.result.startswith("B+") and game.black == record.player_a) or \
                (game.result.startswith("W+") and game.white == record.player_a):
            score += 1.0
    return MatchTally(len(seen), score)


# --------------------------------------------------------------------------
# Running: the base, the runs, the matches
# --------------------------------------------------------------------------

def say(text: str) -> None:
    print(f"[learning {time.strftime('%H:%M:%S')}] {text}", flush=True)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy since boot, all cores (/proc/stat's ``cpu`` line:
    every field but idle and iowait; guest time is already inside user and nice)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_measured(argv: list[str], log_path: str) -> tuple[int, float, float, float]:
    """Run ``argv`` with its output in ``log_path``; (exit status, CPU seconds of it and its children,
    CPU seconds the machine spent on anything else meanwhile, wall seconds)."""
    busy, started = machine_busy_seconds(), time.monotonic()
    with open(log_path, "ab") as log:
        child = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    own = usage.ru_utime + usage.ru_stime
    return (os.waitstatus_to_exitcode(status), own, machine_busy_seconds() - busy - own,
            time.monotonic() - started)


def make_base(args, base: str) -> None:
    """The shared generation-0 lake: the worker plays generation 0 as the loop would, then the
    loop's own marker says so (format.layout.loop_marker), so each run starts at generation 1."""
    marker = os.path.join(base, layout.loop_marker(f"selfplay-{layout.generation_dir(0)}.done"))
    if os.path.exists(marker):
        return
    shutil.rmtree(base, ignore_errors=True)
    say(f"making the shared generation-0 lake in {base} ({args.base_seconds:g} s of self-play)")
    code, *_ = run_measured([sys.executable, "-m", "selfplay.worker", "--root", base, "--games", "64",
                            "--max-seconds", f"{args.base_seconds:g}", "--seed", "1000", "--worker-id", "loop0",
                            "--spool-dir", os.path.join(args.out, "spool-base"), *shlex.split(args.base_flags)],
                           os.path.join(args.out, "base.log"))
    if code:
        sys.exit(f"bench/learning.py: the generation-0 worker failed (exit {code}); see {args.out}/base.log")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w") as handle:
        json.dump({"seconds": round(args.base_seconds)}, handle)


def run_arm(args, base: str, arm: str, flags: str, seed: int) -> dict:
    """One run (resumable: the loop resumes from its lake, CPU seconds add up in run.json)."""
    name = f"{arm}{seed}"
    root = os.path.join(args.out, "runs", name)
    record_path = os.path.join(args.out, "runs", f"{name}.json")
    record = {"cpu_seconds": 0.0, "invocations": 0}
    if os.path.exists(record_path):
        with open(record_path) as handle:
            record = json.load(handle)
        if record.get("done"):
            return record
    if not os.path.exists(root):
        shutil.copytree(base, root)
    say(f"run {name}: {args.minutes:g} min, loop flags: {flags or '(defaults)'}")
    argv = [sys.executable, "-m", "pipeline.loop", "--root", root, "--hours", f"{args.minutes / 60:.6f}",
            "--seed", str(seed), "--final-gnugo-games", "0", "--final-eval-games", "2", "--eval-games", "2",
            *shlex.split(flags)]
    code, cpu, outside, wall = run_measured(argv, os.path.join(args.out, "runs", f"{name}.log"))
    record["cpu_seconds"] += cpu
    if record["invocations"] == 0 or "outside_cpu_seconds" in record:   # not for a run begun unmeasured
        record["outside_cpu_seconds"] = record.get("outside_cpu_seconds", 0.0) + outside
        record["wall_seconds"] = record.get("wall_seconds", 0.0) + wall
        record["cores"] = len(os.sched_getaffinity(0))
    record["invocations"] += 1
    record["done"] = code == 0
    record["exit"] = code
    with open(record_path, "w") as handle:
        json.dump(record, handle)
    if code:
        sys.exit(f"bench/learning.py: run {name} failed (exit {code}); see its log; rerun to resume")
    return record


def play_match(args, first: str, second: str, games: int, seed: int) -> MatchTally:
    """``first``'s distinct-game tally against ``second`` (run names); the result and SGFs are kept."""
    name = f"{first}-vs-{second}"
    result_path = os.path.join(args.out, "matches", f"{name}.json")
    if not os.path.exists(result_path):
        say(f"match {first} vs {second}: {games} games at {args.visits} visits")
        runs = os.path.join(args.out, "runs")
        completed = subprocess.run(
            [sys.executable, "-m", "selfplay.match", f"model:{os.path.join(runs, first)}",
             f"model:{os.path.join(runs, second)}", "--games", str(games), "--visits", str(args.visits),
             "--opening-moves", "0", "--paired-openings", str(args.paired_openings), "--seed", str(seed), "--json",
             "--sgf-dir", os.path.join(args.out, "matches", name)],
            cwd=REPO, capture_output=True, text=True)
        if completed.returncode:
            sys.exit(f"bench/learning.py: match {name} failed (exit {completed.returncode}): "
                     f"{completed.stderr.strip().splitlines()[-1:]}")
        with open(result_path + ".tmp", "w") as handle:
            handle.write(completed.stdout.strip().splitlines()[-1])
        os.replace(result_path + ".tmp", result_path)
    with open(result_path, "rb") as handle:
        return tally_match(MatchRecord.from_bytes(handle.read(), result_path))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python bench/learning.py", description=__doc__.split("\n")[0],
                                     epilog="Everything lives under --out; rerunning the same command resumes.")
    parser.add_argument("--out", required=True, help="folder for the base lake, the runs, the matches and logs")
    parser.add_argument("--arm-a", default="", help="pipeline.loop flags of the baseline arm (default: none)")
    parser.add_argument("--arm-b", required=True, help="pipeline.loop flags of the change, e.g. '--worker-gumbel'")
    parser.add_argument("--seeds", type=int, default=2, choices=(1, 2, 3), help="runs per arm (default: 2)")
    parser.add_argument("--minutes", type=float, default=35.0, help="wall clock of each run (default: 35)")
    parser.add_argument("--base-seconds", type=float, default=300.0,
                        help="self-play seconds of the shared generation 0 (default: 300, the loop's)")
    parser.add_argument("--base-flags", default="", help="extra selfplay.worker flags for generation 0")
    parser.add_argument("--cross-games", type=int, default=400, help="cross-arm games in all (default: 400)")
    parser.add_argument("--within-games", type=int, default=100, help="games of each within-arm match")
    parser.add_argument("--visits", type=int, default=64, help="simulations a move in the matches (default: 64)")
    parser.add_argument("--paired-openings", type=int, default=4,
                        help="random opening moves shared by each pair of match games (default: 4)")
    parser.add_argument("--max-outside-load", type=float, default=0.05,
                        help="refuse the result when other processes took more than this share of the machine's "
                             "CPU during any run (default: 0.05)")
    parser.add_argument("--max-cpu-gap", type=float, default=0.15,
                        help="for runs recorded without the outside load: refuse a pair whose runs' CPU time "
                             "differs by more than this share (default: 0.15)")
    args = parser.parse_args(argv)
    for name, low, high in (("minutes", 1, 600), ("base_seconds", 10, 7200), ("cross_games", 2, 10000),
                            ("within_games", 2, 10000), ("visits", 1, 4096), ("paired_openings", 1, 60),
                            ("max_cpu_gap", 0, 1), ("max_outside_load", 0, 1)):
        value = getattr(args, name)
        if not (math.isfinite(value) and low <= value <= high):
            parser.error(f"--{name.replace('_', '-')} must be in [{low}, {high}], got {value}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "matches"), exist_ok=True)
    base = os.path.join(args.out, "base")
    make_base(args, base)
    seeds = list(range(1, args.seeds + 1))
    records = {arm: [run_arm(args, base, arm, flags, seed) for seed in seeds]
               for arm, flags in (("a", args.arm_a), ("b", args.arm_b))}
    cpu = {arm: [r["cpu_seconds"] for r in runs] for arm, runs in records.items()}
    pairs = [(f"b{sb}", f"a{sa}") for sb in seeds for sa in seeds]
    cross = MatchTally(0, 0.0)
    for index, (b_run, a_run) in enumerate(pairs):
        cross += play_match(args, b_run, a_run, max(2, args.cross_games // len(pairs) // 2 * 2), 7000 + index)
    within = [play_match(args, f"{arm}{seeds[0]}", f"{arm}{other}", args.within_games, 8000 + other)
              for arm in ("a", "b") for other in seeds[1:]]
    loads = {f"{arm}{seed}": outside_load(record) for arm, runs in records.items()
             for seed, record in zip(seeds, runs)}
    verdict = decide(cross, within, cpu_gap(cpu["a"], cpu["b"]), args.max_cpu_gap, loads, args.max_outside_load)
    say(f"{verdict['decision']}: {verdict['why']}")
    print(json.dumps({"bench": "learning", "arm_a": args.arm_a, "arm_b": args.arm_b, "seeds": args.seeds,
                      "minutes": args.minutes, "base_seconds": args.base_seconds, "visits": args.visits,
                      "paired_openings": args.paired_openings, "cpu_seconds_a": [round(c) for c in cpu["a"]],
                      "cpu_seconds_b": [round(c) for c in cpu["b"]],
                      "within": [dataclasses.asdict(t) for t in within], **verdict}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B test of a learning change: two arms of short loop runs from one generation-0 lake, then matches.

    python bench/learning.py --out /work/ab/gumbel --arm-b "--worker-gumbel --worker-visits 16"
    python bench/learning.py --out /work/ab/gumbel ...      # the same command resumes where it stopped
    python bench/learning.py ... --window-minutes 150      # as many whole runs as fit, then exit 3

An *arm* is the loop flags of one side: A the baseline (``--arm-a``, default main's defaults), B the
change (``--arm-b``, repeatable: a bundle of changes, named by ``--arm-b-name``).  A *run* is one
``operations.loop`` of one arm and seed for ``--minutes``, from a copy of the shared generation-0
*base*; the run, not the game, is the unit (runs spread `PLANNED_RUN_SPREAD_ELO`).  ``--seeds``
runs an arm take turns; cross-arm matches with paired openings follow; B is kept only if the
run-level 95% interval (`decide`: Welch t over the runs' Elo numbers, the games' noise counted
once) is above 0.  A result is refused when a run's *outside load* (other CPU use during it, as a
share of wall seconds x cores) is above ``--max-outside-load``.  A cached base, run or match is
reused only when its *provenance* (flags, commit, machine: ``NAME.provenance.json``) matches.

Ends with one JSON line (``allow_nan=False``): verdict, intervals, each run's number, and each
match's players, seed, tally and sha256 of its files, so every figure can be rebuilt from ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from arena.elo import ELO_PER_NAT  # noqa: E402
from arena.match import wilson_interval  # noqa: E402
from format import layout  # noqa: E402
from format.match_record import MatchGame, MatchRecord  # noqa: E402
from format.sgf import game_from_sgf  # noqa: E402

ELO_CLAMP = 800.0
"""|Elo| reported for a shut-out (a score of 0 or 1 has no finite Elo)."""
PLANNED_RUN_SPREAD_ELO = 60.0
"""SD of one run's strength about its configuration's mean, for planning (measured from the
within-arm matches in docs/results.md)."""
SPEED_TOLERANCE = 0.2
"""A cached thing's machine counts as this one when their speeds differ by less than this share."""
DEFAULT_SEEDS = 5
PROG = "bench/learning.py"
"""The script named in refusals (bench/strength.py and bench/replay.py share these helpers and set it)."""
DEFAULT_CROSS_GAMES_PER_RUN = 100


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
        """(Elo, 95% low, 95% high) of this side, every game taken as independent (games-pooled)."""
        if not self.games:
            return 0.0, -ELO_CLAMP, ELO_CLAMP
        low, high = wilson_interval(self.score, self.games)
        return elo_of(self.score / self.games), elo_of(low), elo_of(high)

    def smoothed_elo(self) -> float:
        """Elo with half a point added to each side: finite for a shut-out (module docstring)."""
        return ELO_PER_NAT * math.log((self.score + 0.5) / (self.games - self.score + 0.5))

    def game_variance(self) -> float:
        """Binomial variance of `smoothed_elo` from these games alone (Elo squared)."""
        p = (self.score + 0.5) / (self.games + 1.0)
        return ELO_PER_NAT**2 / ((self.games + 1.0) * p * (1.0 - p))


def student_t_quantile(probability: float, degrees_of_freedom: float) -> float:
    """Student t quantile for a fractional number of degrees of freedom (>= 1): bisection on the
    CDF, the CDF by Simpson's rule on the density (SciPy is no dependency of zerolake)."""
    nu = max(1.0, degrees_of_freedom)
    log_norm = math.lgamma((nu + 1) / 2) - math.lgamma(nu / 2) - 0.5 * math.log(nu * math.pi)

    def cdf(x: float, steps: int = 2000) -> float:
        points = np.linspace(0.0, x, steps + 1)
        density = np.exp(log_norm - (nu + 1) / 2 * np.log1p(points**2 / nu))
        weights = np.where(np.arange(steps + 1) % 2, 4.0, 2.0)
        weights[[0, -1]] = 1.0
        return 0.5 + float(weights @ density) * (x / steps) / 3

    if probability == 0.5:
        return 0.0
    if probability < 0.5:
        return -student_t_quantile(1.0 - probability, nu)
    low, high = 0.0, 1.0
    while cdf(high) < probability:
        low, high = high, high * 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < probability else (low, middle)
    return (low + high) / 2


@dataclasses.dataclass(frozen=True)
class RunLevelEffect:
    """B's effect over A with the runs as the units (module docstring, "The run-level interval")."""

    elo: float
    low: float
    high: float
    standard_error: float
    degrees_of_freedom: float
    run_spread: float
    """Estimated SD of one run about its arm's mean, the games' own noise taken out (0 if they explain it all)."""
    b_runs: dict[str, float]
    """Each B run's Elo over all its games against arm A."""
    a_runs: dict[str, float]
    """B's Elo over all the games against each A run."""

    def as_json(self) -> dict:
        rounded = {
            key: round(value, 1) for key, value in dataclasses.asdict(self).items() if not isinstance(value, dict)
        }
        return {
            **rounded,
            "b_runs": {k: round(v, 1) for k, v in self.b_runs.items()},
            "a_runs": {k: round(v, 1) for k, v in self.a_runs.items()},
        }


def run_level_effect(cross: dict[tuple[str, str], MatchTally]) -> RunLevelEffect:
    """The run-level effect and 95% interval from the cross-arm tallies, keyed (B run, A run), B's side."""
    b_names = sorted({b for b, _ in cross})
    a_names = sorted({a for _, a in cross})
    if min(len(b_names), len(a_names)) < 2:
        raise ValueError("a run-level interval needs at least two runs an arm (--seeds 2 or more)")
    rows = {b: sum((t for (bb, _), t in cross.items() if bb == b), MatchTally(0, 0.0)) for b in b_names}
    columns = {a: sum((t for (_, aa), t in cross.items() if aa == a), MatchTally(0, 0.0)) for a in a_names}
    b_runs = {b: t.smoothed_elo() for b, t in rows.items()}
    a_runs = {a: t.smoothed_elo() for a, t in columns.items()}
    effect = (statistics.fmean(b_runs.values()) + statistics.fmean(a_runs.values())) / 2
    share_b = statistics.variance(b_runs.values()) / len(b_names)
    share_a = statistics.variance(a_runs.values()) / len(a_names)
    games_only = sum(cross.values(), MatchTally(0, 0.0)).game_variance()
    variance = max(share_b + share_a - games_only, games_only)
    if share_b + share_a > 0:  # Welch-Satterthwaite
        df = (share_b + share_a) ** 2 / (share_b**2 / (len(b_names) - 1) + share_a**2 / (len(a_names) - 1))
    else:
        df = len(b_names) + len(a_names) - 2
    half = student_t_quantile(0.975, df) * math.sqrt(variance)
    # An arm's run numbers vary by the run spread plus each run's games' own noise.
    run_variance = statistics.fmean(
        [
            statistics.variance(b_runs.values()) - statistics.fmean(t.game_variance() for t in rows.values()),
            statistics.variance(a_runs.values()) - statistics.fmean(t.game_variance() for t in columns.values()),
        ]
    )
    return RunLevelEffect(
        effect, effect - half, effect + half, math.sqrt(variance), df, math.sqrt(max(0.0, run_variance)), b_runs, a_runs
    )


def planned_precision(
    seeds: int, cross_games_per_run: int, run_spread: float = PLANNED_RUN_SPREAD_ELO
) -> tuple[float, float]:
    """(expected half-width of the run-level 95% interval, the effect it keeps 4 times in 5), for
    ``seeds`` runs an arm of equal spread, each playing ``cross_games_per_run`` cross games near 50%."""
    games = seeds * cross_games_per_run
    error = math.sqrt(2 * run_spread**2 / seeds + 4 * ELO_PER_NAT**2 / games)
    df = 2 * (seeds - 1)
    return (
        student_t_quantile(0.975, df) * error,
        (student_t_quantile(0.975, df) + student_t_quantile(0.8, df)) * error,
    )


def cpu_gap(cpu_a: list[float], cpu_b: list[float]) -> float:
    """Relative gap between the arms' mean CPU seconds per run (0 = equal)."""
    mean_a, mean_b = sum(cpu_a) / len(cpu_a), sum(cpu_b) / len(cpu_b)
    return abs(mean_a - mean_b) / max(mean_a, mean_b, 1e-9)


def outside_load(record: dict) -> float | None:
    """A run's outside load (module docstring), or None for a run recorded before it was measured."""
    if "outside_cpu_seconds" not in record or not record.get("wall_seconds"):
        return None
    return max(0.0, record["outside_cpu_seconds"]) / (record["wall_seconds"] * record.get("cores", 1))


def decide(
    cross: dict[tuple[str, str], MatchTally],
    within: list[MatchTally],
    gap: float,
    max_gap: float,
    loads: dict[str, float | None] | None = None,
    max_load: float = 0.05,
) -> dict:
    """The protocol's verdict: 'keep', 'drop', or 'refused' (a loaded machine), judged on the
    run-level interval; the games-pooled figure and the within-arm spread are reported beside it.

    ``loads``: each run's outside load; when every run has one, a run above
    ``max_load`` refuses the result; otherwise (older records) a CPU-time
    ``gap`` between the arms above ``max_gap`` does."""
    effect = run_level_effect(cross)
    pooled = sum(cross.values(), MatchTally(0, 0.0))
    pooled_elo, pooled_low, pooled_high = pooled.elo()
    spread = max((abs(t.elo()[0]) for t in within if t.games), default=None)
    verdict = {
        "elo": round(effect.elo, 1),
        "elo_low": round(effect.low, 1),
        "elo_high": round(effect.high, 1),
        "interval": "run-level: runs as the units, Welch t",
        "run_level": effect.as_json(),
        "pooled_elo": round(pooled_elo, 1),
        "pooled_elo_low": round(pooled_low, 1),
        "pooled_elo_high": round(pooled_high, 1),
        "pooled_interval": "games-pooled Wilson (games as independent: too narrow)",
        "cross_games": pooled.games,
        "cross_score": pooled.score,
        "within_spread_elo": None if spread is None else round(spread, 1),
        "cpu_gap": round(gap, 3),
    }
    known = {run: load for run, load in (loads or {}).items() if load is not None}
    measured = bool(loads) and len(known) == len(loads or {})
    if measured:
        verdict["outside_load"] = {run: round(load, 3) for run, load in known.items()}
    loaded = sorted(run for run, load in known.items() if measured and load > max_load)
    interval = f"{effect.elo:+.0f} Elo [{effect.low:+.0f}, {effect.high:+.0f}] (run-level 95%)"
    if loaded:
        verdict["decision"] = "refused"
        verdict["why"] = (
            f"the machine was loaded during run {', '.join(loaded)}: other processes took "
            f"{max(known[r] for r in loaded):.0%} of its CPU (more than {max_load:.0%})"
        )
    elif not measured and gap > max_gap:
        verdict["decision"] = "refused"
        verdict["why"] = (
            f"the arms' CPU time differs by {gap:.0%} (more than {max_gap:.0%}), and the runs "
            f"do not record the outside load that would tell a loaded machine from the arm's own use"
        )
    elif effect.low > 0:
        verdict["decision"] = "keep"
        verdict["why"] = f"B is {interval}: the low end is above 0"
    else:
        verdict["decision"] = "drop"
        verdict["why"] = f"B is {interval}; keeping needs the low end above 0"
    return verdict


def games_with_sgf(record: MatchRecord) -> list[tuple[MatchGame, str]]:
    """Each game of one ``arena.match --json`` result with its SGF file (the match's ``--sgf-dir``)."""
    games = record.game_results or ()
    paired = [(game, game.sgf) for game in games if game.sgf is not None]
    if not games or len(paired) != len(games):
        raise ValueError(
            f"the match {record.player_a} vs {record.player_b} kept no SGF of its games "
            "(bench/learning.py plays its matches with --sgf-dir)"
        )
    return paired


def tally_match(record: MatchRecord) -> MatchTally:
    """Player A's tally over the distinct games of one ``arena.match --json`` result.

    Each game's moves come from its SGF file (the match's ``--sgf-dir``); two
    games with the same colours and moves are one game."""
    seen, score = set(), 0.0
    for game, sgf in games_with_sgf(record):
        with open(sgf, "rb") as handle:
            key = (game.black, tuple(game_from_sgf(handle.read())[2]))
        if key in seen:
            continue
        seen.add(key)
        if game.result.startswith("0") or game.result.lower().startswith("draw"):
            score += 0.5
        elif (game.result.startswith("B+") and game.black == record.player_a) or (
            game.result.startswith("W+") and game.white == record.player_a
        ):
            score += 1.0
    return MatchTally(len(seen), score)


def match_digest(result_path: str, record: MatchRecord) -> str:
    """sha256 of a match's JSON and its games' SGFs, in game order: what the tally was made of."""
    digest = hashlib.sha256()
    with open(result_path, "rb") as handle:
        digest.update(handle.read())
    for _, sgf in games_with_sgf(record):
        with open(sgf, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()


# --------------------------------------------------------------------------
# Arms: bundles of flag changes
# --------------------------------------------------------------------------


def bundle_flags(changes: list[str], option: str) -> str:
    """The loop flags of an arm made of ``changes`` (each one or more flags), or ValueError naming
    a flag two changes both set (the bundle would mean whichever came last)."""
    owner: dict[str, str] = {}
    for change in changes:
        for word in shlex.split(change):
            flag = word.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            if flag in owner and owner[flag] != change:
                raise ValueError(f"{option}: {flag} is set by two changes ({owner[flag]!r} and {change!r})")
            owner[flag] = change
    return " ".join(change.strip() for change in changes if change.strip())


# --------------------------------------------------------------------------
# Provenance: what a cached base, run or match was made with
# --------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def current_commit() -> tuple[str, bool]:
    """(git HEAD of the repository, whether tracked files have uncommitted changes); ("unknown", True)
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return head.stdout.strip(), bool(status.stdout.strip())


@functools.lru_cache(maxsize=None)
def machine_speed() -> float:
    """Millions of steps a second of a fixed pure-Python loop, best of five (one core, as the
    interpreter runs; the best of five shrugs off a moment of other load)."""
    best = math.inf
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(200_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - started)
    return round(0.2 / best, 2)


def machine() -> dict:
    """This machine as provenance records it: CPU model, cores this process may use, speed."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "speed": machine_speed()}


def provenance(flags: dict) -> dict:
    """What a cached thing is made with: ``flags`` (what it depends on), the commit, the machine."""
    commit, uncommitted = current_commit()
    return {"flags": flags, "commit": commit, "uncommitted": uncommitted, "machine": machine()}


def provenance_digest(record: dict) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def provenance_differences(recorded: dict, current: dict) -> list[str]:
    """What differs between a cached thing's provenance and now's, one phrase each ([] = reusable)."""
    differences = []
    old_flags, new_flags = recorded.get("flags", {}), current["flags"]
    for key in sorted(set(old_flags) | set(new_flags)):
        if old_flags.get(key) != new_flags.get(key):
            differences.append(f"{key} {old_flags.get(key)!r}, now {new_flags.get(key)!r}")
    if recorded.get("commit") != current["commit"]:
        differences.append(f"commit {recorded.get('commit')}, now {current['commit']}")
    old_machine, new_machine = recorded.get("machine", {}), current["machine"]
    for key in ("cpu", "cores"):
        if old_machine.get(key) != new_machine[key]:
            differences.append(f"machine {key} {old_machine.get(key)!r}, now {new_machine[key]!r}")
    old_speed = old_machine.get("speed")
    if not (
        isinstance(old_speed, (int, float))
        and old_speed > 0
        and abs(new_machine["speed"] / old_speed - 1) < SPEED_TOLERANCE
    ):
        differences.append(
            f"machine speed {old_speed}, now {new_machine['speed']} (more than {SPEED_TOLERANCE:.0%} apart)"
        )
    return differences


def refuse(message: str) -> SystemExit:
    """Exit 2 with one line: the input (flags, a cached thing) is what is wrong, not the machine."""
    print(f"{PROG}: {message}", file=sys.stderr)
    return SystemExit(2)


def check_cache(args, what: str, path: str, current: dict) -> None:
    """Reuse the thing whose provenance file is ``path`` only if it matches ``current`` (module
    docstring); else stop, or with --allow-stale-cache say so and note it."""
    try:
        with open(path) as handle:
            recorded = json.load(handle)
    except FileNotFoundError:
        recorded = None
    differences = (
        ["no provenance recorded (made before it was kept)"]
        if recorded is None
        else provenance_differences(recorded, current)
    )
    if not differences:
        return
    if not args.allow_stale_cache:
        raise refuse(
            f"{what} was made with other settings: {'; '.join(differences)}. Remove it to make it "
            f"again, or pass --allow-stale-cache to reuse it"
        )
    say(f"REUSING {what} although {'; '.join(differences)} (--allow-stale-cache)")
    args.stale_caches.append(what)


def write_provenance(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle, allow_nan=False)
    os.replace(path + ".tmp", path)


def read_provenance(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


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
    return (os.waitstatus_to_exitcode(status), own, machine_busy_seconds() - busy - own, time.monotonic() - started)


def run_match(argv: list[str]) -> subprocess.CompletedProcess:
    """Run one ``arena.match`` command line; its output captured."""
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True)


def base_argv(args, base: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "selfplay.worker",
        "--root",
        base,
        "--games",
        "64",
        "--max-seconds",
        f"{args.base_seconds:g}",
        "--seed",
        "1000",
        "--worker-id",
        "loop0",
        "--spool-dir",
        os.path.join(args.out, "spool-base"),
        *shlex.split(args.base_flags),
    ]


def loop_argv(args, root: str, flags: str, seed: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "operations.loop",
        "--root",
        root,
        "--hours",
        f"{args.minutes / 60:.6f}",
        "--seed",
        str(seed),
        "--final-gnugo-games",
        "0",
        "--final-eval-games",
        "2",
        "--eval-games",
        "2",
        *shlex.split(flags),
    ]


def base_provenance(args) -> dict:
    return provenance({"base_seconds": args.base_seconds, "base_flags": args.base_flags, "base_seed": 1000})


def make_base(args, base: str) -> None:
    """The shared generation-0 lake: the worker plays generation 0 as the loop would, then the
    loop's own marker says so (format.layout.loop_marker), so each run starts at generation 1."""
    marker = os.path.join(base, layout.loop_marker(f"selfplay-{layout.generation_dir(0)}.done"))
    wanted = base_provenance(args)
    if os.path.exists(marker):
        check_cache(args, f"the shared generation-0 lake {base}", base + ".provenance.json", wanted)
        return
    shutil.rmtree(base, ignore_errors=True)
    say(f"making the shared generation-0 lake in {base} ({args.base_seconds:g} s of self-play)")
    code, *_ = run_measured(base_argv(args, base), os.path.join(args.out, "base.log"))
    if code:
        sys.exit(f"bench/learning.py: the generation-0 worker failed (exit {code}); see {args.out}/base.log")
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    with open(marker, "w") as handle:
        json.dump({"seconds": round(args.base_seconds)}, handle)
    write_provenance(base + ".provenance.json", wanted)


def digest_of(path: str) -> str:
    """The provenance digest of a cached thing, or "none" for one made before provenance was kept."""
    return provenance_digest(read_provenance(path)) if os.path.exists(path) else "none"


def run_arm(args, base: str, arm: str, flags: str, seed: int) -> dict:
    """One run (resumable: the loop resumes from its lake, CPU seconds add up in its record)."""
    name = f"{arm}{seed}"
    root = os.path.join(args.out, "runs", name)
    record_path = os.path.join(args.out, "runs", f"{name}.json")
    wanted = provenance(
        {"loop_flags": flags, "seed": seed, "minutes": args.minutes, "base": digest_of(base + ".provenance.json")}
    )
    record = {"cpu_seconds": 0.0, "invocations": 0}
    if os.path.exists(root):  # begun before: resumed only if it is made the same way
        check_cache(args, f"run {name} ({root})", root + ".provenance.json", wanted)
        if os.path.exists(record_path):
            with open(record_path) as handle:
                record = json.load(handle)
            if record.get("done"):
                return record
    else:
        shutil.rmtree(root + ".tmp", ignore_errors=True)  # a copy an earlier invocation did not finish
        shutil.copytree(base, root + ".tmp")
        write_provenance(root + ".provenance.json", wanted)
        os.replace(root + ".tmp", root)
    say(f"run {name}: {args.minutes:g} min, loop flags: {flags or '(defaults)'}")
    code, cpu, outside, wall = run_measured(
        loop_argv(args, root, flags, seed), os.path.join(args.out, "runs", f"{name}.log")
    )
    record["cpu_seconds"] += cpu
    if record["invocations"] == 0 or "outside_cpu_seconds" in record:  # not for a run begun unmeasured
        record["outside_cpu_seconds"] = record.get("outside_cpu_seconds", 0.0) + outside
        record["wall_seconds"] = record.get("wall_seconds", 0.0) + wall
        record["cores"] = len(os.sched_getaffinity(0))
    record["invocations"] += 1
    record["done"] = code == 0
    record["exit"] = code
    with open(record_path, "w") as handle:
        json.dump(record, handle, allow_nan=False)
    if code:
        sys.exit(f"bench/learning.py: run {name} failed (exit {code}); see its log; rerun to resume")
    return record


def run_is_done(args, arm: str, seed: int) -> bool:
    """Whether run ``arm``+``seed`` finished in an earlier invocation (its record says so)."""
    path = os.path.join(args.out, "runs", f"{arm}{seed}.json")
    if not os.path.exists(path):
        return False
    with open(path) as handle:
        return bool(json.load(handle).get("done"))


def fits_window(args, seconds: float) -> bool:
    """Whether something taking ``seconds`` can still end inside this invocation's --window-minutes."""
    if not args.window_minutes:
        return True
    return time.monotonic() - args.started + seconds <= args.window_minutes * 60


def stop_for_window(args, what: str, left: list[str]) -> None:
    """Stop between runs (or before a match) when the window is spent: a run cut by the end of a
    sitting would be resumed with its hours and its CPU split, so none is begun that cannot end."""
    say(
        f"the {args.window_minutes:g}-minute window is spent before the next {what}; left: "
        f"{', '.join(left)}{' and the matches after them' if what == 'run' else ' and any after it'}. "
        f"Rerun the same command to resume"
    )
    sys.exit(3)


def play_match(args, first: str, second: str, games: int, seed: int) -> tuple[MatchTally, dict]:
    """``first``'s distinct-game tally against ``second`` (run names), and the match's entry for the
    JSON line (players, seed, tally, digest); the result, its SGFs and its provenance are kept."""
    name = f"{first}-vs-{second}"
    runs, matches = os.path.join(args.out, "runs"), os.path.join(args.out, "matches")
    result_path = os.path.join(matches, f"{name}.json")
    wanted = provenance(
        {
            "games": games,
            "visits": args.visits,
            "paired_openings": args.paired_openings,
            "seed": seed,
            first: digest_of(os.path.join(runs, first + ".provenance.json")),
            second: digest_of(os.path.join(runs, second + ".provenance.json")),
        }
    )
    if os.path.exists(result_path):
        check_cache(args, f"match {name} ({result_path})", os.path.join(matches, f"{name}.provenance.json"), wanted)
    else:
        say(f"match {first} vs {second}: {games} games at {args.visits} visits, seed {seed}")
        sgf_dir = os.path.join(matches, name)
        shutil.rmtree(sgf_dir, ignore_errors=True)  # games of an attempt that did not finish
        completed = run_match(
            [
                sys.executable,
                "-m",
                "arena.match",
                f"model:{os.path.join(runs, first)}",
                f"model:{os.path.join(runs, second)}",
                "--games",
                str(games),
                "--visits",
                str(args.visits),
                "--opening-moves",
                "0",
                "--paired-openings",
                str(args.paired_openings),
                "--seed",
                str(seed),
                "--json",
                "--sgf-dir",
                sgf_dir,
            ]
        )
        if completed.returncode:
            sys.exit(
                f"bench/learning.py: match {name} failed (exit {completed.returncode}): "
                f"{completed.stderr.strip().splitlines()[-1:]}"
            )
        with open(result_path + ".tmp", "w") as handle:
            handle.write(completed.stdout.strip().splitlines()[-1])
        os.replace(result_path + ".tmp", result_path)
        write_provenance(os.path.join(matches, f"{name}.provenance.json"), wanted)
    with open(result_path, "rb") as handle:
        record = MatchRecord.from_bytes(handle.read(), result_path)
    tally = tally_match(record)
    return tally, {
        "match": name,
        "seed": seed,
        "games_played": len(record.game_results or ()),
        "games": tally.games,
        "score": tally.score,
        "digest": match_digest(result_path, record),
    }


def games_per_pairing(cross_games_per_run: int, seeds: int) -> int:
    """Games of each cross-arm pairing: a run's games spread over the other arm's runs, even."""
    return max(2, 2 * math.ceil(cross_games_per_run / seeds / 2))


def run_ab(args) -> dict:
    """The whole A/B (resumable); the JSON line's contents."""
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "matches"), exist_ok=True)
    base = os.path.join(args.out, "base")
    make_base(args, base)
    seeds = list(range(1, args.seeds + 1))
    # The arms take turns (a1, b1, a2, b2, ...), so an A/B spread over several sittings, or a machine
    # that drifts over the hours, loads both arms alike instead of giving one arm the early hours.
    records: dict[str, list[dict]] = {"a": [], "b": []}
    for seed in seeds:
        for arm, flags in (("a", args.arm_a_flags), ("b", args.arm_b_flags)):
            if not run_is_done(args, arm, seed) and not fits_window(args, args.minutes * 60):
                stop_for_window(args, "run", [f"{a}{s}" for s in seeds for a in "ab" if not run_is_done(args, a, s)])
            records[arm].append(run_arm(args, base, arm, flags, seed))
    cpu = {arm: [r["cpu_seconds"] for r in runs] for arm, runs in records.items()}
    pairing_games = games_per_pairing(args.cross_games_per_run, args.seeds)
    cross, matches = {}, []
    for sb in seeds:
        for sa in seeds:
            if not os.path.exists(os.path.join(args.out, "matches", f"b{sb}-vs-a{sa}.json")) and not fits_window(
                args, 0
            ):
                stop_for_window(args, "match", [f"b{sb}-vs-a{sa}"])
            # The seed names the pairing, so a pairing's games do not change with --seeds.
            cross[(f"b{sb}", f"a{sa}")], entry = play_match(
                args, f"b{sb}", f"a{sa}", pairing_games, 7000 + 100 * sb + sa
            )
            matches.append(entry)
    within = []
    if args.within_games:
        for arm in ("a", "b"):
            for other in seeds[1:]:
                tally, entry = play_match(args, f"{arm}1", f"{arm}{other}", args.within_games, 8000 + other)
                within.append(tally)
                matches.append(entry)
    loads = {f"{arm}{seed}": outside_load(record) for arm, runs in records.items() for seed, record in zip(seeds, runs)}
    verdict = decide(cross, within, cpu_gap(cpu["a"], cpu["b"]), args.max_cpu_gap, loads, args.max_outside_load)
    half_width, resolvable = planned_precision(args.seeds, args.cross_games_per_run)
    say(
        f"protocol: {args.seeds} runs an arm, {pairing_games * args.seeds} cross-arm games a run. With runs "
        f"{PLANNED_RUN_SPREAD_ELO:.0f} Elo apart it gives about +-{half_width:.0f} Elo, and keeps an effect of "
        f"{resolvable:.0f} Elo 4 times in 5; these runs spread {verdict['run_level']['run_spread']:.0f} Elo"
    )
    say(
        f"games-pooled (every game as independent, too narrow): {verdict['pooled_elo']:+.0f} Elo "
        f"[{verdict['pooled_elo_low']:+.0f}, {verdict['pooled_elo_high']:+.0f}] over {verdict['cross_games']} games"
    )
    if args.stale_caches:
        say(f"REUSED despite other settings (--allow-stale-cache): {', '.join(args.stale_caches)}")
    say(f"{verdict['decision']}: {verdict['why']}")
    commit, uncommitted = current_commit()
    return {
        "bench": "learning",
        "arm_a": args.arm_a_flags,
        "arm_a_name": args.arm_a_name,
        "arm_a_changes": args.arm_a,
        "arm_b": args.arm_b_flags,
        "arm_b_name": args.arm_b_name,
        "arm_b_changes": args.arm_b,
        "seeds": args.seeds,
        "minutes": args.minutes,
        "base_seconds": args.base_seconds,
        "visits": args.visits,
        "paired_openings": args.paired_openings,
        "cross_games_per_run": args.cross_games_per_run,
        "games_per_pairing": pairing_games,
        "planned_run_spread_elo": PLANNED_RUN_SPREAD_ELO,
        "planned_half_width_elo": round(half_width, 1),
        "resolvable_elo": round(resolvable, 1),
        "commit": commit,
        "uncommitted": uncommitted,
        "machine": machine(),
        "stale_caches": args.stale_caches,
        "cpu_seconds_a": [round(c) for c in cpu["a"]],
        "cpu_seconds_b": [round(c) for c in cpu["b"]],
        "within": [dataclasses.asdict(t) for t in within],
        "matches": matches,
        **verdict,
    }


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python bench/learning.py",
        description=__doc__.split("\n")[0],
        epilog="Everything lives under --out; rerunning the same command resumes.",
    )
    parser.add_argument("--out", required=True, help="folder for the base lake, the runs, the matches and logs")
    parser.add_argument(
        "--arm-a",
        action="append",
        default=[],
        help="operations.loop flags of one change of the baseline arm; repeat for a bundle "
        "(default: none, main's defaults)",
    )
    parser.add_argument("--arm-a-name", default="", help="the baseline arm's name (default: its flags, or 'defaults')")
    parser.add_argument(
        "--arm-b",
        action="append",
        required=True,
        help="operations.loop flags of one change, e.g. '--train-steps-per-window 1000' (a lone "
        "flag: --arm-b=--worker-gumbel); repeat for a bundle",
    )
    parser.add_argument("--arm-b-name", default="", help="the change's name, e.g. of a bundle (default: its flags)")
    parser.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, help=f"runs per arm (default: {DEFAULT_SEEDS})")
    parser.add_argument("--minutes", type=float, default=35.0, help="wall clock of each run (default: 35)")
    parser.add_argument(
        "--base-seconds",
        type=float,
        default=300.0,
        help="self-play seconds of the shared generation 0 (default: 300, the loop's)",
    )
    parser.add_argument("--base-flags", default="", help="extra selfplay.worker flags for generation 0")
    parser.add_argument(
        "--cross-games-per-run",
        type=int,
        default=DEFAULT_CROSS_GAMES_PER_RUN,
        help="cross-arm games each run plays, spread over the other arm's runs (default: "
        f"{DEFAULT_CROSS_GAMES_PER_RUN})",
    )
    parser.add_argument(
        "--within-games",
        type=int,
        default=0,
        help="games of each within-arm match, seed 1 against each other seed (default: 0, none)",
    )
    parser.add_argument("--visits", type=int, default=64, help="simulations a move in the matches (default: 64)")
    parser.add_argument(
        "--paired-openings",
        type=int,
        default=4,
        help="random opening moves shared by each pair of match games (default: 4)",
    )
    parser.add_argument(
        "--max-outside-load",
        type=float,
        default=0.05,
        help="refuse the result when other processes took more than this share of the machine's "
        "CPU during any run (default: 0.05)",
    )
    parser.add_argument(
        "--max-cpu-gap",
        type=float,
        default=0.15,
        help="for runs recorded without the outside load: refuse a pair whose runs' CPU time "
        "differs by more than this share (default: 0.15)",
    )
    parser.add_argument(
        "--window-minutes",
        type=float,
        default=0.0,
        help="this invocation's time: begin a run only if its --minutes end inside the window, "
        "and no match after it; then stop (exit 3) for a rerun to resume (default: 0, "
        "no window)",
    )
    parser.add_argument(
        "--allow-stale-cache",
        action="store_true",
        help="reuse a base, run or match made with other flags, at another commit or on another "
        "machine, saying so (default: refuse it)",
    )
    args = parser.parse_args(argv)
    for name, low, high in (
        ("seeds", 2, 8),
        ("minutes", 1, 600),
        ("base_seconds", 10, 7200),
        ("cross_games_per_run", 2, 10000),
        ("within_games", 0, 10000),
        ("visits", 1, 4096),
        ("paired_openings", 1, 60),
        ("max_cpu_gap", 0, 1),
        ("max_outside_load", 0, 1),
        ("window_minutes", 0, 100000),
    ):
        value = getattr(args, name)
        if not (math.isfinite(value) and low <= value <= high):
            parser.error(f"--{name.replace('_', '-')} must be in [{low}, {high}], got {value}")
    if args.within_games == 1:
        parser.error("--within-games must be 0 (none) or at least 2, got 1")
    try:
        args.arm_a_flags = bundle_flags(args.arm_a, "--arm-a")
        args.arm_b_flags = bundle_flags(args.arm_b, "--arm-b")
    except ValueError as exc:
        parser.error(str(exc))
    args.arm_a_name = args.arm_a_name or args.arm_a_flags or "defaults"
    args.arm_b_name = args.arm_b_name or args.arm_b_flags
    args.stale_caches = []
    args.started = time.monotonic()
    return args


def check_arm_flags(args) -> None:
    """Refuse, before hours of runs, an arm whose flags operations.loop would refuse."""
    from operations.loop import CLI as LOOP_CLI

    for option, flags in (("--arm-a", args.arm_a_flags), ("--arm-b", args.arm_b_flags)):
        try:
            LOOP_CLI.parse(loop_argv(args, os.path.join(args.out, "runs", "check"), flags, 1)[3:])
        except SystemExit as exc:
            if exc.code:
                raise refuse(f"{option}: operations.loop refuses {flags!r} (its message above)") from None


def main(argv=None) -> int:
    args = parse_args(argv)
    check_arm_flags(args)
    result = run_ab(args)
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

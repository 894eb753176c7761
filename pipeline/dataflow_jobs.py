"""The shuffle follower's Dataflow jobs: their names and labels, and finding and cancelling them.

A Dataflow job lives in Google's service, not under the launcher that submitted it, so stopping the
follower's child (SIGTERM, a lost claim, a killed VM) leaves it running.  Every job is therefore
named so that a follower, or ``down``, can find it again without having kept its id:
* *name* ``zerolake-<run>-w<generation>-<attempt>`` (`job_name`): one job per attempt, since
  Dataflow returns the existing job to a second submission of a name;
* *run*: the lake root as a label value (`run_label`: a slug plus 8 hex digits of its SHA-256);
* *labels* (`job_labels`): for billing and the console only, since job listings carry none: listings
  select by name (`list_filter`) and every name is parsed again (`parse_job_name`) before a cancel.

    follower: job_name/job_labels -> beam_flags -> the launcher's Beam flags -> Dataflow
    follower: Dataflow.from_beam_args(--project, --region)
              .active_jobs(run, window) -> gcloud dataflow jobs list --status=active --format=json
              .cancel(job)              -> gcloud dataflow jobs cancel ID

Any gcloud failure is one `DataflowJobsError` line naming the command and the job: the follower warns
and carries on, since an uncancelled job costs money but never corrupts the lake.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess

NAME_PREFIX = "zerolake"
"""Every job name starts with this: the follower's jobs among a project's others."""
ROLE = "shuffle"
"""The ``zerolake-role`` label, the same key and value the deployment gives the follower's VM."""
RUN_SLUG_CHARS = 40
"""The readable part of a run label; with '-' and 8 hex digits it stays well under a label's 63."""
GCLOUD_TIMEOUT_SECONDS = 20.0
"""One gcloud call's limit.  A follower that stops cancels its job inside its unit's TimeoutStopSec (60 s):
10 s for its launcher (processes.children.STOP_GRACE_SECONDS), then one listing and one cancel."""
ENDING_STATES = frozenset({"cancelling", "cancelled", "done", "failed", "stopped", "updated", "drained"})
"""States (gcloud's words, lowercased) of a job that needs no cancel: it is ending or has ended."""

_ATTEMPT = re.compile(r"[a-z0-9]+")
_JOB_NAME = re.compile(rf"{NAME_PREFIX}-(?P<run>[a-z0-9-]+)-w(?P<window>[0-9]+)-(?P<attempt>[a-z0-9]+)")


class DataflowJobsError(Exception):
    """A gcloud call that failed; the message is one line naming the command and what it was for."""


@dataclasses.dataclass(frozen=True)
class Job:
    """One Dataflow job as a listing shows it, with what its name says."""

    id: str
    name: str
    state: str
    run: str
    window: int
    attempt: str


def run_label(root: str) -> str:
    """The run's label value: a slug of the lake root and 8 hex digits of its SHA-256 (module docstring).

    A trailing '/' does not change it: ``gs://b/run`` and ``gs://b/run/`` are one lake."""
    root = root.rstrip("/")
    slug = re.sub(r"[^a-z0-9]+", "-", root.split("://", 1)[-1].lower()).strip("-")[:RUN_SLUG_CHARS].strip("-")
    digest = hashlib.sha256(root.encode()).hexdigest()[:8]
    return f"{slug}-{digest}" if slug else digest


def window_prefix(run: str, generation: int) -> str:
    """The start of every job name of one window of one run (the trailing '-': w1 is not w12)."""
    return f"{NAME_PREFIX}-{run}-w{generation}-"


def job_name(run: str, generation: int, attempt: str) -> str:
    """``zerolake-<run>-w<generation>-<attempt>``; ValueError names an attempt id Dataflow would refuse."""
    if not _ATTEMPT.fullmatch(attempt):
        raise ValueError(f"attempt id {attempt!r} cannot name a Dataflow job: only lowercase letters and digits")
    return window_prefix(run, generation) + attempt


def parse_job_name(name: str) -> tuple[str, int, str] | None:
    """(run, window, attempt) of a name `job_name` made; None for any other name."""
    match = _JOB_NAME.fullmatch(name)
    if match is None:
        return None
    return match["run"], int(match["window"]), match["attempt"]


def job_labels(run: str, generation: int, attempt: str) -> dict[str, str]:
    return {"zerolake-run": run, "zerolake-window": str(generation), "zerolake-role": ROLE, "zerolake-attempt": attempt}


def beam_flags(run: str, generation: int, attempt: str) -> list[str]:
    """Beam's ``--job_name`` and one ``--labels key=value`` per label, for the launcher's command line."""
    return [
        f"--job_name={job_name(run, generation, attempt)}",
        *(f"--labels={key}={value}" for key, value in job_labels(run, generation, attempt).items()),
    ]


def list_filter(run: str, generation: int | None = None) -> str:
    """gcloud's ``--filter`` for the jobs of a run, or of one of its windows: by name (module docstring)."""
    window = "[0-9]+" if generation is None else str(generation)
    return f"name~^{NAME_PREFIX}-{run}-w{window}-[a-z0-9]+$"


def beam_option(beam_args, flag: str) -> str | None:
    """The last value of a Beam flag given as ``--flag V`` or ``--flag=V`` (the last wins, as in Beam)."""
    args = list(beam_args)
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


@dataclasses.dataclass(frozen=True)
class Dataflow:
    """Where the follower's jobs run (project, region) and the gcloud that lists and cancels them."""

    project: str | None
    region: str
    gcloud: str = "gcloud"
    timeout: float = GCLOUD_TIMEOUT_SECONDS

    @classmethod
    def from_beam_args(cls, beam_args, gcloud: str = "gcloud") -> Dataflow:
        """From the Beam flags the jobs are launched with; ValueError names a missing --region.

        Without --project gcloud uses its configured project, as Beam does."""
        region = beam_option(beam_args, "--region")
        if not region:
            raise ValueError(
                "--region: the Dataflow flags name no region, so the follower cannot find or "
                "cancel its jobs (gcloud dataflow jobs list/cancel need it)"
            )
        return cls(beam_option(beam_args, "--project"), region, gcloud)

    def _where(self) -> list[str]:
        return [f"--region={self.region}", *([f"--project={self.project}"] if self.project else []), "--quiet"]

    def _run(self, argv: list[str], purpose: str) -> str:
        """Run one gcloud command; its stdout, or DataflowJobsError in one line."""
        command = " ".join(argv[:4])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout)
        except FileNotFoundError:
            raise DataflowJobsError(f"{purpose}: {self.gcloud!r} is not installed or not on PATH") from None
        except subprocess.TimeoutExpired:
            raise DataflowJobsError(f"{purpose}: `{command}` took more than {self.timeout:g} s") from None
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            detail = lines[-1] if lines else "no output"
            raise DataflowJobsError(f"{purpose}: `{command}` exited {done.returncode}: {detail}")
        return done.stdout

    def active_jobs(self, run: str, generation: int | None = None) -> list[Job]:
        """The run's jobs (of one window, when given) that are active and not already ending."""
        what = f"run {run}" + ("" if generation is None else f" window {generation}")
        purpose = f"listing the Dataflow jobs of {what}"
        out = self._run(
            [
                self.gcloud,
                "dataflow",
                "jobs",
                "list",
                "--status=active",
                f"--filter={list_filter(run, generation)}",
                "--format=json",
                *self._where(),
            ],
            purpose,
        )
        try:
            rows = json.loads(out or "[]")
            listed = [(str(row["id"]), str(row["name"]), str(row.get("state", ""))) for row in rows]
        except (ValueError, TypeError, KeyError) as exc:
            raise DataflowJobsError(f"{purpose}: gcloud printed no job list ({exc!r})") from None
        jobs = []
        for job_id, name, state in listed:
            parsed = parse_job_name(name)
            # The filter is gcloud's; the decision to cancel is made here, on the exact name.
            if parsed is None or parsed[0] != run or (generation is not None and parsed[1] != generation):
                continue
            if state.lower() in ENDING_STATES:
                continue
            jobs.append(Job(job_id, name, state, *parsed))
        return jobs

    def cancel(self, job: Job) -> None:
        """Ask Dataflow to cancel ``job`` (it stops its workers within minutes; the call returns at once)."""
        self._run(
            [self.gcloud, "dataflow", "jobs", "cancel", job.id, *self._where()],
            f"cancelling Dataflow job {job.name} ({job.id})",
        )


def cancel_run_shell(root: str, project: str, region: str) -> str:
    """One shell line that cancels every active job of the run at ``root`` (for ``python -m operations.deploy
    down``): the listing selects by name, as `Dataflow.active_jobs` does, and each id is cancelled."""
    import shlex

    where = f"--project={shlex.quote(project)} --region={shlex.quote(region)}"
    return (
        f"gcloud dataflow jobs list {where} --status=active "
        f"--filter={shlex.quote(list_filter(run_label(root)))} --format='value(id)' "
        f'| while read -r id; do gcloud dataflow jobs cancel "$id" {where} --quiet; done'
    )

"""The shuffle follower's Dataflow jobs: their names and labels, and finding and cancelling them.

A Dataflow job lives in Google's service, not under the launcher that submitted it, so stopping the
follower's child (SIGTERM, a lost claim, a killed VM) leaves it running.  Every job is therefore
named so that a follower, or ``down``, can find it again without having kept its id:
* *name* ``zerolake-<run>-w<generation>-<attempt>`` (`job_name`): one job per attempt, since
  Dataflow returns the existing job to a second submission of a name;
* *run*: the lake root as a label value (`run_label`: a slug plus 8 hex digits of its SHA-256);
* *labels* (`job_labels`): for billing and the console only, since job listings carry none: jobs are
  selected by name, each name parsed (`parse_job_name`) before a cancel (``down``: `list_filter`).

    follower: job_name/job_labels -> beam_flags -> the launcher's Beam flags -> Dataflow
    follower: Dataflow.from_beam_args(--project, --region, --dataflow_endpoint)
              .active_jobs(run, window) -> GET  /v1b3/projects/P/locations/R/jobs?filter=ACTIVE
              .cancel(job)              -> PUT  /v1b3/projects/P/locations/R/jobs/ID {requestedState: CANCELLED}

The calls go through Dataflow's REST API with the client library Beam's Dataflow runner ships
(``google-cloud-dataflow-client``, with apache-beam[gcp]): the release image holds no gcloud, so a
follower that shelled out to it could cancel nothing.  It authenticates as the VM's account
(Application Default Credentials) and talks to Beam's ``--dataflow_endpoint`` when given; a plain
``http://`` endpoint on the loopback interface is a stand-in server and gets no credentials.  Any
failure is one `DataflowJobsError` line naming the call and the job: the follower warns and carries
on, since an uncancelled job costs money but never corrupts the lake.  ``down`` runs on the
operator's machine, which has gcloud: `cancel_run_shell` is its line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import urllib.parse

NAME_PREFIX = "zerolake"
"""Every job name starts with this: the follower's jobs among a project's others."""
ROLE = "shuffle"
"""The ``zerolake-role`` label, the same key and value the deployment gives the follower's VM."""
RUN_SLUG_CHARS = 40
"""The readable part of a run label; with '-' and 8 hex digits it stays well under a label's 63."""
CALL_TIMEOUT_SECONDS = 20.0
"""One API call's limit.  A follower that stops cancels its job inside its unit's TimeoutStopSec (90 s):
10 s for its launcher (processes.children.STOP_GRACE_SECONDS), then one listing and one cancel."""
DATAFLOW_ENDPOINT = "https://dataflow.googleapis.com"
"""Dataflow's API, as Beam's ``--dataflow_endpoint`` defaults to it."""
ENDING_STATES = frozenset({"cancelling", "cancelled", "done", "failed", "stopped", "updated", "drained"})
"""States (``JOB_STATE_<WORD>``'s word, lowercased) of a job that needs no cancel: it is ending or has ended."""

_ATTEMPT = re.compile(r"[a-z0-9]+")
_JOB_NAME = re.compile(rf"{NAME_PREFIX}-(?P<run>[a-z0-9-]+)-w(?P<window>[0-9]+)-(?P<attempt>[a-z0-9]+)")


class DataflowJobsError(Exception):
    """An API call that failed; the message is one line naming the call and what it was for."""


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
    """gcloud's ``--filter`` for the jobs of a run, or of one of its windows: by name (``down``'s line)."""
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
    """Where the follower's jobs run (project, region, the API's endpoint), and the calls that list and
    cancel them (module docstring)."""

    project: str | None
    region: str
    endpoint: str = DATAFLOW_ENDPOINT
    timeout: float = CALL_TIMEOUT_SECONDS

    @classmethod
    def from_beam_args(cls, beam_args) -> Dataflow:
        """From the Beam flags the jobs are launched with; ValueError names a missing --region.

        Without --project the credentials' project is used, as Beam does."""
        region = beam_option(beam_args, "--region")
        if not region:
            raise ValueError(
                "--region: the Dataflow flags name no region, so the follower cannot find or "
                "cancel its jobs (Dataflow's API lists and cancels them by region)"
            )
        endpoint = beam_option(beam_args, "--dataflow_endpoint") or DATAFLOW_ENDPOINT
        return cls(beam_option(beam_args, "--project"), region, endpoint.rstrip("/"))

    def _client(self):
        """(Dataflow's JobsV1Beta3Client over REST, the project); google's errors are the caller's."""
        import google.auth
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import dataflow_v1beta3

        url = urllib.parse.urlsplit(self.endpoint)
        if url.scheme == "http" and url.hostname in ("127.0.0.1", "localhost", "::1"):
            credentials, project = AnonymousCredentials(), self.project  # a stand-in server
        else:
            credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
            project = self.project or project
        if not project:
            raise ValueError("the Dataflow flags name no --project and the credentials hold none")
        client = dataflow_v1beta3.JobsV1Beta3Client(
            transport="rest", credentials=credentials, client_options=ClientOptions(api_endpoint=self.endpoint)
        )
        return client, project

    def _call(self, purpose: str, call):
        """``call(client, project)``'s result, or DataflowJobsError in one line naming ``purpose``."""
        import google.auth.exceptions
        import requests
        from google.api_core import exceptions as api
        from google.protobuf import json_format

        try:
            client, project = self._client()
            return call(client, project)
        except (api.GoogleAPIError, google.auth.exceptions.GoogleAuthError, requests.RequestException,
                json_format.ParseError, ValueError, OSError) as exc:  # fmt: skip
            lines = str(exc).strip().splitlines() or [type(exc).__name__]
            raise DataflowJobsError(f"{purpose}: {lines[0][:300]}") from None

    def active_jobs(self, run: str, generation: int | None = None) -> list[Job]:
        """The run's jobs (of one window, when given) that are active and not already ending."""
        from google.cloud import dataflow_v1beta3

        what = f"run {run}" + ("" if generation is None else f" window {generation}")

        def listing(client, project):
            request = dataflow_v1beta3.ListJobsRequest(
                project_id=project, location=self.region, filter=dataflow_v1beta3.ListJobsRequest.Filter.ACTIVE
            )
            pages = client.list_jobs(request=request, retry=None, timeout=self.timeout)
            return [(job.id, job.name, job.current_state.name) for job in pages]

        jobs = []
        for job_id, name, state in self._call(f"listing the Dataflow jobs of {what}", listing):
            parsed = parse_job_name(name)
            # The API lists every active job of the region: the decision to cancel is made here, on the name.
            if parsed is None or parsed[0] != run or (generation is not None and parsed[1] != generation):
                continue
            word = state.removeprefix("JOB_STATE_").lower()
            if word in ENDING_STATES:
                continue
            jobs.append(Job(job_id, name, word, *parsed))
        return jobs

    def cancel(self, job: Job) -> None:
        """Ask Dataflow to cancel ``job`` (it stops its workers within minutes; the call returns at once)."""
        from google.cloud import dataflow_v1beta3

        def cancel(client, project):
            request = dataflow_v1beta3.UpdateJobRequest(
                project_id=project,
                location=self.region,
                job_id=job.id,
                job=dataflow_v1beta3.Job(requested_state=dataflow_v1beta3.JobState.JOB_STATE_CANCELLED),
            )
            client.update_job(request=request, retry=None, timeout=self.timeout)

        self._call(f"cancelling Dataflow job {job.name} ({job.id})", cancel)


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

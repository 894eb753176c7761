"""The words of a deployment plan: `Step`, shell quoting, the gcloud and retry helpers, and the names
(scripts, metadata entries, IAM roles, shell variables) that every part of the plan shares.

A `Step` is one thing the plan does: its section, a one-line comment, and its shell text.  `command`
quotes words for bash (`Raw` words are written as is; `Expand` words keep their ``${zerolake_...}``
variables, which hold what is known only when the plan runs: the release's sha256, the images' digests)
and folds long lines.  `retried` wraps a command in the script's ``retry`` function (RETRY_FUNCTION,
in the script's header).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

from operations.deploy.config import DeployConfig

VM_DIR = pathlib.Path(__file__).resolve().parents[1] / "vm"
STARTUP_SCRIPT = VM_DIR / "startup.sh"
"""The TPU trainer's start-up script: it installs the release with pip (a TPU VM boots a TPU runtime image)."""
IMAGE_STARTUP_SCRIPT = VM_DIR / "startup-image.sh"
"""Every Compute Engine VM's start-up script: it pulls the release's image by digest and runs the role in it."""
IMAGE_METADATA = "zerolake-image"
"""The metadata entry naming the image a VM runs, ``REGION-docker.pkg.dev/...@sha256:DIGEST``."""
DATAFLOW_DOCKERFILE = pathlib.Path(__file__).resolve().parents[1] / "dataflow" / "Dockerfile"
REPO = pathlib.Path(__file__).resolve().parents[2]
RELEASE_METADATA = "zerolake-release-sha256"
"""The metadata entry naming the sha256 of the release a VM runs; startup.sh checks the package against it."""
RELEASE_VAR = "${zerolake_release}"
"""The plan's shell variable holding the release's sha256 (set in the package section, or by `release_steps`)."""
IMAGE_DIGEST_VAR = "${zerolake_image_digest}"
"""The plan's shell variable holding the Dataflow image's digest (sha256:...) for the release."""
VM_IMAGE_VARS = {"cpu": "${zerolake_vm_image_cpu}", "gpu": "${zerolake_vm_image_gpu}"}
"""The plan's shell variables holding the digest (sha256:...) of the release's VM image of each accelerator."""
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
LAKE_WRITER_ROLE = "roles/storage.objectAdmin"
"""Create, read, list and delete objects: granted with a condition that leaves out the deploy area."""
RELEASE_READER_ROLE = "roles/storage.objectViewer"
"""Read the deployment's releases: granted with a condition on their prefix."""
BUCKET_READER_ROLE = "roles/storage.legacyBucketReader"
"""Reading the bucket's own metadata, which Beam's gcsio asks for (no object permission)."""
BUCKET_ROLES = (LAKE_WRITER_ROLE, BUCKET_READER_ROLE, RELEASE_READER_ROLE)
LOG_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
"""What the logging agents need (Container-Optimized OS's on the image VMs, the Ops Agent on the TPU trainer)
to ship the roles' output and the VM's metrics (write-only; granted on the project, the only scope these have)."""
DATAFLOW_PROJECT_ROLES = ("roles/dataflow.developer", "roles/compute.viewer", "roles/dataflow.worker")
"""The follower launches jobs that run as this same account.  Dataflow's
access-control page names what creating a job takes at minimum: the developer
role (jobs only; dataflow.admin would add object permissions on every bucket
of the project) and read access to the project's machine types (compute.viewer,
read-only).  dataflow.worker is what the jobs' own VMs need to take and report
work.  All three have no scope narrower than the project."""
SPOOL_DEVICE = "zerolake-spool"
"""The device name of each worker's second disk, which startup.sh mounts at /var/lib/zerolake (the spools and
model caches).  The worker group recreates a preempted VM with a new boot disk (Google: "About repairing VMs
in a MIG"); this disk is stateful, so the group detaches it and attaches it to the recreated VM, whose worker
then uploads what the preempted one could not."""
HEALTH_PORT = 8420
"""The TCP port where worker process 0 answers the group's health check (selfplay/health.py)."""
HEALTH_PORT_METADATA = "zerolake-health-port"
"""The metadata entry telling startup-image.sh that port (workers only)."""
HEALTH_CHECK_SOURCES = "35.191.0.0/16,130.211.0.0/22"
"""Where Google's health-check probes come from (Cloud Load Balancing's health checks overview: the
probe ranges a firewall rule must admit)."""
SPOOL_DISK_GB = 20
"""The spool disk's size: games waiting for upload and a model cache per process (MBs); pd-balanced's minimum
is 10 GB."""
SPOOL_AUTO_DELETE = "on-permanent-instance-deletion"
"""The spool disk goes with its VM when the VM leaves the group for good (a smaller --workers, ``down``), as a
deleted VM's boot disk always did; kept across preemption, repair and updates."""
RELEASE_TAG = "release-"
"""The Dataflow image of a release is tagged ``release-<sha256>`` (a rerun skips the build); the follower's
jobs name it by the digest that tag resolves to when the plan runs, so no later push changes what they run."""
RETRY_FUNCTION = """\
# retry TRIES COMMAND...: run COMMAND up to TRIES times, waiting 5 s, 10 s, 20 s ... in between.
# IAM grants right after an account is created fail until the account has propagated;
# capacity errors (no VMs of a type in a zone) pass too.
retry() {
  local tries=$1 wait=5 n=1
  shift
  until "$@"; do
    if (( n >= tries )); then echo "retry: gave up after $tries tries: ${*:1:5} ..." >&2; return 1; fi
    echo "retry: try $n of $tries failed; again in ${wait}s: ${*:1:5} ..." >&2
    sleep "$wait"; n=$((n + 1)); wait=$((wait * 2))
  done
}"""
SCRATCH_HEADER = """\
# Scratch files (the release's copies, the build contexts) live in one folder, removed however the
# script ends: scratch_file and scratch_folder make them there.
zerolake_scratch=$(mktemp -d)
trap 'rm -rf "$zerolake_scratch"' EXIT"""
SCRATCH_FILE = '$(mktemp -p "$zerolake_scratch")'
"""A new scratch file's path, in a step's shell (SCRATCH_HEADER)."""
SCRATCH_FOLDER = '$(mktemp -d -p "$zerolake_scratch")'
"""A new scratch folder's path, in a step's shell (SCRATCH_HEADER)."""
MISSING_HEADER = (
    """\
# What could not be had yet (worker VMs, the trainer): named at the end, with exit status 3.
zerolake_missing="""
    ""
)
GRANT_TRIES = 7
"""Tries of an IAM grant: 5+10+...+160 s, over five minutes, as IAM's propagation can take."""
CREATE_TRIES = 3
"""Tries of creating a VM before it is reported as missing (a stockout can last hours)."""
POLL_SECONDS = 30
"""Seconds between two looks at the TPU trainer's queued request (``ZEROLAKE_POLL_SECONDS`` in the
script's environment overrides it: the tests run the script with 0)."""
TPU_QUOTA_PAGE = "https://cloud.google.com/tpu/docs/quota"


class Raw(str):
    """A shell word written as is (a variable such as "$name"), never quoted."""


class Expand(str):
    """A shell word quoted as one, except its ``${zerolake_...}`` variables, which the shell expands.

    The release's sha256 and the image's digest are known only when the plan
    runs, and they go into words (``--metadata=...``) that are otherwise text.
    """

    def quoted(self) -> str:
        parts = re.split(r"(\$\{zerolake_[a-z_]+\})", self)
        return "".join(f'"{part}"' if part.startswith("${") else shlex.quote(part) for part in parts if part)


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing the plan does: its section, a one-line comment, and its shell text."""

    section: str
    comment: str
    shell: str


def command(*words) -> str:
    """One command line: words quoted for the shell (Raw words kept), long ones folded."""
    quoted = [w if isinstance(w, Raw) else w.quoted() if isinstance(w, Expand) else shlex.quote(str(w)) for w in words]
    head = []
    for word in quoted:  # the command path and positionals stay on the first line
        if word.startswith("--"):
            break
        head.append(word)
    flags = quoted[len(head) :]
    if len(" ".join(quoted)) <= 100:
        return " ".join(quoted)
    return " \\\n    ".join([" ".join(head)] + flags)


def gcloud(*words) -> str:
    return command("gcloud", *words)


def retried(tries: int, *words) -> str:
    """``retry TRIES gcloud ...``: a gcloud command that the script tries again (see RETRY_FUNCTION)."""
    return command("retry", str(tries), "gcloud", *words)


def grant(*words) -> str:
    """An IAM grant, retried while a new account propagates; its output (the whole policy) is not shown."""
    return retried(GRANT_TRIES, *words, "--format=none")


def indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def unless_exists(describe: str, create: str) -> str:
    """Run ``create`` only when ``describe`` fails (the resource is missing)."""
    return f"if ! {describe} >/dev/null 2>&1; then\n{indent(create)}\nfi"


def labels(config: DeployConfig, role: str) -> str:
    return f"--labels=zerolake-deployment={config.name},zerolake-role={role}"


def deployment_filter(config: DeployConfig) -> str:
    """The gcloud --filter term that selects this deployment's VMs by label.

    gcloud warns that ``=`` is becoming a word match for some APIs ("zerolake"
    would then match "zerolake-b"), so every loop over such a listing also
    checks each VM's exact name before acting on it.
    """
    return f"labels.zerolake-deployment={config.name}"


def release_url(config: DeployConfig, sha256: str = RELEASE_VAR) -> str:
    """Where a release lives: ``DEPLOY_AREA/releases/<sha256>.tar.gz`` (written once, never overwritten)."""
    return f"{config.deploy_area}/releases/{sha256}.tar.gz"


def pointer_url(config: DeployConfig) -> str:
    """The object naming the release the deployment runs (one line: its sha256)."""
    return f"{config.deploy_area}/release"


def release_metadata(config: DeployConfig) -> tuple[str, ...]:
    """The two entries that tell a VM which release to run, and the sha256 it must have."""
    return f"zerolake-package={release_url(config)}", f"{RELEASE_METADATA}={RELEASE_VAR}"


def metadata(
    config: DeployConfig, role: str, accelerator: str, args: str, processes: int = 1, extra: tuple[str, ...] = ()
) -> Expand:
    entries = [
        f"zerolake-role={role}",
        f"zerolake-root={config.root}",
        *release_metadata(config),
        f"zerolake-accelerator={accelerator}",
        f"zerolake-processes={processes}",
        f"zerolake-args={args}",
        *extra,
    ]
    return Expand("--metadata=" + ",".join(entries))


def project_flag(config: DeployConfig) -> str:
    return f"--project={config.project}"


def member(config: DeployConfig, role: str) -> str:
    return f"--member=serviceAccount:{config.service_account(role)}"


def worker_tag(config: DeployConfig) -> str:
    """The network tag of the worker VMs: the firewall rule for the group's health probes targets it."""
    return f"{config.name}-worker"


def vm_network_flags(config: DeployConfig) -> list[str]:
    """Where a Compute Engine VM attaches (``gcloud compute instances create --help``)."""
    flags = [f"--network={config.network}"] if config.network else []
    flags += [f"--subnet={config.subnet}"] if config.subnet else []
    return flags + ([] if config.external_ip else ["--no-address"])


def tpu_network_flags(config: DeployConfig) -> list[str]:
    """The same for a TPU VM's queued request (``gcloud compute tpus queued-resources create --help``)."""
    flags = [f"--network={config.network}"] if config.network else []
    flags += [f"--subnetwork={config.subnet}"] if config.subnet else []
    return flags + ([] if config.external_ip else ["--internal-ips"])


def dataflow_network_args(config: DeployConfig) -> list[str]:
    """The same for Dataflow's workers (Beam's WorkerOptions: --network, --subnetwork, --no_use_public_ips)."""
    args = [f"--network={config.network}"] if config.network else []
    if config.subnet:
        args.append(f"--subnetwork=regions/{config.dataflow_region}/subnetworks/{config.subnet}")
    return args + ([] if config.external_ip else ["--no_use_public_ips"])


def shell_error(text: str) -> str:
    """``echo TEXT >&2; exit 2``, TEXT in double quotes so that its ``$zerolake_...`` variables expand."""
    escaped = re.sub(r'([\\"`])', r"\\\1", text)
    return f'echo "error: {escaped}" >&2\nexit 2'


def account_step(config: DeployConfig, account_id: str, why: str) -> Step:
    """Create a service account if missing, then wait until IAM can see it (creation is eventually consistent)."""
    email = f"{account_id}@{config.project}.iam.gserviceaccount.com"
    create = gcloud(
        "iam",
        "service-accounts",
        "create",
        account_id,
        project_flag(config),
        f"--display-name=zerolake {config.name} {account_id.removeprefix(config.name + '-')}",
    )
    wait = retried(GRANT_TRIES, "iam", "service-accounts", "describe", email, project_flag(config), "--format=none")
    return Step(
        "account",
        f"{why}; no key is ever made",
        unless_exists(gcloud("iam", "service-accounts", "describe", email, project_flag(config)), create) + "\n" + wait,
    )

"""From a DeployConfig to the exact shell plan: every gcloud command, in order.

``build_plan(config)`` returns `Step`s, one per thing the deployment needs
(a service account, a bucket, a VM...), grouped in the sections of
`operations.deploy.config.SECTIONS`; ``render(steps)`` prints them as one bash
script that a person can read, paste or run (``--apply`` runs exactly this
text).  ``build_down_plan`` does the same for tearing a deployment down, and
``build_update_plan`` for moving a running deployment to a new release.

Releases.  Each release is the sdist repacked so that one source is one file
(operations.deploy.release), uploaded once, create-only, to
``DEPLOY_AREA/releases/<sha256>.tar.gz``; ``DEPLOY_AREA/release`` names the
release the deployment runs.  ``plan`` builds the checkout's release (or takes
``--release``, or without its package section reads the recorded one) and
refuses, in one line, to create VMs of a release other than the recorded one:
moving a deployment is ``update``'s, which rolls the release out to the
trainer and the follower (with the Dataflow image of that release, by
digest) before the workers.  Only the person deploying writes the deploy
area: the roles' accounts read its releases (an IAM condition on the object
name), so no VM can change what the others run.

Every create is guarded by a describe (``if ! gcloud ... describe ...; then
gcloud ... create ...; fi``), so the plan can be run again: after a failure,
or with a larger ``--workers`` to add worker VMs (the existing ones are left
alone).  Every gcloud command and flag used here is documented by the
installed gcloud's ``--help``; tests/operations/deploy/test_plan.py checks each one against
it.  Flags that take a value are always written ``--flag=value``.

What can fail for a while and then pass is retried (the script's ``retry``
function, in its header): IAM grants right after an account is created (the
account is eventually consistent) and creating a VM (capacity).  A GPU/CPU
trainer VM that still cannot be created is named on stderr and the plan goes
on; it ends with exit status 3, naming what is missing, so that a rerun adds
it.  The workers are a regional managed instance group
(``NAME-workers``, target size ``--workers``) made from an instance template
(``NAME-worker-<settings>-<release>``): Compute Engine creates its VMs where it
can, recreates a preempted one, and rolls a new template out
(``rolling-action start-update``, what ``update`` does after the trainer and
the follower).  A recreated VM gets a new boot disk, so each worker's spool
lives on a second disk, ``zerolake-spool``, that the group's stateful policy
keeps across recreation (startup.sh mounts it).  A TPU trainer is asked for
through a *queued resource* (``gcloud compute tpus queued-resources create``), which waits for capacity
for ``--trainer-tpu-valid-for``: the plan queues it before the workers, polls
it after them (at most ``--trainer-wait-minutes``) until it is ACTIVE or
FAILED, and deletes a FAILED or SUSPENDED (expired) request before queueing a
new one.  The follower and the trainer come before the workers, so a zone out
of spot GPUs delays nothing else.

Accounts and grants (least privilege; ``NAME-<role>`` for each planned role)::

    every role      on the bucket only: storage.objectAdmin on every object outside
                    zerolake-deploy/ (the follower also on its Dataflow folders there),
                    objectViewer on this deployment's releases, legacyBucketReader;
                    logging.logWriter + monitoring.metricWriter (write-only, project)
    shuffle         dataflow.developer + compute.viewer (read-only) + dataflow.worker
                    (project: Dataflow has no narrower scope), actAs itself (its jobs'
                    workers run as it),
                    artifactregistry.reader on the deployment's image repository
    every VM role   artifactregistry.reader on that repository: the release's image, by digest
                    (not the TPU trainer, which installs with pip)
    NAME-builder    Cloud Build's account for the release's images: artifactregistry.writer
                    on that repository, objectViewer on the bucket (the build's source
                    is staged in the deploy area), logging.logWriter

What the VMs are told travels in instance metadata (never a secret: the VMs
act through their attached service account, and no key is ever created)::

    startup-script          operations/vm/startup-image.sh on Compute Engine VMs (pulls the image, runs the
                            role in it), operations/vm/startup.sh on the TPU trainer (pip at boot)
    zerolake-image          REGION-docker.pkg.dev/PROJECT/NAME-images/zerolake-ACCELERATOR@sha256:DIGEST: the
                            release's image, by digest (Compute Engine VMs)
    zerolake-role           worker | shuffle | trainer
    zerolake-root           gs://BUCKET/RUN
    zerolake-package        gs://BUCKET/zerolake-deploy/<name>/releases/<sha256>.tar.gz (the release)
    zerolake-release-sha256 that sha256: startup.sh refuses a package whose sha256 differs
    zerolake-accelerator    cpu | gpu | tpu  (which TensorFlow install.sh installs)
    zerolake-processes      worker processes on this VM (one systemd unit each)
    zerolake-args           extra flags of the role (no commas)
    zerolake-tpu-generation on a TPU trainer: its row of operations/deploy/zones.py, whose TensorFlow
                            environment run-role.sh exports before the role imports TensorFlow
    enable-guest-attributes TRUE: startup.sh reports its progress (zerolake/state) there
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex
import sys

from operations.deploy.config import DEPLOY_AREA, GPU_KINDS, ROLES, DeployConfig

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
"""What the Ops Agent on each VM needs to ship the journal and the VM's metrics
(write-only; granted on the project, the only scope these have)."""
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
MISSING_HEADER = """\
# What could not be had yet (worker VMs, the trainer): named at the end, with exit status 3.
zerolake_missing="""""
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
    quoted = [w if isinstance(w, Raw) else w.quoted() if isinstance(w, Expand) else shlex.quote(str(w))
              for w in words]
    head = []
    for word in quoted:            # the command path and positionals stay on the first line
        if word.startswith("--"):
            break
        head.append(word)
    flags = quoted[len(head):]
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


def metadata(config: DeployConfig, role: str, accelerator: str, args: str, processes: int = 1,
             extra: tuple[str, ...] = ()) -> Expand:
    entries = [f"zerolake-role={role}", f"zerolake-root={config.root}", *release_metadata(config),
               f"zerolake-accelerator={accelerator}", f"zerolake-processes={processes}", f"zerolake-args={args}",
               *extra]
    return Expand("--metadata=" + ",".join(entries))


def project_flag(config: DeployConfig) -> str:
    return f"--project={config.project}"


def member(config: DeployConfig, role: str) -> str:
    return f"--member=serviceAccount:{config.service_account(role)}"


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


# ---- sections ------------------------------------------------------------------------

def services_steps(config: DeployConfig) -> list[Step]:
    apis = ["compute.googleapis.com", "storage.googleapis.com", "iam.googleapis.com", "logging.googleapis.com",
            "monitoring.googleapis.com"]
    if config.trainer_kind == "tpu":
        apis.append("tpu.googleapis.com")
    if config.uses_dataflow:
        apis.append("dataflow.googleapis.com")
    if config.uses_dataflow or vm_image_kinds(config):
        apis += ["artifactregistry.googleapis.com", "cloudbuild.googleapis.com"]
    return [Step("services", "the APIs this deployment uses", gcloud("services", "enable", *apis,
                                                                      project_flag(config)))]


def bucket_steps(config: DeployConfig) -> list[Step]:
    url = f"gs://{config.bucket}"
    create = gcloud("storage", "buckets", "create", url, project_flag(config), f"--location={config.region}",
                    "--uniform-bucket-level-access", "--public-access-prevention")
    return [Step("bucket", f"the lake's bucket, in {config.region} next to the VMs (kept by `down`)",
                 unless_exists(gcloud("storage", "buckets", "describe", url, project_flag(config)), create))]


def account_step(config: DeployConfig, account_id: str, why: str) -> Step:
    """Create a service account if missing, then wait until IAM can see it (creation is eventually consistent)."""
    email = f"{account_id}@{config.project}.iam.gserviceaccount.com"
    create = gcloud("iam", "service-accounts", "create", account_id, project_flag(config),
                    f"--display-name=zerolake {config.name} {account_id.removeprefix(config.name + '-')}")
    wait = retried(GRANT_TRIES, "iam", "service-accounts", "describe", email, project_flag(config), "--format=none")
    return Step("account", f"{why}; no key is ever made",
                unless_exists(gcloud("iam", "service-accounts", "describe", email, project_flag(config)), create)
                + "\n" + wait)


def account_steps(config: DeployConfig) -> list[Step]:
    steps = []
    for role in config.planned_roles:
        who = member(config, role)
        steps.append(account_step(config, config.service_account_id(role), f"the account the {role} VMs run as"))
        steps += bucket_grant_steps(config, role)
        for log_role in LOG_ROLES:
            steps.append(Step("account", f"{log_role} for the {role}: the Ops Agent ships its journal and metrics",
                              grant("projects", "add-iam-policy-binding", config.project, who,
                                    f"--role={log_role}", "--condition=None")))
    if config.uses_dataflow:
        who = member(config, "shuffle")
        for role in DATAFLOW_PROJECT_ROLES:
            steps.append(Step("account", f"{role} for the shuffle follower: its Dataflow jobs",
                              grant("projects", "add-iam-policy-binding", config.project, who, f"--role={role}",
                                    "--condition=None")))
        steps.append(Step("account", "the follower's Dataflow workers run as the follower's account (actAs on "
                                     "itself only)",
                          grant("iam", "service-accounts", "add-iam-policy-binding", config.service_account("shuffle"),
                                who, "--role=roles/iam.serviceAccountUser", project_flag(config))))
    if config.uses_dataflow or vm_image_kinds(config):
        steps += builder_account_steps(config)
    return steps


def object_prefix(config: DeployConfig, path: str) -> str:
    """The IAM resource name of the bucket's objects under ``path`` (Cloud Storage's form for conditions)."""
    return f"projects/_/buckets/{config.bucket}/objects/{path}"


def lake_condition(config: DeployConfig, role: str) -> str:
    """Where ``role`` may write: every object outside the deploy area, and for a follower that uses Dataflow
    its jobs' staging and temporary folders there (Dataflow's workers run as the follower's account)."""
    expression = f'!resource.name.startsWith("{object_prefix(config, DEPLOY_AREA + "/")}")'
    if role == "shuffle" and config.uses_dataflow:
        area = f"{DEPLOY_AREA}/{config.name}/dataflow-"
        expression += f' || resource.name.startsWith("{object_prefix(config, area)}")'
    return expression


def release_condition(config: DeployConfig) -> str:
    """What every role may read in the deploy area: this deployment's releases."""
    return f'resource.name.startsWith("{object_prefix(config, f"{DEPLOY_AREA}/{config.name}/releases/")}")'


def bucket_grant_steps(config: DeployConfig, role: str) -> list[Step]:
    """The role's grants on the bucket: write the lake, read the releases, never write them.

    Conditions on object-name prefixes are how Cloud Storage narrows a bucket
    grant (the bucket has uniform bucket-level access, which they need).
    Listing is granted on the bucket, where no object name applies, so a role
    can list the deploy area but not write or read it beyond its releases.  An
    earlier plan's unconditional objectAdmin would still let the role write
    releases, so it is removed.
    """
    who = member(config, role)
    bucket = f"gs://{config.bucket}"
    principal = who.removeprefix("--member=")
    policy = gcloud("storage", "buckets", "get-iam-policy", bucket, project_flag(config),
                    "--flatten=bindings[].members",
                    "--format=value(bindings.role,bindings.members,bindings.condition.title)")
    unconditional = f"awk -F'\\t' '$1 == \"{LAKE_WRITER_ROLE}\" && $2 == \"{principal}\" && $3 == \"\"'"
    remove = gcloud("storage", "buckets", "remove-iam-policy-binding", bucket, who, f"--role={LAKE_WRITER_ROLE}",
                    "--condition=None", project_flag(config), "--format=none")
    title = f"zerolake {config.name} {role}"
    return [
        Step("account", f"{LAKE_WRITER_ROLE} for the {role} on the bucket, outside the deploy area",
             grant("storage", "buckets", "add-iam-policy-binding", bucket, who, f"--role={LAKE_WRITER_ROLE}",
                   f"--condition=^;^expression={lake_condition(config, role)};title={title} lake", project_flag(config))),
        Step("account", f"{RELEASE_READER_ROLE} for the {role} on this deployment's releases only",
             grant("storage", "buckets", "add-iam-policy-binding", bucket, who, f"--role={RELEASE_READER_ROLE}",
                   f"--condition=^;^expression={release_condition(config)};title={title} releases",
                   project_flag(config))),
        Step("account", f"{BUCKET_READER_ROLE} for the {role}: the bucket's own metadata, no objects",
             grant("storage", "buckets", "add-iam-policy-binding", bucket, who, f"--role={BUCKET_READER_ROLE}",
                   project_flag(config))),
        Step("account", f"an earlier plan's unconditional {LAKE_WRITER_ROLE} for the {role} (it could write the "
                        "releases), if there is one",
             f"if {policy} | {unconditional} | grep -q .; then\n{indent(remove)}\nfi")]


def _error(text: str) -> str:
    """``echo TEXT >&2; exit 2``, TEXT in double quotes so that its ``$zerolake_...`` variables expand."""
    escaped = re.sub(r'([\\"`])', r"\\\1", text)
    return f'echo "error: {escaped}" >&2\nexit 2'


def release_steps(config: DeployConfig, *, update: bool = False) -> list[Step]:
    """Set ``$zerolake_release`` to the release the VMs of this plan run, uploaded, and record it.

    The release is built from this checkout (the package section), or is
    ``--release``, or (``plan`` without the package section) the one the
    deployment runs.  ``plan`` records it as the deployment's when none is, and
    refuses one line when another is: VMs of two releases would then meet in
    the lake.  ``update`` records it, whatever was there: the rollout follows.
    """
    pointer = pointer_url(config)
    steps = []
    if config.release:
        steps.append(Step("package", f"the release named by --release, {config.release[:12]}..., already uploaded",
                          f"zerolake_release={config.release}\n"
                          f"if ! {gcloud('storage', 'ls', Expand(release_url(config)), project_flag(config))} "
                          f">/dev/null; then\n"
                          f"{indent(_error(f'--release: there is no release {release_url(config)}: build one with the package section'))}\nfi"))
    elif "package" in config.sections or update:
        python = config.python or sys.executable
        sdist = command(python, "setup.py", "-q", "sdist", "--dist-dir", Raw('"$zerolake_dist"'))
        repack = command(python, "-m", "operations.deploy.release", Raw('"$zerolake_dist"'))
        steps += [
            Step("package", "build the source package (Cython sources included) and repack it as a release: one "
                            "file per source, named by its sha256",
                 f"zerolake_dist=$(mktemp -d)\n(cd {shlex.quote(str(REPO))} && {sdist})\n"
                 f"zerolake_release=$(cd {shlex.quote(str(REPO))} && {repack})"),
            Step("package", "upload it once: a release is never overwritten (--no-clobber), and the VMs check its "
                            "sha256 before they run it",
                 gcloud("storage", "cp", "--no-clobber", Raw('"$zerolake_dist/release.tar.gz"'),
                        Expand(release_url(config)), project_flag(config)))]
    else:
        read = gcloud("storage", "cat", pointer, project_flag(config))
        steps.append(Step("package", "the release the deployment runs (no package section, no --release)",
                          f"if ! zerolake_release=$({read} 2>/dev/null) || [[ ! $zerolake_release =~ ^[0-9a-f]{{64}}$ ]]; "
                          f"then\n{indent(_error(f'deployment {config.name} records no release at {pointer}: plan the package section, or give --release SHA256'))}\nfi"))
        return steps
    record = "\n".join(["zerolake_note=$(mktemp)", 'printf \'%s\\n\' "$zerolake_release" > "$zerolake_note"',
                        gcloud("storage", "cp", Raw('"$zerolake_note"'), pointer, project_flag(config))])
    if update:
        steps.append(Step("package", "record it as the deployment's release (a plan run meanwhile adds VMs of it)",
                          record))
        return steps
    running = gcloud("storage", "cat", pointer, project_flag(config))
    refusal = (f"deployment {config.name} runs release $zerolake_running and this plan's is $zerolake_release: "
               "move the deployment with `python -m operations.deploy update` (the same flags), or add VMs of its "
               "release with --release $zerolake_running")
    steps.append(Step("package", "one release per deployment: record this one, or refuse one of another",
                      f"zerolake_running=$({running} 2>/dev/null || true)\n"
                      f"if [[ -z $zerolake_running ]]; then\n{indent(record)}\n"
                      f'elif [[ $zerolake_running != "$zerolake_release" ]]; then\n{indent(_error(refusal))}\nfi'))
    return steps


# ---- the release's images: Dataflow's workers', and the VMs' ---------------------------------

def image_repository(config: DeployConfig) -> str:
    """The deployment's Artifact Registry repository (Docker), in the follower's region."""
    return f"{config.name}-images"


def image_name(config: DeployConfig) -> str:
    return f"{config.dataflow_region}-docker.pkg.dev/{config.project}/{image_repository(config)}/dataflow-worker"


def vm_image_kinds(config: DeployConfig) -> tuple[str, ...]:
    """The accelerators whose VM image of the release this plan needs: ``cpu`` for the follower, CPU workers
    and a CPU trainer, ``gpu`` for GPU workers and a GPU trainer (TensorFlow's CUDA wheels make that image
    gigabytes larger, so CPU VMs never pull it).  A TPU trainer needs none: it keeps pip at boot."""
    kinds = set()
    if config.shuffle:
        kinds.add("cpu")
    if config.workers:
        kinds.add(config.worker_kind)
    if config.trainer_kind in ("cpu", "gpu"):
        kinds.add(config.trainer_kind)
    return tuple(sorted(kinds))


def vm_image_name(config: DeployConfig, kind: str) -> str:
    """The release's VM image of one accelerator: ./Dockerfile built with ``--build-arg ACCELERATOR=kind``."""
    return f"{config.dataflow_region}-docker.pkg.dev/{config.project}/{image_repository(config)}/zerolake-{kind}"


def vm_image(config: DeployConfig, kind: str) -> str:
    """What a VM's metadata names: the image by the digest the plan read (``$zerolake_vm_image_KIND``)."""
    return f"{vm_image_name(config, kind)}@{VM_IMAGE_VARS[kind]}"


def builder_account_id(config: DeployConfig) -> str:
    return f"{config.name}-builder"


def builder_account(config: DeployConfig) -> str:
    return f"{builder_account_id(config)}@{config.project}.iam.gserviceaccount.com"


def builder_account_steps(config: DeployConfig) -> list[Step]:
    """Cloud Build's own account for the images: push to the one repository, read the staged source, log."""
    who = f"--member=serviceAccount:{builder_account(config)}"
    return [account_step(config, builder_account_id(config), "the account Cloud Build builds the release's images as"),
            Step("account", "the builder reads the build's source, staged in the deploy area of the bucket",
                 grant("storage", "buckets", "add-iam-policy-binding", f"gs://{config.bucket}", who,
                       "--role=roles/storage.objectViewer", project_flag(config))),
            Step("account", "the builder writes the build's log",
                 grant("projects", "add-iam-policy-binding", config.project, who, "--role=roles/logging.logWriter",
                       "--condition=None"))]


UNPACK_STEP = ("- name: gcr.io/cloud-builders/docker",
               "  entrypoint: bash",
               "  args: ['-c', 'tar -xzf zerolake.tar.gz --strip-components=1 && rm zerolake.tar.gz']")
"""The VM image's first build step: the release unpacked in the build's workspace (its own Dockerfile and
.dockerignore included), so the image is built from the release object, not from this checkout."""


def cloudbuild_config(config: DeployConfig, image: str, build_args: tuple[str, ...] = (),
                      first: tuple[str, ...] = ()) -> str:
    """The build: Docker from the context (after the steps ``first``), pushed, logged to Cloud Logging only
    (a build under its own account needs a log destination), as the builder account."""
    args = "".join(f", --build-arg, '{arg}'" for arg in build_args)
    return "\n".join([
        "steps:",
        *first,
        "- name: gcr.io/cloud-builders/docker",
        f"  args: [build{args}, --tag, '{image}', .]",
        f"images: ['{image}']",
        f"serviceAccount: projects/{config.project}/serviceAccounts/{builder_account(config)}",
        "options:",
        "  logging: CLOUD_LOGGING_ONLY",
        "timeout: 3600s"])


def _build(config: DeployConfig, context: str, image: str, why: str) -> Step:
    """Cloud Build of one context into ``image`` (a tag naming the release), unless that tag exists."""
    build = gcloud("builds", "submit", Raw(f'"{context}"'), Raw(f'--config="{context}/cloudbuild.yaml"'),
                   f"--region={config.dataflow_region}", f"--gcs-source-staging-dir={config.deploy_area}/build-source",
                   project_flag(config))
    return Step("image", f"{why}: build and push it with Cloud Build (no Docker needed here), unless built before",
                unless_exists(gcloud("artifacts", "docker", "images", "describe", Raw(f'"{image}"'),
                                     project_flag(config)), build))


def image_steps(config: DeployConfig) -> list[Step]:
    """Build the release's images, each from the release object itself (its sha256 checked), so images and
    VMs run one release, and each skipped when that release's image exists:

    * Dataflow's workers' (with Dataflow): Beam's own SDK image with the release installed by install.sh;
    * the VMs' (`vm_image_kinds`): ./Dockerfile of the release, ``ACCELERATOR=cpu`` or ``gpu``, the
      non-root image that scripts/check_image.sh checks.  Every Compute Engine VM pulls it by digest
      (operations/vm/startup-image.sh), so no VM installs anything at boot.
    """
    kinds = vm_image_kinds(config)
    if not config.uses_dataflow and not kinds:
        return []
    repository, region = image_repository(config), config.dataflow_region
    create = gcloud("artifacts", "repositories", "create", repository, "--repository-format=docker",
                    f"--location={region}", project_flag(config),
                    f"--description=zerolake {config.name}: the images of its releases")
    steps = [Step("image", f"the deployment's image repository, in {region} next to the follower and its jobs",
                  unless_exists(gcloud("artifacts", "repositories", "describe", repository, f"--location={region}",
                                       project_flag(config)), create))]
    for role in config.planned_roles:
        if role == "trainer" and config.trainer_kind == "tpu":
            continue        # the TPU trainer installs with pip at boot: it pulls no image
        steps.append(Step("image", f"the {role} VMs pull the release's image"
                                   + (" (and the follower's Dataflow workers theirs)" if role == "shuffle" else ""),
                          grant("artifacts", "repositories", "add-iam-policy-binding", repository,
                                f"--location={region}", member(config, role), "--role=roles/artifactregistry.reader",
                                project_flag(config))))
    steps.append(Step("image", "Cloud Build's account pushes the images",
                      grant("artifacts", "repositories", "add-iam-policy-binding", repository, f"--location={region}",
                            f"--member=serviceAccount:{builder_account(config)}",
                            "--role=roles/artifactregistry.writer", project_flag(config))))
    mismatch = "the release downloaded for the images has sha256 $zerolake_got, not $zerolake_release"
    steps.append(Step("image", "the release, downloaded once for the builds and checked against its sha256", "\n".join([
        "zerolake_release_file=$(mktemp)",
        gcloud("storage", "cp", Expand(release_url(config)), Raw('"$zerolake_release_file"'), project_flag(config)),
        'zerolake_got=$(sha256sum "$zerolake_release_file" | cut -d" " -f1)',
        f'if [[ $zerolake_got != "$zerolake_release" ]]; then\n{indent(_error(mismatch))}\nfi'])))
    if config.uses_dataflow:
        image = f"{image_name(config)}:{RELEASE_TAG}$zerolake_release"
        context = "\n".join([
            "zerolake_context=$(mktemp -d)",
            command("cp", Raw('"$zerolake_release_file"'), Raw('"$zerolake_context/zerolake.tar.gz"')),
            command("cp", str(DATAFLOW_DOCKERFILE), Raw('"$zerolake_context/Dockerfile"')),
            f"cat > \"$zerolake_context/cloudbuild.yaml\" <<EOF\n{cloudbuild_config(config, image)}\nEOF"])
        steps += [Step("image", "Dataflow's build context: operations/dataflow/Dockerfile and the release, tagged "
                                "by its sha256", context),
                  _build(config, "$zerolake_context", image, "the Dataflow workers' image")]
    for kind in kinds:
        image = f"{vm_image_name(config, kind)}:{RELEASE_TAG}$zerolake_release"
        context = "\n".join([
            f"zerolake_vm_context_{kind}=$(mktemp -d)",
            command("cp", Raw('"$zerolake_release_file"'), Raw(f'"$zerolake_vm_context_{kind}/zerolake.tar.gz"')),
            f"cat > \"$zerolake_vm_context_{kind}/cloudbuild.yaml\" <<EOF\n"
            f"{cloudbuild_config(config, image, (f'ACCELERATOR={kind}',), UNPACK_STEP)}\nEOF"])
        steps += [Step("image", f"the {kind.upper()} VMs' build context: the release, unpacked by the build, its "
                                f"own Dockerfile built with ACCELERATOR={kind}", context),
                  _build(config, f"$zerolake_vm_context_{kind}", image, f"the {kind.upper()} VMs' image")]
    return steps


def vm_image_digest_step(config: DeployConfig, kind: str, section: str) -> Step:
    """``$zerolake_vm_image_KIND``: the digest of the release's VM image, which the VMs' metadata names
    (``IMAGE@sha256:...``): a later push to any tag cannot change what a VM pulls."""
    tag = f"{vm_image_name(config, kind)}:{RELEASE_TAG}$zerolake_release"
    describe = gcloud("artifacts", "docker", "images", "describe", Raw(f'"{tag}"'), project_flag(config),
                      "--format=value(image_summary.digest)")
    missing = (f"there is no {kind.upper()} VM image of release $zerolake_release ({tag}): plan the image section "
               "for it (it builds from the release)")
    var = f"zerolake_vm_image_{kind}"
    return Step(section, f"the digest of the release's {kind.upper()} VM image, which the VMs' metadata names",
                f"if ! {var}=$({describe}) || [[ ${var} != sha256:* ]]; then\n{indent(_error(missing))}\nfi")


def image_digest_step(config: DeployConfig) -> Step:
    """``$zerolake_image_digest``: the digest of the release's Dataflow image, which the follower's jobs name
    (``IMAGE@sha256:...``), so a later push to any tag cannot change what they run."""
    tag = f"{image_name(config)}:{RELEASE_TAG}$zerolake_release"
    describe = gcloud("artifacts", "docker", "images", "describe", Raw(f'"{tag}"'), project_flag(config),
                      "--format=value(image_summary.digest)")
    missing = (f"there is no Dataflow image of release $zerolake_release ({tag}): plan the image section for it "
               "(it builds from the release)")
    return Step("shuffle", "the digest of the release's Dataflow image, which the follower's jobs run",
                f"if ! zerolake_image_digest=$({describe}) || [[ $zerolake_image_digest != sha256:* ]]; then\n"
                f"{indent(_error(missing))}\nfi")


# ---- the VMs -------------------------------------------------------------------------------

def _image_flags(image: str) -> list[str]:
    project, family = image.split("/")
    return [f"--image-project={project}", f"--image-family={family}"]


def accelerator_check(config: DeployConfig, role: str, kind: str, accelerator: str, zone: str = "") -> Step:
    """Ask gcloud, live, whether a zone of the role offers the accelerator, before anything is created there.

    The plan-time check (operations.deploy.zones) reads a dated table; this one
    reads the zone as it is today.  A listing that fails (no permission, API
    not enabled yet) is reported and the create goes ahead, saying why it may
    fail, rather than stopping a plan that may well succeed.  ``zone``: one of
    the worker group's zones ('' = the role's zone).
    """
    zone = zone or config.zone_of(role)
    if kind == "tpu":
        listing = gcloud("compute", "tpus", "accelerator-types", "list", f"--zone={zone}", project_flag(config),
                         f"--filter=type={accelerator}", "--format=value(type)")
        source = f"gcloud compute tpus accelerator-types list --zone={zone}"
    else:
        listing = gcloud("compute", "accelerator-types", "list", project_flag(config),
                         f"--filter=zone:{zone} AND name={accelerator}", "--format=value(name)")
        source = f"gcloud compute accelerator-types list --filter=zone:{zone}"
    flag = "--worker-zones" if role == "worker" and config.worker_zones else f"--{role}-zone"
    shell = (f"if zerolake_found=$({listing}); then\n"
             f"  if ! grep -qx -- {shlex.quote(accelerator)} <<< \"$zerolake_found\"; then\n"
             f"    echo {shlex.quote(f'error: zone {zone} offers no {accelerator} today ({source}); choose another {flag}: docs/deploy.md lists the zones of each type')} >&2\n"
             "    exit 2\n  fi\n"
             f"else\n  echo {shlex.quote(f'warning: could not list the accelerators of {zone} (see above); creating the {role} anyway')} >&2\n"
             "fi")
    return Step(section_of(role), f"{zone} offers {accelerator} today (asked live)", shell)


def section_of(role: str) -> str:
    return {"worker": "workers"}.get(role, role)


def _vm_flags(config: DeployConfig, role: str, *, machine: str, gpu: str, gpu_count: int, spot: bool,
              disk_gb: int, args: str, processes: int = 1) -> list:
    """What a VM of ``role`` is: the words an instance and an instance template share (no name, no zone)."""
    accelerator = "gpu" if gpu else "cpu"
    extra = (("install-nvidia-driver=True",) if gpu else ()) + ("enable-guest-attributes=TRUE",
                                                                 f"{IMAGE_METADATA}={vm_image(config, accelerator)}")
    flags = [project_flag(config), f"--machine-type={machine}",
             *_image_flags(config.gpu_image if gpu else config.cpu_image),
             f"--boot-disk-size={disk_gb}GB", "--boot-disk-type=pd-balanced", *vm_network_flags(config),
             f"--service-account={config.service_account(role)}", f"--scopes={CLOUD_PLATFORM_SCOPE}",
             f"--metadata-from-file=startup-script={IMAGE_STARTUP_SCRIPT}",
             metadata(config, role, accelerator, args, processes, extra),
             labels(config, role)]
    if gpu and not GPU_KINDS[gpu].bundled:
        flags.append(f"--accelerator=type={gpu},count={gpu_count}")
    if gpu or spot:
        # GPUs cannot live-migrate; spot VMs cannot either.
        flags.append("--maintenance-policy=TERMINATE")
    if spot:
        flags += ["--provisioning-model=SPOT", "--instance-termination-action=STOP"]
    return flags


def _vm_create(config: DeployConfig, name: str, role: str, **vm) -> list:
    """The words of one Compute Engine VM's create command, after ``gcloud``."""
    return ["compute", "instances", "create", name, f"--zone={config.zone_of(role)}", *_vm_flags(config, role, **vm)]


def _vm_describe(config: DeployConfig, name: str, role: str) -> str:
    return gcloud("compute", "instances", "describe", name, f"--zone={config.zone_of(role)}", project_flag(config))


# ---- the worker group ------------------------------------------------------------------------

def worker_group_name(name: str) -> str:
    """The regional managed instance group of deployment ``name``'s workers; its VMs are ``NAME-worker-xxxx``."""
    return f"{name}-workers"


def worker_group(config: DeployConfig) -> str:
    return worker_group_name(config.name)


def _worker_vm(config: DeployConfig) -> dict:
    return dict(machine=config.worker_machine_type(), gpu=config.worker_gpu, gpu_count=config.worker_gpu_count,
                spot=config.spot, disk_gb=200 if config.worker_gpu else 50, args=config.worker_args,
                processes=config.processes_per_worker)


def _template_flags(config: DeployConfig) -> list:
    """The worker template's flags: a worker VM's, its spool disk, and the region of a named subnet."""
    flags = _vm_flags(config, "worker", **_worker_vm(config))
    flags.append(f"--create-disk=device-name={SPOOL_DEVICE},size={SPOOL_DISK_GB}GB,type=pd-balanced")
    if config.subnet:          # a global template names its subnet's region (instance-templates create --help)
        flags.append(f"--region={config.worker_region}")
    return flags


def worker_template_prefix(config: DeployConfig) -> str:
    return f"{config.name}-worker-"


def worker_template(config: DeployConfig) -> str:
    """The template's name: ``NAME-worker-<8 hex of its settings>-<12 of the release's sha256>``, as the shell
    variable ``$zerolake_template`` holds it (the release is known only when the plan runs).

    A template cannot be changed, so a new release, new worker settings (machine, flags, GPUs) or a new
    start-up script is a new template, and a rerun with the same ones finds the one it made.  The script is
    hashed by its text, not its path, so two checkouts of one commit name one template."""
    import hashlib
    words = [w for w in _template_flags(config) if not w.startswith("--metadata-from-file=")]
    settings = hashlib.sha256(repr(words).encode() + IMAGE_STARTUP_SCRIPT.read_bytes()).hexdigest()[:8]
    return f"{worker_template_prefix(config)}{settings}-" + "${zerolake_release:0:12}"


def _group(config: DeployConfig, verb: str, *words) -> str:
    """``gcloud compute instance-groups managed VERB NAME-workers --region --project WORDS...`` (VERB may be two
    words: ``rolling-action start-update``)."""
    return gcloud("compute", "instance-groups", "managed", *verb.split(), worker_group(config),
                  f"--region={config.worker_region}", project_flag(config), *words)


def template_step(config: DeployConfig) -> Step:
    """``$zerolake_template``: the workers' instance template of this release and these settings, made if
    missing (a spot VM with the release in its metadata, and the spool disk)."""
    create = gcloud("compute", "instance-templates", "create", Raw('"$zerolake_template"'), *_template_flags(config))
    describe = gcloud("compute", "instance-templates", "describe", Raw('"$zerolake_template"'), project_flag(config))
    what = (f"{config.worker_gpu_count} x {config.worker_gpu}" if config.worker_gpu else "CPU") + \
        f", {config.processes_per_worker} worker processes" + (", spot" if config.spot else "")
    return Step("workers", f"the workers' instance template ({what}; the release in its metadata, the spool on "
                           f"the disk {SPOOL_DEVICE})",
                f"zerolake_template={worker_template(config)}\n{unless_exists(describe, create)}")


def rolling_update(config: DeployConfig) -> str:
    """Move the group's VMs to ``$zerolake_template``: each is recreated under its name (the stateful spool
    disk needs ``recreate``; no surge), all of them at once, as a stop of every worker did before."""
    unavailable = max(config.workers, len(config.worker_group_zones))   # a regional group: 0 or >= its zones
    return _group(config, "rolling-action start-update", Raw('--version=template="$zerolake_template"'), "--type=proactive",
                  "--replacement-method=recreate", "--max-surge=0", f"--max-unavailable={unavailable}")


def worker_steps(config: DeployConfig) -> list[Step]:
    """The workers: a template, then the regional group at ``--workers`` VMs.

    A group that exists is resized to ``--workers`` and moved to this plan's
    template (a no-op when it runs it already).  Creating the group returns
    at once; its VMs come when Compute Engine can make them (a stockout of
    spot VMs delays them, and the group keeps trying): ``status`` shows the
    group's VMs against its target.
    """
    if not config.workers:
        return []
    steps = []
    if config.worker_gpu:
        steps += [accelerator_check(config, "worker", "gpu", config.worker_gpu, zone)
                  for zone in config.worker_group_zones]
    steps += [vm_image_digest_step(config, config.worker_kind, "workers"), template_step(config)]
    create = _group(config, "create", f"--zones={','.join(config.worker_group_zones)}",
                    Raw('--template="$zerolake_template"'), f"--size={config.workers}",
                    f"--base-instance-name={config.name}-worker", "--target-distribution-shape=any",
                    "--instance-redistribution-type=none",
                    f"--stateful-disk=device-name={SPOOL_DEVICE},auto-delete={SPOOL_AUTO_DELETE}")
    existing = "\n".join([_group(config, "resize", f"--size={config.workers}"), rolling_update(config)])
    shell = f"if {_group(config, 'describe')} >/dev/null 2>&1; then\n{indent(existing)}\nelse\n{indent(create)}\nfi"
    zones = ", ".join(config.worker_group_zones)
    steps.append(Step("workers", f"the worker group {worker_group(config)}: {config.workers} VMs in {zones} "
                                 "(a preempted one is recreated, its spool disk kept); a group that exists is "
                                 "resized to that and moved to this template", shell))
    return steps


def dataflow_args(config: DeployConfig) -> str:
    """The Beam flags the follower passes to each window's job (pipeline.shuffle's unknown flags)."""
    return " ".join([
        "--runner=DataflowRunner", f"--project={config.project}", f"--region={config.dataflow_region}",
        f"--temp_location={config.deploy_area}/dataflow-tmp",
        f"--staging_location={config.deploy_area}/dataflow-staging",
        # The image section's build: Beam's SDK image with zerolake installed; workers install nothing at boot.
        f"--sdk_container_image={image_name(config)}@{IMAGE_DIGEST_VAR}",
        f"--service_account_email={config.service_account('shuffle')}",
        f"--max_num_workers={config.dataflow_max_workers}", f"--machine_type={config.dataflow_machine}",
        *dataflow_network_args(config)])


def shuffle_runner_args(config: DeployConfig) -> str:
    """The follower's flags that choose where each window is built (pipeline.follow)."""
    if not config.uses_dataflow:
        return ""
    if config.shuffle_runner == "auto":
        return f"--dataflow-above-positions={config.dataflow_above_positions} {dataflow_args(config)}"
    return dataflow_args(config)


def shuffle_steps(config: DeployConfig) -> list[Step]:
    args = " ".join(a for a in (config.shuffle_args, shuffle_runner_args(config)) if a)
    where = {"local": "on this VM (Beam's in-process runner)", "dataflow": "on Dataflow",
             "auto": f"on this VM up to {config.dataflow_above_positions:,} positions, larger ones on "
                     "Dataflow"}[config.shuffle_runner]
    name = f"{config.name}-shuffle"
    create = retried(CREATE_TRIES, *_vm_create(config, name, "shuffle", machine=config.shuffle_machine, gpu="",
                                               gpu_count=0, spot=False, disk_gb=100, args=args))
    digest = [image_digest_step(config)] if config.uses_dataflow else []
    digest.append(vm_image_digest_step(config, "cpu", "shuffle"))
    return digest + [Step("shuffle", f"the shuffle follower: builds each window {where}",
                          unless_exists(_vm_describe(config, name, "shuffle"), create))]


def trainer_steps(config: DeployConfig) -> list[Step]:
    name = f"{config.name}-trainer"
    zone = config.zone_of("trainer")
    if config.trainer_kind == "tpu":
        return [accelerator_check(config, "trainer", "tpu", config.trainer_tpu), tpu_queue_step(config)]
    gpu = config.trainer_gpu
    what = f"{config.trainer_gpu_count} x {gpu}" + (", MirroredStrategy" if config.trainer_gpu_count > 1 else "") \
        if gpu else "CPU"
    create = retried(CREATE_TRIES, *_vm_create(config, name, "trainer", machine=config.trainer_machine_type(),
                                               gpu=gpu, gpu_count=config.trainer_gpu_count, spot=False,
                                               disk_gb=200 if gpu else 100, args=config.trainer_args))
    note = (f"note: the trainer VM {name} could not be created in {zone} (see the gcloud messages above; often "
            "no capacity there right now); the other roles go on, and a rerun of this plan adds it")
    # Not fatal: without a trainer the workers still play (generation 0 or the last model) and the follower
    # still builds windows, and a rerun creates the trainer, which resumes from ROOT/checkpoints.
    shell = (f"if ! {_vm_describe(config, name, 'trainer')} >/dev/null 2>&1 \\\n    && ! {create}; then\n"
             f"  echo {shlex.quote(note)} >&2\n  zerolake_missing+=\" {name}\"\nfi")
    steps = [accelerator_check(config, "trainer", "gpu", gpu)] if gpu else []
    steps.append(vm_image_digest_step(config, config.trainer_kind, "trainer"))
    return steps + [Step("trainer", f"the trainer on a {what} VM", shell)]


def _queued(config: DeployConfig, verb: str, *words) -> str:
    """``gcloud compute tpus queued-resources VERB NAME-trainer --zone --project ...`` as words."""
    return gcloud("compute", "tpus", "queued-resources", verb, f"{config.name}-trainer",
                  f"--zone={config.zone_of('trainer')}", project_flag(config), *words)


def quota_line(config: DeployConfig) -> str:
    return (f"error: the project has no TPU quota left for {config.trainer_tpu} in {config.zone_of('trainer')} "
            f"(zero, or used up): ask for it under IAM & Admin > Quotas ({TPU_QUOTA_PAGE}); "
            "the other roles go on without a trainer")


def tpu_queue_step(config: DeployConfig) -> Step:
    """Queue the TPU trainer (unless queued or there), deleting a FAILED or SUSPENDED request first.

    ``queued-resources create`` returns once the request is in the queue; the
    TPU VM is created (and its start-up script starts the trainer) whenever
    capacity comes, until ``--valid-until-duration``.  The request and its TPU
    VM share the name ``NAME-trainer``.  A TPU VM of that name created without
    a request (an older plan's ``tpu-vm create``) is left alone.
    """
    name = f"{config.name}-trainer"
    zone = config.zone_of("trainer")
    create = _queued(config, "create", f"--node-id={name}", f"--accelerator-type={config.trainer_tpu}",
                     f"--runtime-version={config.tpu_runtime}",
                     f"--valid-until-duration={config.trainer_tpu_valid_for}",
                     f"--service-account={config.service_account('trainer')}", f"--scopes={CLOUD_PLATFORM_SCOPE}",
                     f"--metadata-from-file=startup-script={STARTUP_SCRIPT}",
                     metadata(config, "trainer", "tpu", config.trainer_args,
                              extra=(f"zerolake-tpu-generation={config.tpu_generation}",)),
                     labels(config, "trainer"), *tpu_network_flags(config))
    state = _queued(config, "describe", "--format=value(state.state)")
    node = gcloud("compute", "tpus", "tpu-vm", "describe", name, f"--zone={zone}", project_flag(config))
    delete = _queued(config, "delete", "--force", "--quiet")
    shell = "\n".join([
        f"zerolake_tpu_state=$({state} 2>/dev/null || true)",
        'if [[ $zerolake_tpu_state == FAILED || $zerolake_tpu_state == SUSPENDED ]]; then',
        f"  echo \"note: the trainer's earlier TPU request is $zerolake_tpu_state (failed, or expired after "
        f"--trainer-tpu-valid-for); deleting it to queue a new one\" >&2",
        indent(delete),
        '  zerolake_tpu_state=""',
        "fi",
        f"if [[ -z $zerolake_tpu_state ]] && {node} >/dev/null 2>&1; then",
        "  zerolake_tpu_state=NODE        # a TPU VM made without a request: nothing to queue or wait for",
        "elif [[ -z $zerolake_tpu_state ]]; then",
        f"  if zerolake_out=$({create.replace(chr(10), chr(10) + '    ')} 2>&1); then",
        '    zerolake_tpu_state=QUEUED',
        "  else",
        '    if grep -qi quota <<< "$zerolake_out"; then',
        f"      echo {shlex.quote(quota_line(config))} >&2",
        "    else",
        '      printf \'%s\\n\' "$zerolake_out" >&2',
        "    fi",
        f'    zerolake_tpu_state=NONE; zerolake_missing+=" {name}"',
        "  fi",
        "fi"])
    return Step("trainer", f"queue the trainer's Cloud TPU VM ({config.trainer_tpu}, runtime {config.tpu_runtime}, "
                           f"waiting for capacity up to {config.trainer_tpu_valid_for}; install.sh adds the pinned "
                           "tensorflow-tpu, run-role.sh its PJRT environment)", shell)


def tpu_wait_step(config: DeployConfig) -> Step:
    """After the workers: poll the queued request until ACTIVE or FAILED, or ``--trainer-wait-minutes``."""
    name = f"{config.name}-trainer"
    state = _queued(config, "describe", "--format=value(state.state)")
    reason = _queued(config, "describe", "--format=value(state.failedData.error.message)")
    minutes = config.trainer_wait_minutes
    still = (f"note: the trainer's TPU request is still $zerolake_tpu_state after {minutes} minutes; it stays "
             f"queued until --trainer-tpu-valid-for ({config.trainer_tpu_valid_for}) and the TPU VM starts "
             "training when capacity comes (see it with: gcloud compute tpus queued-resources list "
             f"--zone={config.zone_of('trainer')})")
    failed = ("error: the trainer's TPU request is $zerolake_tpu_state: ${zerolake_reason:-no reason given}; "
              "a rerun of this plan deletes it and queues a new one")
    waiting = " || ".join(f"$zerolake_tpu_state == {s}" for s in ("QUEUED", "CREATING", "ACCEPTED",
                                                                 "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"))
    shell = "\n".join([
        f"if [[ {waiting} ]]; then",
        f"  zerolake_deadline=$((SECONDS + {minutes * 60}))",
        "  while :; do",
        f"    zerolake_tpu_state=$({state} 2>/dev/null || echo UNKNOWN)",
        '    case "$zerolake_tpu_state" in',
        "      ACTIVE)",
        "        echo \"the trainer's TPU is ACTIVE: its start-up script installs and starts the trainer\" >&2",
        "        break ;;",
        "      FAILED|SUSPENDED)",
        f"        zerolake_reason=$({reason} 2>/dev/null || true)",
        '        if grep -qi quota <<< "$zerolake_reason"; then',
        f"          echo {shlex.quote(quota_line(config))} >&2",
        "        else",
        f'          echo "{failed}" >&2',
        "        fi",
        f'        zerolake_missing+=" {name}"; break ;;',
        "    esac",
        "    if (( SECONDS >= zerolake_deadline )); then",
        f'      echo "{still}" >&2',
        f'      zerolake_missing+=" {name} (queued: $zerolake_tpu_state)"; break',
        "    fi",
        f'    sleep "${{ZEROLAKE_POLL_SECONDS:-{POLL_SECONDS}}}"',
        "  done",
        "fi"])
    return Step("trainer", f"wait for the trainer's TPU (ACTIVE or FAILED, at most {minutes} minutes; the "
                           "workers were created meanwhile)", shell)


def missing_step() -> Step:
    return Step("summary", "name what could not be had yet; everything else is up, and a rerun adds the rest",
                'if [[ -n $zerolake_missing ]]; then\n'
                '  echo "note: not up yet:$zerolake_missing; the other roles are running, and a rerun of this plan '
                'adds what is missing" >&2\n'
                "  exit 3\nfi")


def build_plan(config: DeployConfig) -> list[Step]:
    """Every step of bringing the deployment up, in order, restricted to ``--only``."""
    builders = {"services": services_steps, "bucket": bucket_steps, "account": account_steps,
                "package": release_steps, "image": image_steps, "workers": worker_steps,
                "shuffle": lambda c: shuffle_steps(c) if c.shuffle else [],
                "trainer": lambda c: trainer_steps(c) if c.trainer_kind else []}
    sections = list(config.sections)
    if "package" not in sections and {"image", "shuffle", "trainer", "workers"} & set(sections):
        sections.insert(sections.index(next(s for s in sections if s in ("image", "shuffle", "trainer",
                                                                          "workers"))), "package")
    steps = [step for section in sections for step in builders[section](config)]
    if "trainer" in config.sections and config.trainer_kind == "tpu":
        steps.append(tpu_wait_step(config))         # after the workers: they need not wait for a TPU
    if "trainer" in config.sections and config.trainer_kind:
        steps.append(missing_step())
    return steps


# ---- update -----------------------------------------------------------------------------

def build_update_plan(config: DeployConfig) -> list[Step]:
    """Move a running deployment to one release: built from this checkout, or ``--release``.

    In order: the release (uploaded, and recorded as the deployment's, so a
    ``plan`` run meanwhile adds VMs of it), its Dataflow image (by digest), the
    trainer and the follower (their metadata, then stopped and started
    together, so the trainer, the follower and the follower's image change
    release at once), then the workers: a new instance template of the
    release, and a rolling update of the group to it (`worker_rollout_steps`).
    The trainer's and the follower's metadata is set before they stop, so
    whatever starts them (this plan, a person) starts the new release.
    Stopping is a clean shutdown: systemd gives each role SIGTERM (a worker
    uploads its spool, the trainer checkpoints).  The trainer and the follower
    keep their disks, so an update reinstalls only the package.
    """
    steps = release_steps(config, update=True) + image_steps(config)
    if config.uses_dataflow:
        steps.append(image_digest_step(config))
    roles = {"shuffle": config.shuffle, "trainer": config.trainer_kind in ("cpu", "gpu")}
    steps += [vm_image_digest_step(config, "cpu" if role == "shuffle" else config.trainer_kind, "rollout")
              for role, planned in roles.items() if planned]
    if config.workers:
        steps.append(vm_image_digest_step(config, config.worker_kind, "workers"))
    steps += core_rollout_steps(config)
    if config.workers:
        steps += worker_rollout_steps(config)
    return steps


def _refresh_metadata(config: DeployConfig, role: str, name: str) -> list[str]:
    """The words of setting one Compute Engine VM's release (and the start-up script that checks it)."""
    kind = "cpu" if role == "shuffle" else config.trainer_kind
    entries = [*release_metadata(config), f"{IMAGE_METADATA}={vm_image(config, kind)}"]
    if role == "shuffle":       # its jobs' image digest travels in its flags
        args = " ".join(a for a in (config.shuffle_args, shuffle_runner_args(config)) if a)
        entries.append(f"zerolake-args={args}")
    return ["compute", "instances", "add-metadata", name, f"--zone={config.zone_of(role)}", project_flag(config),
            Expand("--metadata=" + ",".join(entries)), f"--metadata-from-file=startup-script={IMAGE_STARTUP_SCRIPT}"]


WHO = {"shuffle": "follower", "trainer": "trainer"}


def core_rollout_steps(config: DeployConfig) -> list[Step]:
    """The follower and the trainer: the new release in their metadata, then both stopped, then both started."""
    present, stops, starts = [], [], []
    for role in ("shuffle", "trainer"):
        if (role == "shuffle" and not config.shuffle) or (role == "trainer" and not config.trainer_kind):
            continue
        name = f"{config.name}-{role}"
        zone = config.zone_of(role)
        if role == "trainer" and config.trainer_kind == "tpu":
            # A TPU VM's metadata is updated in place; its start-up script stays the one it was created with.
            describe = gcloud("compute", "tpus", "tpu-vm", "describe", name, f"--zone={zone}", project_flag(config))
            refresh = gcloud("compute", "tpus", "tpu-vm", "update", name, f"--zone={zone}", project_flag(config),
                             Expand("--update-metadata=" + ",".join(release_metadata(config))))
            stop = gcloud("compute", "tpus", "tpu-vm", "stop", name, f"--zone={zone}", project_flag(config))
            start = gcloud("compute", "tpus", "tpu-vm", "start", name, f"--zone={zone}", project_flag(config))
        else:
            describe = _vm_describe(config, name, role)
            refresh = gcloud(*_refresh_metadata(config, role, name))
            stop = gcloud("compute", "instances", "stop", name, f"--zone={zone}", project_flag(config))
            start = gcloud("compute", "instances", "start", name, f"--zone={zone}", project_flag(config))
        flag = f"zerolake_has_{role}"
        note = f"note: there is no {name} to update; a rerun of plan creates it with this release"
        present.append(Step("rollout", f"the {WHO[role]}'s metadata names the new release",
                            f"{flag}=0\nif {describe} >/dev/null 2>&1; then\n  {flag}=1\n{indent(refresh)}\n"
                            f"else\n  echo {shlex.quote(note)} >&2\nfi"))
        stops.append(Step("rollout", f"stop the {WHO[role]} (SIGTERM to its role: a clean stop)",
                          f"if (( {flag} )); then\n{indent(stop)}\nfi"))
        what = ("checks and installs the release" if role == "trainer" and config.trainer_kind == "tpu"
                else "pulls the release's image by digest and runs the role in it")
        starts.append(Step("rollout", f"start the {WHO[role]}: its start-up script {what}",
                           f"if (( {flag} )); then\n{indent(start)}\nfi"))
    return present + stops + starts


def worker_rollout_steps(config: DeployConfig) -> list[Step]:
    """After the trainer and the follower: the release's worker template, then the group rolled onto it.

    The group recreates each VM from the new template (a new boot disk with the
    new release; its stateful spool disk reattached): a worker's SIGTERM at the
    recreation uploads its spool, and what it could not upload waits on the
    disk for the new VM.  A recreation that cannot get spot capacity now is
    retried by the group, not by this plan.
    """
    note = (f"note: there is no worker group {worker_group(config)} in {config.worker_region} to update; a rerun of "
            "plan creates it with this release")
    shell = f"if {_group(config, 'describe')} >/dev/null 2>&1; then\n{indent(rolling_update(config))}\n" \
            f"else\n  echo {shlex.quote(note)} >&2\nfi"
    return [template_step(config),
            Step("workers", "then the workers: the group recreates each VM from the new template", shell)]


# ---- down -------------------------------------------------------------------------------

def build_down_plan(config: DeployConfig, *, keep_workers: int = 0, workers_only: bool = False,
                    delete_account: bool = False) -> list[Step]:
    """Delete the deployment's VMs (selected by label, then by exact name); keep the bucket and its lake.

    ``workers_only``: only resize the worker group to ``keep_workers`` VMs (a
    scale-down; the group chooses which go, and each one's SIGTERM uploads its
    spool).  Otherwise the worker group and its templates go, the follower and
    the trainer, the run's Dataflow jobs, and with ``delete_account`` the
    service accounts.
    """
    if workers_only:
        resize = _group_in_found_region(config, "resize", f"--size={keep_workers}")
        return [_find_group_step(config), Step(
            "workers", f"scale the worker group down to {keep_workers} VMs (each one deleted uploads its spool on "
                       "SIGTERM first)", f"if [[ -n $zerolake_group_region ]]; then\n{indent(resize)}\nfi")]
    select = deployment_filter(config)
    delete_group = _group_in_found_region(config, "delete", "--quiet")
    steps = [_find_group_step(config),
             Step("workers", "the worker group and its VMs (each one's SIGTERM uploads its spool first; their spool "
                             "disks go with them)",
                  f"if [[ -n $zerolake_group_region ]]; then\n{indent(delete_group)}\nfi")]
    prefix = worker_template_prefix(config)
    templates = gcloud("compute", "instance-templates", "list", project_flag(config), f"--filter=name ~ ^{prefix}",
                       "--format=value(name)")
    delete_template = gcloud("compute", "instance-templates", "delete", Raw('"$name"'), project_flag(config),
                             "--quiet", Raw("</dev/null"))     # not the listing that feeds the loop
    steps.append(Step("workers", "the workers' instance templates (this deployment's names only)",
                      f"{templates} | while read -r name; do\n"
                      f"  if [[ $name =~ ^{prefix}[0-9a-f]{{8}}-[0-9a-f]{{12}}$ ]]; then\n    {delete_template}\n"
                      "  fi\ndone"))
    listing = gcloud("compute", "instances", "list", project_flag(config),
                     f"--filter={select} AND NOT labels.zerolake-role=worker", "--format=value(name,zone.basename())")
    delete = gcloud("compute", "instances", "delete", Raw('"$name"'), Raw('--zone="$zone"'), project_flag(config),
                    "--quiet", Raw("</dev/null"))
    is_other = f'[[ $name == "{config.name}-shuffle" || $name == "{config.name}-trainer" ]]'
    steps.append(Step("shuffle", "the shuffle follower and a GPU or CPU trainer",
                      f"{listing} | while read -r name zone; do\n  if {is_other}; then\n    {delete}\n"
                      "  fi\ndone"))
    tpu_zone = config.zone_of("trainer")
    tpu_list = gcloud("compute", "tpus", "tpu-vm", "list", f"--zone={tpu_zone}", project_flag(config),
                      f"--filter={select}", "--format=value(name.basename())")
    tpu_delete = gcloud("compute", "tpus", "tpu-vm", "delete", Raw('"$name"'), f"--zone={tpu_zone}",
                        project_flag(config), "--quiet", Raw("</dev/null"))
    steps.append(Step("trainer", "a TPU trainer (it saves a checkpoint and releases its lease on SIGTERM)",
                      f'{tpu_list} | while read -r name; do\n  if [[ $name == "{config.name}-trainer" ]]; then\n'
                      f"    {tpu_delete}\n  fi\ndone"))
    steps.append(Step("trainer", "the TPU trainer's queued request (--force: with its TPU VM, if any is left), so "
                                 "it cannot bring a TPU back later",
                      f"if {_queued(config, 'describe')} >/dev/null 2>&1; then\n"
                      f"{indent(_queued(config, 'delete', '--force', '--quiet'))}\nfi"))
    if config.uses_dataflow:
        # The follower cancels its own job when it stops; this catches a job whose follower was killed
        # outright, or whose cancel failed.  pipeline is below operations: importing it here is allowed.
        from pipeline.dataflow_jobs import cancel_run_shell
        steps.append(Step("shuffle", "the run's Dataflow jobs still active (selected by their names, which carry "
                                     "the run), cancelled",
                          cancel_run_shell(config.root, config.project, config.dataflow_region)))
    if delete_account:
        for email in [config.service_account(role) for role in ROLES] + [builder_account(config)]:
            describe = gcloud("iam", "service-accounts", "describe", email, project_flag(config))
            delete = gcloud("iam", "service-accounts", "delete", email, project_flag(config), "--quiet")
            steps.append(Step("account", f"the service account {email.split('@')[0]}, if it is there",
                              f"if {describe} >/dev/null 2>&1; then\n{indent(delete)}\nfi"))
    return steps


def _find_group_step(config: DeployConfig) -> Step:
    """``$zerolake_group_region``: where the worker group is ('' when there is none), found by listing, so
    ``down`` needs no zone flag of the plan.  The listing's name filter is checked again by exact name."""
    group = worker_group(config)
    listing = gcloud("compute", "instance-groups", "managed", "list", project_flag(config), f"--filter=name={group}",
                     "--format=value(name,region.basename())")
    note = f"note: there is no regional worker group {group}"
    return Step("workers", f"the region of the worker group {group}, if there is one",
                "\n".join(["zerolake_group_region=", "while read -r name region; do",
                           f'  if [[ $name == "{group}" && -n $region ]]; then zerolake_group_region=$region; fi',
                           f"done < <({listing})",
                           f"[[ -n $zerolake_group_region ]] || echo {shlex.quote(note)} >&2"]))


def _group_in_found_region(config: DeployConfig, verb: str, *words) -> str:
    return gcloud("compute", "instance-groups", "managed", verb, worker_group(config),
                  Raw('--region="$zerolake_group_region"'), project_flag(config), *words)


# ---- rendering ----------------------------------------------------------------------------

def render(steps: list[Step], title: str) -> str:
    """The plan as one bash script: a header, then each section and step with its comment."""
    lines = ["#!/usr/bin/env bash", f"# {title}",
             "# Generated by `python -m operations.deploy`; run it as is, or with --apply.", "set -euo pipefail", "",
             RETRY_FUNCTION]
    if any(re.search(r"\bzerolake_missing\b", step.shell) for step in steps):    # not in a down plan
        lines.append(MISSING_HEADER)
    section = None
    for step in steps:
        if step.section != section:
            section = step.section
            lines += ["", f"# ==== {section} " + "=" * max(0, 60 - len(section))]
        lines += [f"# {step.comment}", step.shell]
    return "\n".join(lines) + "\n"

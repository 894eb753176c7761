"""From a DeployConfig to the exact shell plan: every gcloud command, in order.

``build_plan(config)`` returns `Step`s, one per thing the deployment needs
(a service account, a bucket, a VM...), grouped in the sections of
`cloud.deploy.config.SECTIONS`; ``render(steps)`` prints them as one bash
script that a person can read, paste or run (``--apply`` runs exactly this
text).  ``build_down_plan`` does the same for tearing a deployment down.

Every create is guarded by a describe (``if ! gcloud ... describe ...; then
gcloud ... create ...; fi``), so the plan can be run again: after a failure,
or with a larger ``--workers`` to add worker VMs (the existing ones are left
alone).  Every gcloud command and flag used here is documented by the
installed gcloud's ``--help``; tests/test_deploy.py checks each one against
it.  Flags that take a value are always written ``--flag=value``.

What the VMs are told travels in instance metadata (never a secret: the VMs
act through their attached service account, and no key is ever created)::

    startup-script          cloud/vm/startup.sh (the same file for every role)
    zerolake-role           worker | shuffle | trainer
    zerolake-root           gs://BUCKET/RUN
    zerolake-package        gs://BUCKET/zerolake-deploy/<name>/zerolake.tar.gz (the sdist)
    zerolake-accelerator    cpu | gpu | tpu  (which TensorFlow install.sh installs)
    zerolake-processes      worker processes on this VM (one systemd unit each)
    zerolake-args           extra flags of the role (no commas)
    zerolake-keeper         on, on the one VM that runs the worker keeper (DeployConfig.keeper_host),
                            with zerolake-deployment (NAME) and zerolake-project (P) for it

The worker keeper (cloud/vm/keep-workers.sh, run every 2 minutes by
zerolake-keeper.timer) starts worker VMs that a preemption stopped.  It acts
through the custom role `DeployConfig.keeper_role_id` (KEEPER_PERMISSIONS),
bound to the runner account on the project, plus serviceAccountUser on the
runner account itself.  ``down`` removes that binding first and keeps the role.
"""
from __future__ import annotations

import dataclasses
import pathlib
import shlex
import sys

from cloud.deploy.config import GPU_KINDS, DeployConfig

VM_DIR = pathlib.Path(__file__).resolve().parents[1] / "vm"
STARTUP_SCRIPT = VM_DIR / "startup.sh"
REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE_OBJECT = "zerolake.tar.gz"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
BUCKET_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")
"""objectAdmin: create, read, list and delete objects; legacyBucketReader adds
reading the bucket's own metadata, which Beam's gcsio asks for."""
DATAFLOW_PROJECT_ROLES = ("roles/dataflow.admin", "roles/dataflow.worker")
"""The follower launches jobs (admin) that run as this same account (worker)."""
SPOOL_DISK_NOTE = "spot VMs stop (not delete) on preemption, so a worker's spool on the boot disk survives"
KEEPER_PERMISSIONS = ("compute.instances.list", "compute.instances.get", "compute.instances.start",
                      "compute.zoneOperations.get")
"""The worker keeper's custom role: list the deployment's workers, read and
start them, and read the zone operation that `gcloud compute instances start`
waits on.  Starting a VM that runs as a service account also needs actAs on
that account: roles/iam.serviceAccountUser on the runner account, granted
below.  No create, delete or metadata permission: the keeper can only start
VMs that already exist.  (Granted on the project, so it covers every VM there;
the keeper itself only starts VMs named NAME-worker-N.)"""


class Raw(str):
    """A shell word written as is (a variable such as "$name"), never quoted."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing the plan does: its section, a one-line comment, and its shell text."""

    section: str
    comment: str
    shell: str


def command(*words) -> str:
    """One command line: words quoted for the shell (Raw words kept), long ones folded."""
    quoted = [w if isinstance(w, Raw) else shlex.quote(str(w)) for w in words]
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


def unless_exists(describe: str, create: str) -> str:
    """Run ``create`` only when ``describe`` fails (the resource is missing)."""
    indented = "\n".join("  " + line for line in create.splitlines())
    return f"if ! {describe} >/dev/null 2>&1; then\n{indented}\nfi"


def labels(config: DeployConfig, role: str) -> str:
    return f"--labels=zerolake-deployment={config.name},zerolake-role={role}"


def deployment_filter(config: DeployConfig) -> str:
    """The gcloud --filter term that selects this deployment's VMs by label.

    gcloud warns that ``=`` is becoming a word match for some APIs ("zerolake"
    would then match "zerolake-b"), so every loop over such a listing also
    checks each VM's exact name (`worker_name_pattern`) before acting on it.
    """
    return f"labels.zerolake-deployment={config.name}"


def worker_name_pattern(config: DeployConfig) -> str:
    """A bash ``=~`` pattern that matches exactly this deployment's worker VM names."""
    return f"^{config.name}-worker-[0-9]+$"


def metadata(config: DeployConfig, role: str, accelerator: str, args: str, processes: int = 1,
             extra: tuple[str, ...] = ()) -> str:
    entries = [f"zerolake-role={role}", f"zerolake-root={config.root}",
               f"zerolake-package={config.deploy_area}/{PACKAGE_OBJECT}", f"zerolake-accelerator={accelerator}",
               f"zerolake-processes={processes}", f"zerolake-args={args}", *extra]
    return "--metadata=" + ",".join(entries)


def project_flag(config: DeployConfig) -> str:
    return f"--project={config.project}"


# ---- sections ------------------------------------------------------------------------

def services_steps(config: DeployConfig) -> list[Step]:
    apis = ["compute.googleapis.com", "storage.googleapis.com", "iam.googleapis.com"]
    if config.trainer_kind == "tpu":
        apis.append("tpu.googleapis.com")
    if config.uses_dataflow:
        apis.append("dataflow.googleapis.com")
    return [Step("services", "the APIs this deployment uses", gcloud("services", "enable", *apis,
                                                                      project_flag(config)))]


def bucket_steps(config: DeployConfig) -> list[Step]:
    url = f"gs://{config.bucket}"
    create = gcloud("storage", "buckets", "create", url, project_flag(config), f"--location={config.region}",
                    "--uniform-bucket-level-access", "--public-access-prevention")
    return [Step("bucket", f"the lake's bucket, in {config.region} next to the VMs (kept by `down`)",
                 unless_exists(gcloud("storage", "buckets", "describe", url, project_flag(config)), create))]


def account_steps(config: DeployConfig) -> list[Step]:
    sa = config.service_account
    member = f"--member=serviceAccount:{sa}"
    steps = [Step("account", "the service account every VM (and Dataflow) runs as; no key is ever made",
                  unless_exists(gcloud("iam", "service-accounts", "describe", sa, project_flag(config)),
                                gcloud("iam", "service-accounts", "create", config.service_account_id,
                                       project_flag(config), f"--display-name=zerolake {config.name}")))]
    for role in BUCKET_ROLES:
        steps.append(Step("account", f"{role} on the bucket only",
                          gcloud("storage", "buckets", "add-iam-policy-binding", f"gs://{config.bucket}",
                                 member, f"--role={role}", project_flag(config))))
    if config.uses_dataflow:
        for role in DATAFLOW_PROJECT_ROLES:
            steps.append(Step("account", f"{role}: the shuffle follower's Dataflow jobs",
                              gcloud("projects", "add-iam-policy-binding", config.project, member,
                                     f"--role={role}", "--condition=None")))
    if config.keeper_host:
        steps += keeper_role_steps(config)
    users = [why for why, needed in (("the follower starts Dataflow workers", config.uses_dataflow),
                                     ("the worker keeper starts worker VMs", bool(config.keeper_host))) if needed]
    if users:
        steps.append(Step("account", f"{' and '.join(users)} that run as this account (actAs on itself only)",
                          gcloud("iam", "service-accounts", "add-iam-policy-binding", sa, member,
                                 "--role=roles/iam.serviceAccountUser", project_flag(config))))
    return steps


def keeper_role_name(config: DeployConfig) -> str:
    return f"projects/{config.project}/roles/{config.keeper_role_id}"


def keeper_role_steps(config: DeployConfig) -> list[Step]:
    """The keeper's custom role (created if missing) and its binding to the runner account.

    A binding that exists already is left as it is by add-iam-policy-binding,
    so both steps can be rerun.
    """
    role_id = config.keeper_role_id
    create = gcloud("iam", "roles", "create", role_id, project_flag(config),
                    f"--title=zerolake {config.name} worker keeper",
                    "--description=Start the stopped (preempted) worker VMs of zerolake deployment "
                    f"{config.name}", f"--permissions={','.join(KEEPER_PERMISSIONS)}", "--stage=GA")
    role = Step("account", f"the worker keeper's custom role: {', '.join(KEEPER_PERMISSIONS)} and nothing else",
                unless_exists(gcloud("iam", "roles", "describe", role_id, project_flag(config)), create))
    bind = Step("account", f"that role for this account, on the project (the keeper on the {config.keeper_host} "
                           "VM uses it)",
                gcloud("projects", "add-iam-policy-binding", config.project,
                       f"--member=serviceAccount:{config.service_account}", f"--role={keeper_role_name(config)}",
                       "--condition=None"))
    return [role, bind]


def package_steps(config: DeployConfig) -> list[Step]:
    """Build the sdist here and upload it: the VMs install it, Dataflow compiles it (setup.py)."""
    sdist = command(config.python or sys.executable, "setup.py", "-q", "sdist", "--dist-dir", Raw('"$zerolake_dist"'))
    build = f"zerolake_dist=$(mktemp -d)\n(cd {shlex.quote(str(REPO))} && {sdist})"
    upload = gcloud("storage", "cp", Raw('"$zerolake_dist"/zerolake-*.tar.gz'),
                    f"{config.deploy_area}/{PACKAGE_OBJECT}", project_flag(config))
    return [Step("package", "build the source package (Cython sources included) and upload it", build),
            Step("package", "the VMs' start-up script installs this file", upload)]


def _image_flags(image: str) -> list[str]:
    project, family = image.split("/")
    return [f"--image-project={project}", f"--image-family={family}"]


def keeper_metadata(config: DeployConfig, role: str) -> tuple[str, ...]:
    """The metadata that turns the worker keeper on, for the one VM that runs it."""
    if role != config.keeper_host:
        return ()
    return ("zerolake-keeper=on", f"zerolake-deployment={config.name}", f"zerolake-project={config.project}")


def _vm_create(config: DeployConfig, name: str, role: str, *, machine: str, gpu: str, gpu_count: int,
               spot: bool, disk_gb: int, args: str, processes: int = 1) -> str:
    accelerator = "gpu" if gpu else "cpu"
    extra = (("install-nvidia-driver=True",) if gpu else ()) + keeper_metadata(config, role)
    flags = [f"--zone={config.zone}", project_flag(config), f"--machine-type={machine}",
             *_image_flags(config.gpu_image if gpu else config.cpu_image),
             f"--boot-disk-size={disk_gb}GB", "--boot-disk-type=pd-balanced",
             f"--service-account={config.service_account}", f"--scopes={CLOUD_PLATFORM_SCOPE}",
             f"--metadata-from-file=startup-script={STARTUP_SCRIPT}",
             metadata(config, role, accelerator, args, processes, extra),
             labels(config, role)]
    if gpu and not GPU_KINDS[gpu].bundled:
        flags.append(f"--accelerator=type={gpu},count={gpu_count}")
    if gpu or spot:
        # GPUs cannot live-migrate; spot VMs cannot either.
        flags.append("--maintenance-policy=TERMINATE")
    if spot:
        flags += ["--provisioning-model=SPOT", "--instance-termination-action=STOP"]
    describe = gcloud("compute", "instances", "describe", name, f"--zone={config.zone}", project_flag(config))
    return unless_exists(describe, gcloud("compute", "instances", "create", name, *flags))


def worker_name(config: DeployConfig, index: int) -> str:
    return f"{config.name}-worker-{index:03d}"


NO_KEEPER_NOTE = ("no worker keeper: with --no-shuffle it runs only on a standard GPU or CPU trainer VM, so "
                  "nothing starts a stopped (preempted) worker VM again; start one with `gcloud compute instances "
                  "start NAME --zone=ZONE`, or rerun this plan with a follower or a --trainer-gpu/--trainer-cpu "
                  "VM without --trainer-spot")


def worker_steps(config: DeployConfig) -> list[Step]:
    what = (f"{config.worker_gpu_count} x {config.worker_gpu}" if config.worker_gpu else "CPU") + \
        f", {config.processes_per_worker} worker processes" + (f"; {SPOOL_DISK_NOTE}" if config.spot else "")
    steps = [Step("workers", f"self-play worker {i + 1} of {config.workers} ({what})",
                  _vm_create(config, worker_name(config, i), "worker", machine=config.worker_machine_type(),
                             gpu=config.worker_gpu, gpu_count=config.worker_gpu_count, spot=config.spot,
                             disk_gb=200 if config.worker_gpu else 50, args=config.worker_args,
                             processes=config.processes_per_worker))
             for i in range(config.workers)]
    if not config.keeper_host:
        # Said in the plan and, when it is applied, on stderr: the deployment will not keep its size.
        steps.append(Step("workers", NO_KEEPER_NOTE, command("echo", f"note: {NO_KEEPER_NOTE}", Raw(">&2"))))
    return steps


def dataflow_args(config: DeployConfig) -> str:
    """The Beam flags the follower passes to each window's job (pipeline.shuffle's unknown flags)."""
    return " ".join([
        "--runner=DataflowRunner", f"--project={config.project}", f"--region={config.region}",
        f"--temp_location={config.deploy_area}/dataflow-tmp",
        f"--staging_location={config.deploy_area}/dataflow-staging",
        # startup.sh unpacks the sdist there; Beam rebuilds it from setup.py for the workers.
        "--setup_file=/opt/zerolake/src/setup.py",
        f"--service_account_email={config.service_account}",
        f"--max_num_workers={config.dataflow_max_workers}", f"--machine_type={config.dataflow_machine}"])


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
    keeper = "; it also runs the worker keeper" if config.keeper_host == "shuffle" else ""
    return [Step("shuffle", f"the shuffle follower: builds each window {where}{keeper}",
                 _vm_create(config, f"{config.name}-shuffle", "shuffle", machine=config.shuffle_machine, gpu="",
                            gpu_count=0, spot=False, disk_gb=100, args=args))]


def trainer_steps(config: DeployConfig) -> list[Step]:
    name = f"{config.name}-trainer"
    if config.trainer_kind == "tpu":
        flags = [f"--zone={config.zone}", project_flag(config), f"--accelerator-type={config.trainer_tpu}",
                 f"--version={config.trainer_tpu_runtime}", f"--service-account={config.service_account}",
                 f"--scopes={CLOUD_PLATFORM_SCOPE}", f"--metadata-from-file=startup-script={STARTUP_SCRIPT}",
                 metadata(config, "trainer", "tpu", config.trainer_args), labels(config, "trainer")]
        if config.trainer_spot:
            flags.append("--spot")
        describe = gcloud("compute", "tpus", "tpu-vm", "describe", name, f"--zone={config.zone}",
                          project_flag(config))
        shell = unless_exists(describe, gcloud("compute", "tpus", "tpu-vm", "create", name, *flags))
        return [Step("trainer", f"the trainer on a Cloud TPU VM ({config.trainer_tpu}, tensorflow-tpu)", shell)]
    gpu = config.trainer_gpu
    what = f"{config.trainer_gpu_count} x {gpu}" + (", MirroredStrategy" if config.trainer_gpu_count > 1 else "") \
        if gpu else "CPU"
    keeper = "; it also runs the worker keeper (there is no follower)" if config.keeper_host == "trainer" else ""
    return [Step("trainer", f"the trainer on a {what} VM{keeper}",
                 _vm_create(config, name, "trainer", machine=config.trainer_machine_type(), gpu=gpu,
                            gpu_count=config.trainer_gpu_count, spot=config.trainer_spot,
                            disk_gb=200 if gpu else 100, args=config.trainer_args))]


def build_plan(config: DeployConfig) -> list[Step]:
    """Every step of bringing the deployment up, in order, restricted to ``--only``."""
    builders = {"services": services_steps, "bucket": bucket_steps, "account": account_steps,
                "package": package_steps, "workers": worker_steps,
                "shuffle": lambda c: shuffle_steps(c) if c.shuffle else [],
                "trainer": lambda c: trainer_steps(c) if c.trainer_kind else []}
    return [step for section in config.sections for step in builders[section](config)]


# ---- down -------------------------------------------------------------------------------

def build_down_plan(config: DeployConfig, *, keep_workers: int = 0, workers_only: bool = False,
                    delete_account: bool = False) -> list[Step]:
    """Delete the deployment's VMs (selected by label, then by exact name); keep the bucket and its lake.

    ``keep_workers``: leave workers 0..K-1 running (scale down to K).
    ``workers_only``: touch nothing but workers.  ``delete_account``: also
    delete the service account.  A whole ``down`` first removes the worker
    keeper's role binding (`keeper_unbind_step`).
    """
    select = deployment_filter(config)
    worker_filter = f"--filter={select} AND labels.zerolake-role=worker"
    listing = gcloud("compute", "instances", "list", project_flag(config), worker_filter,
                     "--format=value(name,zone.basename())")
    delete = gcloud("compute", "instances", "delete", Raw('"$name"'), Raw('--zone="$zone"'), project_flag(config),
                    "--quiet", Raw("</dev/null"))   # not the listing that feeds the loop
    is_worker = f"[[ $name =~ {worker_name_pattern(config)} ]]"
    steps = [] if workers_only else [keeper_unbind_step(config)]
    steps.append(Step("workers", f"worker VMs from index {keep_workers} up (their SIGTERM uploads the spool first)",
                      f"{listing} | while read -r name zone; do\n"
                      f"  if {is_worker} && (( 10#${{name##*-worker-}} >= {keep_workers} )); then\n"
                      f"    {delete}\n  fi\ndone"))
    if workers_only:
        return steps
    others = f"--filter={select} AND NOT labels.zerolake-role=worker"
    other_listing = gcloud("compute", "instances", "list", project_flag(config), others,
                           "--format=value(name,zone.basename())")
    is_other = f'[[ $name == "{config.name}-shuffle" || $name == "{config.name}-trainer" ]]'
    steps.append(Step("shuffle", "the shuffle follower and a GPU or CPU trainer",
                      f"{other_listing} | while read -r name zone; do\n  if {is_other}; then\n    {delete}\n"
                      "  fi\ndone"))
    tpu_list = gcloud("compute", "tpus", "tpu-vm", "list", f"--zone={config.zone}", project_flag(config),
                      f"--filter={select}", "--format=value(name.basename())")
    tpu_delete = gcloud("compute", "tpus", "tpu-vm", "delete", Raw('"$name"'), f"--zone={config.zone}",
                        project_flag(config), "--quiet", Raw("</dev/null"))
    steps.append(Step("trainer", "a TPU trainer (it saves a checkpoint and releases its lease on SIGTERM)",
                      f'{tpu_list} | while read -r name; do\n  if [[ $name == "{config.name}-trainer" ]]; then\n'
                      f"    {tpu_delete}\n  fi\ndone"))
    steps.append(Step("shuffle", "Dataflow jobs still running (a stopped follower's job ends by itself; "
                                 "cancel one with `gcloud dataflow jobs cancel`)",
                      gcloud("dataflow", "jobs", "list", f"--region={config.region}", project_flag(config),
                             "--status=active")))
    if delete_account:
        steps.append(Step("account", "the service account",
                          gcloud("iam", "service-accounts", "delete", config.service_account, project_flag(config),
                                 "--quiet")))
    return steps


def keeper_unbind_step(config: DeployConfig) -> Step:
    """Remove the worker keeper's project binding, if it is there (so ``down`` can be rerun).

    It goes first, so the keeper loses its permission before the workers are
    deleted (IAM takes effect within minutes; a worker deleted meanwhile is
    gone, not stopped, so the keeper would not start it anyway).  The custom
    role itself is kept: without a binding it grants nothing, and a deleted
    custom role's id cannot be created again for weeks, which would break the
    next ``plan`` of a deployment of this name.
    """
    member = f"serviceAccount:{config.service_account}"
    role = keeper_role_name(config)
    bound = gcloud("projects", "get-iam-policy", config.project, "--flatten=bindings[].members",
                   f"--filter=bindings.role={role} AND bindings.members={member}", "--format=value(bindings.role)")
    remove = gcloud("projects", "remove-iam-policy-binding", config.project, f"--member={member}",
                    f"--role={role}", "--condition=None", Raw(">/dev/null"))
    indented = "\n".join("  " + line for line in remove.splitlines())
    return Step("account", f"the worker keeper's role binding (the role {config.keeper_role_id} is kept: it grants "
                           "nothing unbound, and a deleted role's id stays taken for weeks)",
                f"if {bound} | grep -q .; then\n{indented}\nfi")


# ---- rendering ----------------------------------------------------------------------------

def render(steps: list[Step], title: str) -> str:
    """The plan as one bash script: a header, then each section and step with its comment."""
    lines = ["#!/usr/bin/env bash", f"# {title}",
             "# Generated by `python -m cloud.deploy`; run it as is, or with --apply.", "set -euo pipefail"]
    section = None
    for step in steps:
        if step.section != section:
            section = step.section
            lines += ["", f"# ==== {section} " + "=" * max(0, 60 - len(section))]
        lines += [f"# {step.comment}", step.shell]
    return "\n".join(lines) + "\n"

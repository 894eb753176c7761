"""The deployment's VMs: what a Compute Engine VM is (flags and metadata), the shuffle follower, and
the trainer (a GPU or CPU VM, or a TPU VM asked for through a queued resource).

What a VM is told travels in instance metadata (never a secret: the VMs act through their attached
service account, and no key is ever made)::

    startup-script          operations/vm/startup-image.sh (pulls the image, runs the role in it);
                            operations/vm/startup.sh on the TPU trainer (pip at boot)
    zerolake-image          REGION-docker.pkg.dev/PROJECT/NAME-images/zerolake-KIND@sha256:DIGEST
    zerolake-role           worker | shuffle | trainer
    zerolake-root           gs://BUCKET/RUN
    zerolake-package        gs://BUCKET/zerolake-deploy/<name>/releases/<sha256>.tar.gz (the release)
    zerolake-release-sha256 that sha256: startup.sh refuses a package whose sha256 differs
    zerolake-accelerator    cpu | gpu | tpu
    zerolake-processes      worker processes on this VM (one systemd unit each)
    zerolake-args           extra flags of the role (no commas)
    zerolake-tpu-generation on a TPU trainer: its row of operations/deploy/zones.py
    zerolake-health-port    on a worker: the port of the group's health check (selfplay/health.py)
    google-logging-enabled  true: Container-Optimized OS's logging agent ships the containers' output

A GPU/CPU trainer that cannot be created (capacity) is named and the plan goes on.  A TPU trainer is
queued (``gcloud compute tpus queued-resources create``) before the workers and waited for after them,
at most ``--trainer-wait-minutes``; a FAILED or expired request is deleted before a new one is queued.
"""

from __future__ import annotations

import shlex

from operations.deploy.config import GPU_KINDS, DeployConfig
from operations.deploy.images import (
    image_digest_step,
    image_name,
    vm_image,
    vm_image_digest_step,
)
from operations.deploy.steps import (
    CLOUD_PLATFORM_SCOPE,
    CREATE_TRIES,
    HEALTH_PORT,
    HEALTH_PORT_METADATA,
    IMAGE_DIGEST_VAR,
    IMAGE_METADATA,
    IMAGE_STARTUP_SCRIPT,
    POLL_SECONDS,
    STARTUP_SCRIPT,
    TPU_QUOTA_PAGE,
    Step,
    dataflow_network_args,
    gcloud,
    indent,
    labels,
    metadata,
    project_flag,
    retried,
    tpu_network_flags,
    unless_exists,
    vm_network_flags,
    worker_tag,
)


def _image_flags(image: str) -> list[str]:
    project, family = image.split("/")
    return [f"--image-project={project}", f"--image-family={family}"]


def listed_or_exit(listing: str, wanted: str, missing: str, unlisted: str) -> str:
    """Shell: run ``listing``; exit 2 with ``missing`` when its lines lack ``wanted``, or say ``unlisted`` and go
    on when the listing itself fails (no permission, API not enabled yet)."""
    return (
        f"if zerolake_found=$({listing}); then\n"
        f'  if ! grep -qx -- {shlex.quote(wanted)} <<< "$zerolake_found"; then\n'
        f"    echo {shlex.quote(missing)} >&2\n"
        "    exit 2\n  fi\n"
        f"else\n  echo {shlex.quote(unlisted)} >&2\n"
        "fi"
    )


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
        listing = gcloud(
            "compute",
            "tpus",
            "accelerator-types",
            "list",
            f"--zone={zone}",
            project_flag(config),
            f"--filter=type={accelerator}",
            "--format=value(type)",
        )
        source = f"gcloud compute tpus accelerator-types list --zone={zone}"
    else:
        listing = gcloud(
            "compute",
            "accelerator-types",
            "list",
            project_flag(config),
            f"--filter=zone:{zone} AND name={accelerator}",
            "--format=value(name)",
        )
        source = f"gcloud compute accelerator-types list --filter=zone:{zone}"
    flag = "--worker-zones" if role == "worker" and config.worker_zones else f"--{role}-zone"
    missing = (
        f"error: zone {zone} offers no {accelerator} today ({source}); choose another {flag}: "
        "docs/deploy.md lists the zones of each type"
    )
    unlisted = f"warning: could not list the accelerators of {zone} (see above); creating the {role} anyway"
    shell = listed_or_exit(listing, accelerator, missing, unlisted)
    return Step(section_of(role), f"{zone} offers {accelerator} today (asked live)", shell)


def tpu_runtime_check(config: DeployConfig) -> Step:
    """Ask gcloud, live, whether the trainer's zone offers the software version the TPU VM will boot.

    A version the zone lacks would fail the queued request only when capacity comes, hours later; a
    listing that fails is reported and the request goes ahead, as in `accelerator_check`.
    """
    zone, runtime = config.zone_of("trainer"), config.tpu_runtime
    listing = gcloud(
        "compute",
        "tpus",
        "tpu-vm",
        "versions",
        "list",
        f"--zone={zone}",
        project_flag(config),
        f"--filter=version={runtime}",
        "--format=value(version)",
    )
    missing = (
        f"error: zone {zone} offers no TPU software version {runtime} today (gcloud compute tpus tpu-vm "
        f"versions list --zone={zone}); choose another --trainer-zone, or --trainer-tpu-runtime"
    )
    unlisted = f"warning: could not list the TPU software versions of {zone} (see above); queueing the trainer anyway"
    shell = listed_or_exit(listing, runtime, missing, unlisted)
    return Step("trainer", f"{zone} offers the TPU software version {runtime} today (asked live)", shell)


def section_of(role: str) -> str:
    return {"worker": "workers"}.get(role, role)


def vm_flags(
    config: DeployConfig,
    role: str,
    *,
    machine: str,
    gpu: str,
    gpu_count: int,
    spot: bool,
    disk_gb: int,
    args: str,
    processes: int = 1,
) -> list:
    """What a VM of ``role`` is: the words an instance and an instance template share (no name, no zone)."""
    accelerator = "gpu" if gpu else "cpu"
    extra = (
        "enable-guest-attributes=TRUE",
        # Container-Optimized OS's logging agent: the containers' lines to Cloud Logging (docs/deploy.md, 5).
        "google-logging-enabled=true",
        f"{IMAGE_METADATA}={vm_image(config, accelerator)}",
    ) + ((f"{HEALTH_PORT_METADATA}={HEALTH_PORT}",) if role == "worker" else ())
    flags = [
        project_flag(config),
        f"--machine-type={machine}",
        *_image_flags(config.gpu_image if gpu else config.cpu_image),
        f"--boot-disk-size={disk_gb}GB",
        "--boot-disk-type=pd-balanced",
        *vm_network_flags(config),
        f"--service-account={config.service_account(role)}",
        f"--scopes={CLOUD_PLATFORM_SCOPE}",
        f"--metadata-from-file=startup-script={IMAGE_STARTUP_SCRIPT}",
        metadata(config, role, accelerator, args, processes, extra),
        labels(config, role),
    ]
    if role == "worker":  # the firewall rule that admits the group's health probes targets this tag
        flags.append(f"--tags={worker_tag(config)}")
    if gpu and not GPU_KINDS[gpu].bundled:
        flags.append(f"--accelerator=type={gpu},count={gpu_count}")
    if gpu or spot:
        # GPUs cannot live-migrate; spot VMs cannot either.
        flags.append("--maintenance-policy=TERMINATE")
    if spot:
        flags += ["--provisioning-model=SPOT", "--instance-termination-action=STOP"]
    return flags


def vm_create(config: DeployConfig, name: str, role: str, **vm) -> list:
    """The words of one Compute Engine VM's create command, after ``gcloud``."""
    return ["compute", "instances", "create", name, f"--zone={config.zone_of(role)}", *vm_flags(config, role, **vm)]


def vm_describe(config: DeployConfig, name: str, role: str) -> str:
    return gcloud("compute", "instances", "describe", name, f"--zone={config.zone_of(role)}", project_flag(config))


def dataflow_args(config: DeployConfig) -> str:
    """The Beam flags the follower passes to each window's job (pipeline.shuffle's unknown flags)."""
    return " ".join(
        [
            "--runner=DataflowRunner",
            f"--project={config.project}",
            f"--region={config.dataflow_region}",
            f"--temp_location={config.deploy_area}/dataflow-tmp",
            f"--staging_location={config.deploy_area}/dataflow-staging",
            # The image section's build: Beam's SDK image with zerolake installed; workers install nothing at boot.
            f"--sdk_container_image={image_name(config)}@{IMAGE_DIGEST_VAR}",
            f"--service_account_email={config.service_account('shuffle')}",
            f"--max_num_workers={config.dataflow_max_workers}",
            f"--machine_type={config.dataflow_machine}",
            *dataflow_network_args(config),
        ]
    )


def shuffle_runner_args(config: DeployConfig) -> str:
    """The follower's flags that choose where each window is built (pipeline.follow)."""
    if not config.uses_dataflow:
        return ""
    if config.shuffle_runner == "auto":
        return f"--dataflow-above-positions={config.dataflow_above_positions} {dataflow_args(config)}"
    return dataflow_args(config)


def shuffle_steps(config: DeployConfig) -> list[Step]:
    args = " ".join(a for a in (config.shuffle_args, shuffle_runner_args(config)) if a)
    where = {
        "local": "on this VM (Beam's in-process runner)",
        "dataflow": "on Dataflow",
        "auto": f"on this VM up to {config.dataflow_above_positions:,} positions, larger ones on Dataflow",
    }[config.shuffle_runner]
    name = f"{config.name}-shuffle"
    create = retried(
        CREATE_TRIES,
        *vm_create(
            config,
            name,
            "shuffle",
            machine=config.shuffle_machine,
            gpu="",
            gpu_count=0,
            spot=False,
            disk_gb=100,
            args=args,
        ),
    )
    digest = [image_digest_step(config)] if config.uses_dataflow else []
    digest.append(vm_image_digest_step(config, "cpu", "shuffle"))
    return digest + [
        Step(
            "shuffle",
            f"the shuffle follower: builds each window {where}",
            unless_exists(vm_describe(config, name, "shuffle"), create),
        )
    ]


def trainer_steps(config: DeployConfig) -> list[Step]:
    name = f"{config.name}-trainer"
    zone = config.zone_of("trainer")
    if config.trainer_kind == "tpu":
        return [
            accelerator_check(config, "trainer", "tpu", config.trainer_tpu),
            tpu_runtime_check(config),
            tpu_queue_step(config),
        ]
    gpu = config.trainer_gpu
    what = (
        f"{config.trainer_gpu_count} x {gpu}" + (", MirroredStrategy" if config.trainer_gpu_count > 1 else "")
        if gpu
        else "CPU"
    )
    create = retried(
        CREATE_TRIES,
        *vm_create(
            config,
            name,
            "trainer",
            machine=config.trainer_machine_type(),
            gpu=gpu,
            gpu_count=config.trainer_gpu_count,
            spot=False,
            disk_gb=200 if gpu else 100,
            args=config.trainer_args,
        ),
    )
    note = (
        f"note: the trainer VM {name} could not be created in {zone} (see the gcloud messages above; often "
        "no capacity there right now); the other roles go on, and a rerun of this plan adds it"
    )
    # Not fatal: without a trainer the workers still play (generation 0 or the last model) and the follower
    # still builds windows, and a rerun creates the trainer, which resumes from ROOT/checkpoints.
    shell = (
        f"if ! {vm_describe(config, name, 'trainer')} >/dev/null 2>&1 \\\n    && ! {create}; then\n"
        f'  echo {shlex.quote(note)} >&2\n  zerolake_missing+=" {name}"\nfi'
    )
    steps = [accelerator_check(config, "trainer", "gpu", gpu)] if gpu else []
    steps.append(vm_image_digest_step(config, config.trainer_kind, "trainer"))
    return steps + [Step("trainer", f"the trainer on a {what} VM", shell)]


def queued_command(config: DeployConfig, verb: str, *words) -> str:
    """``gcloud compute tpus queued-resources VERB NAME-trainer --zone --project ...`` as words."""
    return gcloud(
        "compute",
        "tpus",
        "queued-resources",
        verb,
        f"{config.name}-trainer",
        f"--zone={config.zone_of('trainer')}",
        project_flag(config),
        *words,
    )


def quota_line(config: DeployConfig) -> str:
    return (
        f"error: the project has no TPU quota left for {config.trainer_tpu} in {config.zone_of('trainer')} "
        f"(zero, or used up): ask for it under IAM & Admin > Quotas ({TPU_QUOTA_PAGE}); "
        "the other roles go on without a trainer"
    )


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
    create = queued_command(
        config,
        "create",
        f"--node-id={name}",
        f"--accelerator-type={config.trainer_tpu}",
        f"--runtime-version={config.tpu_runtime}",
        f"--valid-until-duration={config.trainer_tpu_valid_for}",
        f"--service-account={config.service_account('trainer')}",
        f"--scopes={CLOUD_PLATFORM_SCOPE}",
        f"--metadata-from-file=startup-script={STARTUP_SCRIPT}",
        metadata(
            config, "trainer", "tpu", config.trainer_args, extra=(f"zerolake-tpu-generation={config.tpu_generation}",)
        ),
        labels(config, "trainer"),
        *tpu_network_flags(config),
    )
    state = queued_command(config, "describe", "--format=value(state.state)")
    node = gcloud("compute", "tpus", "tpu-vm", "describe", name, f"--zone={zone}", project_flag(config))
    delete = queued_command(config, "delete", "--force", "--quiet")
    shell = "\n".join(
        [
            f"zerolake_tpu_state=$({state} 2>/dev/null || true)",
            "if [[ $zerolake_tpu_state == FAILED || $zerolake_tpu_state == SUSPENDED ]]; then",
            "  echo \"note: the trainer's earlier TPU request is $zerolake_tpu_state (failed, or expired after "
            '--trainer-tpu-valid-for); deleting it to queue a new one" >&2',
            indent(delete),
            '  zerolake_tpu_state=""',
            "fi",
            f"if [[ -z $zerolake_tpu_state ]] && {node} >/dev/null 2>&1; then",
            "  zerolake_tpu_state=NODE        # a TPU VM made without a request: nothing to queue or wait for",
            "elif [[ -z $zerolake_tpu_state ]]; then",
            f"  if zerolake_out=$({create.replace(chr(10), chr(10) + '    ')} 2>&1); then",
            "    zerolake_tpu_state=QUEUED",
            "  else",
            '    if grep -qi quota <<< "$zerolake_out"; then',
            f"      echo {shlex.quote(quota_line(config))} >&2",
            "    else",
            "      printf '%s\\n' \"$zerolake_out\" >&2",
            "    fi",
            f'    zerolake_tpu_state=NONE; zerolake_missing+=" {name}"',
            "  fi",
            "fi",
        ]
    )
    return Step(
        "trainer",
        f"queue the trainer's Cloud TPU VM ({config.trainer_tpu}, runtime {config.tpu_runtime}, "
        f"waiting for capacity up to {config.trainer_tpu_valid_for}; install.sh adds the pinned "
        "tensorflow-tpu, run-role.sh its PJRT environment)",
        shell,
    )


def tpu_wait_step(config: DeployConfig) -> Step:
    """After the workers: poll the queued request until ACTIVE or FAILED, or ``--trainer-wait-minutes``."""
    name = f"{config.name}-trainer"
    state = queued_command(config, "describe", "--format=value(state.state)")
    reason = queued_command(config, "describe", "--format=value(state.failedData.error.message)")
    minutes = config.trainer_wait_minutes
    still = (
        f"note: the trainer's TPU request is still $zerolake_tpu_state after {minutes} minutes; it stays "
        f"queued until --trainer-tpu-valid-for ({config.trainer_tpu_valid_for}) and the TPU VM starts "
        "training when capacity comes (see it with: gcloud compute tpus queued-resources list "
        f"--zone={config.zone_of('trainer')})"
    )
    failed = (
        "error: the trainer's TPU request is $zerolake_tpu_state: ${zerolake_reason:-no reason given}; "
        "a rerun of this plan deletes it and queues a new one"
    )
    waiting = " || ".join(
        f"$zerolake_tpu_state == {s}"
        for s in ("QUEUED", "CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")
    )
    shell = "\n".join(
        [
            f"if [[ {waiting} ]]; then",
            f"  zerolake_deadline=$((SECONDS + {minutes * 60}))",
            "  while :; do",
            f"    zerolake_tpu_state=$({state} 2>/dev/null || echo UNKNOWN)",
            '    case "$zerolake_tpu_state" in',
            "      ACTIVE)",
            '        echo "the trainer\'s TPU is ACTIVE: its start-up script installs and starts the trainer" >&2',
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
            "fi",
        ]
    )
    return Step(
        "trainer",
        f"wait for the trainer's TPU (ACTIVE or FAILED, at most {minutes} minutes; the workers were created meanwhile)",
        shell,
    )

"""The worker group: a regional managed instance group (``NAME-workers``, target size ``--workers``) made
from an instance template (``NAME-worker-<settings>-<release>``).

Compute Engine creates the group's VMs where it can, recreates a preempted one, and rolls a new
template out (``rolling-action start-update``, which ``update`` uses after the trainer and the
follower).  A recreated VM gets a new boot disk, so each worker's spool lives on a second disk,
``zerolake-spool``, which the group's stateful policy keeps across recreation (startup.sh mounts it).
The group autoheals: a health check (``NAME-worker-health``) asks each VM's worker process 0 whether it
plays (selfplay/health.py, port `HEALTH_PORT`), and a VM that stays unhealthy past `HEALTH_INITIAL_DELAY`
(no Docker, no GPU, a worker that never plays) is recreated; a firewall rule admits Google's probes.
"""

from __future__ import annotations

from operations.deploy.config import DeployConfig
from operations.deploy.images import vm_image_digest_step
from operations.deploy.steps import (
    HEALTH_CHECK_SOURCES,
    HEALTH_PORT,
    IMAGE_STARTUP_SCRIPT,
    SPOOL_AUTO_DELETE,
    SPOOL_DEVICE,
    SPOOL_DISK_GB,
    Raw,
    Step,
    gcloud,
    indent,
    project_flag,
    unless_exists,
    worker_tag,
)
from operations.deploy.vms import accelerator_check, vm_flags
from selfplay.health import PATH as HEALTH_PATH

HEALTH_INITIAL_DELAY = 1200
"""Seconds a new worker VM has before its health counts: boot, the NVIDIA driver's install on a GPU VM
(minutes), the image's pull and TensorFlow's start; the worker then answers 200 for its first 10 minutes."""
HEALTH_INTERVAL, HEALTH_UNHEALTHY = 60, 10
"""A probe a minute; 10 failures in a row (10 minutes) make a VM unhealthy: a worker container that
Docker restarts, or a slow model download, is not recreated for it."""


def worker_group_name(name: str) -> str:
    """The regional managed instance group of deployment ``name``'s workers; its VMs are ``NAME-worker-xxxx``."""
    return f"{name}-workers"


def worker_group(config: DeployConfig) -> str:
    return worker_group_name(config.name)


def _worker_vm(config: DeployConfig) -> dict:
    return dict(
        machine=config.worker_machine_type(),
        gpu=config.worker_gpu,
        gpu_count=config.worker_gpu_count,
        spot=config.spot,
        disk_gb=200 if config.worker_gpu else 50,
        args=config.worker_args,
        processes=config.processes_per_worker,
    )


def _template_flags(config: DeployConfig) -> list:
    """The worker template's flags: a worker VM's, its spool disk, and the region of a named subnet."""
    flags = vm_flags(config, "worker", **_worker_vm(config))
    flags.append(f"--create-disk=device-name={SPOOL_DEVICE},size={SPOOL_DISK_GB}GB,type=pd-balanced")
    if config.subnet:  # a global template names its subnet's region (instance-templates create --help)
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


def group_command(config: DeployConfig, verb: str, *words) -> str:
    """``gcloud compute instance-groups managed VERB NAME-workers --region --project WORDS...`` (VERB may be two
    words: ``rolling-action start-update``)."""
    return gcloud(
        "compute",
        "instance-groups",
        "managed",
        *verb.split(),
        worker_group(config),
        f"--region={config.worker_region}",
        project_flag(config),
        *words,
    )


def template_step(config: DeployConfig) -> Step:
    """``$zerolake_template``: the workers' instance template of this release and these settings, made if
    missing (a spot VM with the release in its metadata, and the spool disk)."""
    create = gcloud("compute", "instance-templates", "create", Raw('"$zerolake_template"'), *_template_flags(config))
    describe = gcloud("compute", "instance-templates", "describe", Raw('"$zerolake_template"'), project_flag(config))
    what = (
        (f"{config.worker_gpu_count} x {config.worker_gpu}" if config.worker_gpu else "CPU")
        + f", {config.processes_per_worker} worker processes"
        + (", spot" if config.spot else "")
    )
    return Step(
        "workers",
        f"the workers' instance template ({what}; the release in its metadata, the spool on the disk {SPOOL_DEVICE})",
        f"zerolake_template={worker_template(config)}\n{unless_exists(describe, create)}",
    )


def rolling_update(config: DeployConfig) -> str:
    """Move the group's VMs to ``$zerolake_template``: each is recreated under its name (the stateful spool
    disk needs ``recreate``; no surge), all of them at once, as a stop of every worker did before."""
    unavailable = max(config.workers, len(config.worker_group_zones))  # a regional group: 0 or >= its zones
    return group_command(
        config,
        "rolling-action start-update",
        Raw('--version=template="$zerolake_template"'),
        "--type=proactive",
        "--replacement-method=recreate",
        "--max-surge=0",
        f"--max-unavailable={unavailable}",
    )


def health_check_name(config: DeployConfig) -> str:
    return f"{config.name}-worker-health"


def health_steps(config: DeployConfig) -> list[Step]:
    """The group's health check, and the firewall rule that lets Google's probes reach the workers' port."""
    check = health_check_name(config)
    create_check = gcloud(
        "compute",
        "health-checks",
        "create",
        "http",
        check,
        "--global",
        project_flag(config),
        f"--port={HEALTH_PORT}",
        f"--request-path={HEALTH_PATH}",
        f"--check-interval={HEALTH_INTERVAL}s",
        "--timeout=10s",
        "--healthy-threshold=1",
        f"--unhealthy-threshold={HEALTH_UNHEALTHY}",
    )
    describe_check = gcloud("compute", "health-checks", "describe", check, "--global", project_flag(config))
    rule = f"{config.name}-allow-worker-health"
    create_rule = gcloud(
        "compute",
        "firewall-rules",
        "create",
        rule,
        project_flag(config),
        *([f"--network={config.network}"] if config.network else []),  # gcloud's default: 'default'
        f"--allow=tcp:{HEALTH_PORT}",
        f"--source-ranges={HEALTH_CHECK_SOURCES}",
        f"--target-tags={worker_tag(config)}",
    )
    describe_rule = gcloud("compute", "firewall-rules", "describe", rule, project_flag(config))
    return [
        Step(
            "workers",
            f"the workers' health check {check} (GET {HEALTH_PATH} on port {HEALTH_PORT}, a probe a minute, "
            f"unhealthy after {HEALTH_UNHEALTHY} failures) and the firewall rule {rule} for Google's probes",
            unless_exists(describe_check, create_check) + "\n" + unless_exists(describe_rule, create_rule),
        )
    ]


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
        steps += [
            accelerator_check(config, "worker", "gpu", config.worker_gpu, zone) for zone in config.worker_group_zones
        ]
    steps += [vm_image_digest_step(config, config.worker_kind, "workers"), template_step(config)]
    steps += health_steps(config)
    autohealing = [f"--health-check={health_check_name(config)}", f"--initial-delay={HEALTH_INITIAL_DELAY}"]
    create = group_command(
        config,
        "create",
        f"--zones={','.join(config.worker_group_zones)}",
        Raw('--template="$zerolake_template"'),
        f"--size={config.workers}",
        f"--base-instance-name={config.name}-worker",
        "--target-distribution-shape=any",
        "--instance-redistribution-type=none",
        f"--stateful-disk=device-name={SPOOL_DEVICE},auto-delete={SPOOL_AUTO_DELETE}",
        *autohealing,
    )
    existing = "\n".join(
        [
            group_command(config, "resize", f"--size={config.workers}"),
            group_command(config, "update", *autohealing),
            rolling_update(config),
        ]
    )
    shell = (
        f"if {group_command(config, 'describe')} >/dev/null 2>&1; then\n{indent(existing)}\nelse\n{indent(create)}\nfi"
    )
    zones = ", ".join(config.worker_group_zones)
    steps.append(
        Step(
            "workers",
            f"the worker group {worker_group(config)}: {config.workers} VMs in {zones} "
            "(a preempted or unhealthy one is recreated, its spool disk kept); a group that exists is "
            "resized to that and moved to this template",
            shell,
        )
    )
    return steps

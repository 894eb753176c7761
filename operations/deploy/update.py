"""The plan that moves a running deployment to a new release (``python -m operations.deploy update``).

In order: the release (uploaded and recorded), its images (by digest), the trainer and the follower
(their metadata, then both stopped and started, so they change release together; a TPU trainer instead
reruns its start-up script while the follower is stopped), then the workers (a new instance template
and a rolling update of the group to it).
"""

from __future__ import annotations

import shlex

from operations.deploy.config import DeployConfig
from operations.deploy.images import (
    image_digest_step,
    image_steps,
    vm_image,
    vm_image_digest_step,
)
from operations.deploy.sections import release_steps
from operations.deploy.steps import (
    IMAGE_METADATA,
    IMAGE_STARTUP_SCRIPT,
    Expand,
    Step,
    gcloud,
    indent,
    project_flag,
    release_metadata,
)
from operations.deploy.vms import shuffle_runner_args, vm_describe
from operations.deploy.workers import (
    group_command,
    rolling_update,
    template_step,
    worker_group,
)


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
    steps += [
        vm_image_digest_step(config, "cpu" if role == "shuffle" else config.trainer_kind, "rollout")
        for role, planned in roles.items()
        if planned
    ]
    if config.workers:
        steps.append(vm_image_digest_step(config, config.worker_kind, "workers"))
    steps += core_rollout_steps(config)
    if config.workers:
        steps += worker_rollout_steps(config)
    if config.trainer_kind == "tpu":
        failed = f"the trainer's TPU VM {config.name}-trainer kept its old release (its error is above): rerun update"
        steps.append(
            Step(
                "rollout",
                "a trainer restart that failed ends the plan with exit 2, after the rest moved on",
                f"if (( zerolake_trainer_failed )); then\n  echo {shlex.quote('error: ' + failed)} >&2\n  exit 2\nfi",
            )
        )
    return steps


def _refresh_metadata(config: DeployConfig, role: str, name: str) -> list[str]:
    """The words of setting one Compute Engine VM's release (and the start-up script that checks it)."""
    kind = "cpu" if role == "shuffle" else config.trainer_kind
    entries = [*release_metadata(config), f"{IMAGE_METADATA}={vm_image(config, kind)}"]
    if role == "shuffle":  # its jobs' image digest travels in its flags
        args = " ".join(a for a in (config.shuffle_args, shuffle_runner_args(config)) if a)
        entries.append(f"zerolake-args={args}")
    return [
        "compute",
        "instances",
        "add-metadata",
        name,
        f"--zone={config.zone_of(role)}",
        project_flag(config),
        Expand("--metadata=" + ",".join(entries)),
        f"--metadata-from-file=startup-script={IMAGE_STARTUP_SCRIPT}",
    ]


WHO = {"shuffle": "follower", "trainer": "trainer"}


RERUN_STARTUP = "sudo google_metadata_script_runner startup"
"""Runs a VM's start-up script again (https://cloud.google.com/compute/docs/instances/startup-scripts/linux,
"Rerunning a startup script"): on the TPU trainer it installs the release its metadata names and restarts
the trainer's unit (systemd's SIGTERM, TimeoutStopSec 120: a checkpoint)."""


def core_rollout_steps(config: DeployConfig) -> list[Step]:
    """The follower and the trainer: the new release in their metadata, then both stopped, then both started.

    A TPU trainer made through a queued request is not stopped and started (its VM is the request's, and
    a failed stop under ``set -e`` left the follower stopped and the workers not rolled): its start-up
    script runs again over ssh, between the follower's stop and start.  If that fails, the follower is
    started all the same and the plan exits 2 naming the trainer, so the run goes on and a rerun of
    update retries it."""
    present, stops, restarts, starts = [], [], [], []
    for role in ("shuffle", "trainer"):
        if (role == "shuffle" and not config.shuffle) or (role == "trainer" and not config.trainer_kind):
            continue
        name = f"{config.name}-{role}"
        zone = config.zone_of(role)
        if role == "trainer" and config.trainer_kind == "tpu":
            # A TPU VM's metadata is updated in place; its start-up script stays the one it was created with.
            describe = gcloud("compute", "tpus", "tpu-vm", "describe", name, f"--zone={zone}", project_flag(config))
            refresh = gcloud(
                "compute",
                "tpus",
                "tpu-vm",
                "update",
                name,
                f"--zone={zone}",
                project_flag(config),
                Expand("--update-metadata=" + ",".join(release_metadata(config))),
            )
            stop = start = ""
            rerun = gcloud(
                "compute",
                "tpus",
                "tpu-vm",
                "ssh",
                name,
                f"--zone={zone}",
                project_flag(config),
                "--worker=all",
                f"--command={RERUN_STARTUP}",
            )
        else:
            describe = vm_describe(config, name, role)
            refresh = gcloud(*_refresh_metadata(config, role, name))
            stop = gcloud("compute", "instances", "stop", name, f"--zone={zone}", project_flag(config))
            start = gcloud("compute", "instances", "start", name, f"--zone={zone}", project_flag(config))
        flag = f"zerolake_has_{role}"
        note = f"note: there is no {name} to update; a rerun of plan creates it with this release"
        present.append(
            Step(
                "rollout",
                f"the {WHO[role]}'s metadata names the new release",
                f"{flag}=0\nif {describe} >/dev/null 2>&1; then\n  {flag}=1\n{indent(refresh)}\n"
                f"else\n  echo {shlex.quote(note)} >&2\nfi",
            )
        )
        if not stop:  # the TPU trainer: restarted in place (docstring)
            failed = (
                f"the trainer's TPU VM {name} did not rerun its start-up script (above); it goes on with its "
                "old release, the follower and the workers move on: rerun update to retry it"
            )
            restarts.append(
                Step(
                    "rollout",
                    "the trainer's TPU VM runs its start-up script again: it installs the release and restarts "
                    "the trainer (a clean stop: it checkpoints)",
                    f"if (( {flag} )) && ! {rerun}; then\n  echo {shlex.quote('error: ' + failed)} >&2\n"
                    "  zerolake_trainer_failed=1\nfi",
                )
            )
            continue
        stops.append(
            Step(
                "rollout",
                f"stop the {WHO[role]} (SIGTERM to its role: a clean stop)",
                f"if (( {flag} )); then\n{indent(stop)}\nfi",
            )
        )
        starts.append(
            Step(
                "rollout",
                f"start the {WHO[role]}: its start-up script pulls the release's image by digest and runs the "
                "role in it",
                f"if (( {flag} )); then\n{indent(start)}\nfi",
            )
        )
    if restarts:
        restarts.insert(0, Step("rollout", "no trainer restart has failed yet", "zerolake_trainer_failed=0"))
    return present + stops + restarts + starts


def worker_rollout_steps(config: DeployConfig) -> list[Step]:
    """After the trainer and the follower: the release's worker template, then the group rolled onto it.

    The group recreates each VM from the new template (a new boot disk with the
    new release; its stateful spool disk reattached): a worker's SIGTERM at the
    recreation uploads its spool, and what it could not upload waits on the
    disk for the new VM.  A recreation that cannot get spot capacity now is
    retried by the group, not by this plan.
    """
    note = (
        f"note: there is no worker group {worker_group(config)} in {config.worker_region} to update; a rerun of "
        "plan creates it with this release"
    )
    shell = (
        f"if {group_command(config, 'describe')} >/dev/null 2>&1; then\n{indent(rolling_update(config))}\n"
        f"else\n  echo {shlex.quote(note)} >&2\nfi"
    )
    return [
        template_step(config),
        Step("workers", "then the workers: the group recreates each VM from the new template", shell),
    ]

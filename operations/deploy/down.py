"""The plan that takes a deployment down (``python -m operations.deploy down``): its VMs, selected by
label and then by exact name, go; the bucket and its lake stay.  ``--workers-only --keep-workers K``
scales the worker group down instead.
"""

from __future__ import annotations

import shlex

from operations.deploy.config import ROLES, DeployConfig
from operations.deploy.images import builder_account
from operations.deploy.steps import (
    Raw,
    Step,
    deployment_filter,
    gcloud,
    indent,
    project_flag,
)
from operations.deploy.vms import queued_command
from operations.deploy.workers import worker_group, worker_template_prefix


def build_down_plan(
    config: DeployConfig, *, keep_workers: int = 0, workers_only: bool = False, delete_account: bool = False
) -> list[Step]:
    """Delete the deployment's VMs (selected by label, then by exact name); keep the bucket and its lake.

    ``workers_only``: only resize the worker group to ``keep_workers`` VMs (a
    scale-down; the group chooses which go, and each one's SIGTERM uploads its
    spool).  Otherwise the worker group and its templates go, the follower and
    the trainer, the run's Dataflow jobs, and with ``delete_account`` the
    service accounts.
    """
    if workers_only:
        resize = _group_in_found_region(config, "resize", f"--size={keep_workers}")
        return [
            _find_group_step(config),
            Step(
                "workers",
                f"scale the worker group down to {keep_workers} VMs (each one deleted uploads its spool on "
                "SIGTERM first)",
                f"if [[ -n $zerolake_group_region ]]; then\n{indent(resize)}\nfi",
            ),
        ]
    select = deployment_filter(config)
    delete_group = _group_in_found_region(config, "delete", "--quiet")
    steps = [
        _find_group_step(config),
        Step(
            "workers",
            "the worker group and its VMs (each one's SIGTERM uploads its spool first; their spool disks go with them)",
            f"if [[ -n $zerolake_group_region ]]; then\n{indent(delete_group)}\nfi",
        ),
    ]
    prefix = worker_template_prefix(config)
    templates = gcloud(
        "compute",
        "instance-templates",
        "list",
        project_flag(config),
        f"--filter=name ~ ^{prefix}",
        "--format=value(name)",
    )
    delete_template = gcloud(
        "compute", "instance-templates", "delete", Raw('"$name"'), project_flag(config), "--quiet", Raw("</dev/null")
    )  # not the listing that feeds the loop
    steps.append(
        Step(
            "workers",
            "the workers' instance templates (this deployment's names only)",
            f"{templates} | while read -r name; do\n"
            f"  if [[ $name =~ ^{prefix}[0-9a-f]{{8}}-[0-9a-f]{{12}}$ ]]; then\n    {delete_template}\n"
            "  fi\ndone",
        )
    )
    listing = gcloud(
        "compute",
        "instances",
        "list",
        project_flag(config),
        f"--filter={select} AND NOT labels.zerolake-role=worker",
        "--format=value(name,zone.basename())",
    )
    delete = gcloud(
        "compute",
        "instances",
        "delete",
        Raw('"$name"'),
        Raw('--zone="$zone"'),
        project_flag(config),
        "--quiet",
        Raw("</dev/null"),
    )
    is_other = f'[[ $name == "{config.name}-shuffle" || $name == "{config.name}-trainer" ]]'
    steps.append(
        Step(
            "shuffle",
            "the shuffle follower and a GPU or CPU trainer",
            f"{listing} | while read -r name zone; do\n  if {is_other}; then\n    {delete}\n  fi\ndone",
        )
    )
    tpu_zone = config.zone_of("trainer")
    tpu_list = gcloud(
        "compute",
        "tpus",
        "tpu-vm",
        "list",
        f"--zone={tpu_zone}",
        project_flag(config),
        f"--filter={select}",
        "--format=value(name.basename())",
    )
    tpu_delete = gcloud(
        "compute",
        "tpus",
        "tpu-vm",
        "delete",
        Raw('"$name"'),
        f"--zone={tpu_zone}",
        project_flag(config),
        "--quiet",
        Raw("</dev/null"),
    )
    steps.append(
        Step(
            "trainer",
            "a TPU trainer (it saves a checkpoint and releases its lease on SIGTERM)",
            f'{tpu_list} | while read -r name; do\n  if [[ $name == "{config.name}-trainer" ]]; then\n'
            f"    {tpu_delete}\n  fi\ndone",
        )
    )
    steps.append(
        Step(
            "trainer",
            "the TPU trainer's queued request (--force: with its TPU VM, if any is left), so "
            "it cannot bring a TPU back later",
            f"if {queued_command(config, 'describe')} >/dev/null 2>&1; then\n"
            f"{indent(queued_command(config, 'delete', '--force', '--quiet'))}\nfi",
        )
    )
    if config.uses_dataflow:
        # The follower cancels its own job when it stops; this catches a job whose follower was killed
        # outright, or whose cancel failed.  pipeline is below operations: importing it here is allowed.
        from pipeline.dataflow_jobs import cancel_run_shell

        steps.append(
            Step(
                "shuffle",
                "the run's Dataflow jobs still active (selected by their names, which carry the run), cancelled",
                cancel_run_shell(config.root, config.project, config.dataflow_region),
            )
        )
    if delete_account:
        for email in [config.service_account(role) for role in ROLES] + [builder_account(config)]:
            describe = gcloud("iam", "service-accounts", "describe", email, project_flag(config))
            delete = gcloud("iam", "service-accounts", "delete", email, project_flag(config), "--quiet")
            steps.append(
                Step(
                    "account",
                    f"the service account {email.split('@')[0]}, if it is there",
                    f"if {describe} >/dev/null 2>&1; then\n{indent(delete)}\nfi",
                )
            )
    return steps


def _find_group_step(config: DeployConfig) -> Step:
    """``$zerolake_group_region``: where the worker group is ('' when there is none), found by listing, so
    ``down`` needs no zone flag of the plan.  The listing's name filter is checked again by exact name."""
    group = worker_group(config)
    listing = gcloud(
        "compute",
        "instance-groups",
        "managed",
        "list",
        project_flag(config),
        f"--filter=name={group}",
        "--format=value(name,region.basename())",
    )
    note = f"note: there is no regional worker group {group}"
    return Step(
        "workers",
        f"the region of the worker group {group}, if there is one",
        "\n".join(
            [
                "zerolake_group_region=",
                "while read -r name region; do",
                f'  if [[ $name == "{group}" && -n $region ]]; then zerolake_group_region=$region; fi',
                f"done < <({listing})",
                f"[[ -n $zerolake_group_region ]] || echo {shlex.quote(note)} >&2",
            ]
        ),
    )


def _group_in_found_region(config: DeployConfig, verb: str, *words) -> str:
    return gcloud(
        "compute",
        "instance-groups",
        "managed",
        verb,
        worker_group(config),
        Raw('--region="$zerolake_group_region"'),
        project_flag(config),
        *words,
    )

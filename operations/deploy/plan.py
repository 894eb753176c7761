"""From a DeployConfig to the exact shell plan that brings a deployment up: every gcloud command, in order.

Data flow: ``build_plan(config)`` asks each section of `operations.deploy.config.SECTIONS` for its `Step`s
(one per thing the deployment needs: an API, the bucket, an account, the release, an image, a VM...),
restricted to ``--only``; `operations.deploy.render` prints them as one bash script that a person can
read, paste or run (``--apply`` runs exactly this text).  `operations.deploy.update` plans moving a
running deployment to a new release, `operations.deploy.down` tearing one down.

Where each part lives::

    operations.deploy.steps     the plan's words: Step, quoting, gcloud/retry helpers, shared names
    operations.deploy.sections  services, bucket, accounts and grants, the release (package)
    operations.deploy.images    the release's images: Dataflow's workers', and the VMs'
    operations.deploy.vms       a VM's flags and metadata; the follower; the trainer (GPU/CPU VM, or TPU)
    operations.deploy.workers   the worker group: an instance template and a regional managed group

The plan can be run again: every create is guarded by a describe, so a rerun after a failure, or with a
larger ``--workers``, adds only what is missing.  What can fail for a while and then pass (an IAM grant
right after its account is made, a VM in a zone out of capacity) is retried by the script's ``retry``.
A trainer that still cannot be had is named at the end, with exit status 3, and the other roles go on.
Every gcloud command and flag used is checked against the installed gcloud's ``--help`` by
tests/operations/deploy/test_plan.py; flags that take a value are written ``--flag=value``.
docs/deploy.md is the operator's guide (releases, accounts and grants, zones, TPUs).
"""

from __future__ import annotations

from operations.deploy.config import DeployConfig
from operations.deploy.images import image_steps
from operations.deploy.sections import (
    account_steps,
    bucket_steps,
    release_steps,
    services_steps,
)
from operations.deploy.steps import Step
from operations.deploy.vms import shuffle_steps, tpu_wait_step, trainer_steps
from operations.deploy.workers import worker_steps


def missing_step() -> Step:
    return Step(
        "summary",
        "name what could not be had yet; everything else is up, and a rerun adds the rest",
        "if [[ -n $zerolake_missing ]]; then\n"
        '  echo "note: not up yet:$zerolake_missing; the other roles are running, and a rerun of this plan '
        'adds what is missing" >&2\n'
        "  exit 3\nfi",
    )


def build_plan(config: DeployConfig) -> list[Step]:
    """Every step of bringing the deployment up, in order, restricted to ``--only``."""
    builders = {
        "services": services_steps,
        "bucket": bucket_steps,
        "account": account_steps,
        "package": release_steps,
        "image": image_steps,
        "workers": worker_steps,
        "shuffle": lambda c: shuffle_steps(c) if c.shuffle else [],
        "trainer": lambda c: trainer_steps(c) if c.trainer_kind else [],
    }
    sections = list(config.sections)
    if "package" not in sections and {"image", "shuffle", "trainer", "workers"} & set(sections):
        sections.insert(
            sections.index(next(s for s in sections if s in ("image", "shuffle", "trainer", "workers"))), "package"
        )
    steps = [step for section in sections for step in builders[section](config)]
    if "trainer" in config.sections and config.trainer_kind == "tpu":
        steps.append(tpu_wait_step(config))  # after the workers: they need not wait for a TPU
    if "trainer" in config.sections and config.trainer_kind:
        steps.append(missing_step())
    return steps

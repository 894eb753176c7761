"""The plan's first sections: the project's APIs, the bucket, the service accounts and their grants, and
the release the VMs run (``package``).

Accounts: one per planned role, ``NAME-<role>``, with least privilege (docs/deploy.md's table): every
role writes the bucket outside the deploy area, reads this deployment's releases, and writes logs and
metrics; the follower also launches Dataflow jobs that run as itself.  The grants are IAM conditions on
object names, so no role can change what the others run.

Releases: each release is the sdist repacked so that one source is one file (operations.deploy.release),
uploaded once, create-only, to ``DEPLOY_AREA/releases/<sha256>.tar.gz``; ``DEPLOY_AREA/release`` names
the release the deployment runs.  ``plan`` builds this checkout's release (or takes ``--release``, or
without its package section reads the recorded one) and refuses, in one line, to create VMs of a
release other than the recorded one: moving a deployment is ``update``'s (operations.deploy.update).
"""

from __future__ import annotations

import shlex
import sys

from operations.deploy.config import DEPLOY_AREA, DeployConfig
from operations.deploy.images import builder_account_steps, vm_image_kinds
from operations.deploy.steps import (
    BUCKET_READER_ROLE,
    DATAFLOW_PROJECT_ROLES,
    LAKE_WRITER_ROLE,
    LOG_ROLES,
    RELEASE_READER_ROLE,
    REPO,
    SCRATCH_FILE,
    SCRATCH_FOLDER,
    Expand,
    Raw,
    Step,
    account_step,
    command,
    gcloud,
    grant,
    indent,
    member,
    pointer_url,
    project_flag,
    release_url,
    shell_error,
    unless_exists,
)


def services_steps(config: DeployConfig) -> list[Step]:
    apis = [
        "compute.googleapis.com",
        "storage.googleapis.com",
        "iam.googleapis.com",
        "logging.googleapis.com",
        "monitoring.googleapis.com",
    ]
    if config.trainer_kind == "tpu":
        apis.append("tpu.googleapis.com")
    if config.uses_dataflow:
        apis.append("dataflow.googleapis.com")
    if config.uses_dataflow or vm_image_kinds(config):
        apis += ["artifactregistry.googleapis.com", "cloudbuild.googleapis.com"]
    return [
        Step("services", "the APIs this deployment uses", gcloud("services", "enable", *apis, project_flag(config)))
    ]


def bucket_steps(config: DeployConfig) -> list[Step]:
    url = f"gs://{config.bucket}"
    create = gcloud(
        "storage",
        "buckets",
        "create",
        url,
        project_flag(config),
        f"--location={config.region}",
        "--uniform-bucket-level-access",
        "--public-access-prevention",
    )
    uniform = gcloud(
        "storage", "buckets", "describe", url, project_flag(config), "--format=value(uniform_bucket_level_access)"
    )
    no_uniform = (
        f"the bucket {url} has no uniform bucket-level access, and the roles' grants are IAM conditions, "
        f"which need it: enable it (gcloud storage buckets update {url} --uniform-bucket-level-access; "
        "object ACLs then stop applying), or give --root another bucket"
    )
    return [
        Step(
            "bucket",
            f"the lake's bucket, in {config.region} next to the VMs (kept by `down`)",
            unless_exists(gcloud("storage", "buckets", "describe", url, project_flag(config)), create),
        ),
        Step(
            "bucket",
            "an existing bucket has uniform bucket-level access, which conditional grants need",
            f"zerolake_uniform=$({uniform})\n"
            f"if [[ ${{zerolake_uniform,,}} != true ]]; then\n{indent(shell_error(no_uniform))}\nfi",
        ),
    ]


def account_steps(config: DeployConfig) -> list[Step]:
    steps = []
    for role in config.planned_roles:
        who = member(config, role)
        steps.append(account_step(config, config.service_account_id(role), f"the account the {role} VMs run as"))
        steps += bucket_grant_steps(config, role)
        for log_role in LOG_ROLES:
            steps.append(
                Step(
                    "account",
                    f"{log_role} for the {role}: the Ops Agent ships its journal and metrics",
                    grant(
                        "projects",
                        "add-iam-policy-binding",
                        config.project,
                        who,
                        f"--role={log_role}",
                        "--condition=None",
                    ),
                )
            )
    if config.uses_dataflow:
        who = member(config, "shuffle")
        for role in DATAFLOW_PROJECT_ROLES:
            steps.append(
                Step(
                    "account",
                    f"{role} for the shuffle follower: its Dataflow jobs",
                    grant(
                        "projects", "add-iam-policy-binding", config.project, who, f"--role={role}", "--condition=None"
                    ),
                )
            )
        steps.append(
            Step(
                "account",
                "the follower's Dataflow workers run as the follower's account (actAs on itself only)",
                grant(
                    "iam",
                    "service-accounts",
                    "add-iam-policy-binding",
                    config.service_account("shuffle"),
                    who,
                    "--role=roles/iam.serviceAccountUser",
                    project_flag(config),
                ),
            )
        )
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
    policy = gcloud(
        "storage",
        "buckets",
        "get-iam-policy",
        bucket,
        project_flag(config),
        "--flatten=bindings[].members",
        "--format=value(bindings.role,bindings.members,bindings.condition.title)",
    )
    unconditional = f'awk -F\'\\t\' \'$1 == "{LAKE_WRITER_ROLE}" && $2 == "{principal}" && $3 == ""\''
    remove = gcloud(
        "storage",
        "buckets",
        "remove-iam-policy-binding",
        bucket,
        who,
        f"--role={LAKE_WRITER_ROLE}",
        "--condition=None",
        project_flag(config),
        "--format=none",
    )
    title = f"zerolake {config.name} {role}"
    return [
        Step(
            "account",
            f"{LAKE_WRITER_ROLE} for the {role} on the bucket, outside the deploy area",
            grant(
                "storage",
                "buckets",
                "add-iam-policy-binding",
                bucket,
                who,
                f"--role={LAKE_WRITER_ROLE}",
                f"--condition=^;^expression={lake_condition(config, role)};title={title} lake",
                project_flag(config),
            ),
        ),
        Step(
            "account",
            f"{RELEASE_READER_ROLE} for the {role} on this deployment's releases only",
            grant(
                "storage",
                "buckets",
                "add-iam-policy-binding",
                bucket,
                who,
                f"--role={RELEASE_READER_ROLE}",
                f"--condition=^;^expression={release_condition(config)};title={title} releases",
                project_flag(config),
            ),
        ),
        Step(
            "account",
            f"{BUCKET_READER_ROLE} for the {role}: the bucket's own metadata, no objects",
            grant(
                "storage",
                "buckets",
                "add-iam-policy-binding",
                bucket,
                who,
                f"--role={BUCKET_READER_ROLE}",
                # Explicitly none: gcloud refuses, outside a terminal, a binding without a condition on a
                # policy that holds conditional ones (the two above).
                "--condition=None",
                project_flag(config),
            ),
        ),
        Step(
            "account",
            f"an earlier plan's unconditional {LAKE_WRITER_ROLE} for the {role} (it could write the "
            "releases), if there is one",
            f"if {policy} | {unconditional} | grep -q .; then\n{indent(remove)}\nfi",
        ),
    ]


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
        missing = f"--release: there is no release {release_url(config)}: build one with the package section"
        steps.append(
            Step(
                "package",
                f"the release named by --release, {config.release[:12]}..., already uploaded",
                f"zerolake_release={config.release}\n"
                f"if ! {gcloud('storage', 'ls', Expand(release_url(config)), project_flag(config))} "
                f">/dev/null; then\n"
                f"{indent(shell_error(missing))}\nfi",
            )
        )
    elif "package" in config.sections or update:
        python = config.python or sys.executable
        sdist = command(python, "setup.py", "-q", "sdist", "--dist-dir", Raw('"$zerolake_dist"'))
        repack = command(python, "-m", "operations.deploy.release", Raw('"$zerolake_dist"'))
        steps += [
            Step(
                "package",
                "build the source package (Cython sources included) and repack it as a release: one "
                "file per source, named by its sha256",
                f"zerolake_dist={SCRATCH_FOLDER}\n(cd {shlex.quote(str(REPO))} && {sdist})\n"
                f"zerolake_release=$(cd {shlex.quote(str(REPO))} && {repack})",
            ),
            Step(
                "package",
                "upload it once: a release is never overwritten (--no-clobber), and the VMs check its "
                "sha256 before they run it",
                gcloud(
                    "storage",
                    "cp",
                    "--no-clobber",
                    Raw('"$zerolake_dist/release.tar.gz"'),
                    Expand(release_url(config)),
                    project_flag(config),
                ),
            ),
        ]
    else:
        read = gcloud("storage", "cat", pointer, project_flag(config))
        unrecorded = (
            f"deployment {config.name} records no release at {pointer}: plan the package section, "
            "or give --release SHA256"
        )
        steps.append(
            Step(
                "package",
                "the release the deployment runs (no package section, no --release)",
                f"if ! zerolake_release=$({read} 2>/dev/null) "
                "|| [[ ! $zerolake_release =~ ^[0-9a-f]{64}$ ]]; "
                f"then\n{indent(shell_error(unrecorded))}\nfi",
            )
        )
        return steps
    record = "\n".join(
        [
            f"zerolake_note={SCRATCH_FILE}",
            'printf \'%s\\n\' "$zerolake_release" > "$zerolake_note"',
            gcloud("storage", "cp", Raw('"$zerolake_note"'), pointer, project_flag(config)),
        ]
    )
    if update:
        steps.append(
            Step("package", "record it as the deployment's release (a plan run meanwhile adds VMs of it)", record)
        )
        return steps
    running = gcloud("storage", "cat", pointer, project_flag(config))
    refusal = (
        f"deployment {config.name} runs release $zerolake_running and this plan's is $zerolake_release: "
        "move the deployment with `python -m operations.deploy update` (the same flags), or add VMs of its "
        "release with --release $zerolake_running"
    )
    steps.append(
        Step(
            "package",
            "one release per deployment: record this one, or refuse one of another",
            f"zerolake_running=$({running} 2>/dev/null || true)\n"
            f"if [[ -z $zerolake_running ]]; then\n{indent(record)}\n"
            f'elif [[ $zerolake_running != "$zerolake_release" ]]; then\n{indent(shell_error(refusal))}\nfi',
        )
    )
    return steps

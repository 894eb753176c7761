"""The release's images, built by Cloud Build into the deployment's Artifact Registry repository.

Two kinds: the Dataflow workers' image (Beam's SDK image with the release installed, for the follower's
jobs) and each Compute Engine VM's image (one per accelerator kind, cpu or gpu), which
operations/vm/startup-image.sh pulls by digest and runs the role in.  Each is tagged with the release
(a rerun skips a build that exists); the plan reads the digest the tag resolves to into a shell
variable, and the VMs and jobs name the image by that digest, so no later push changes what they run.
Cloud Build runs as its own account, ``NAME-builder``, made and granted here.
"""

from __future__ import annotations

from operations.deploy.config import DEPLOY_AREA, DeployConfig
from operations.deploy.steps import (
    DATAFLOW_DOCKERFILE,
    RELEASE_TAG,
    SCRATCH_FILE,
    SCRATCH_FOLDER,
    VM_IMAGE_VARS,
    Expand,
    Raw,
    Step,
    account_step,
    command,
    gcloud,
    grant,
    indent,
    member,
    project_flag,
    release_url,
    shell_error,
    unless_exists,
)


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


BUILD_SOURCE = "build-source"
"""The deploy area's folder where ``gcloud builds submit`` stages each build's source."""


def build_source_condition(config: DeployConfig) -> str:
    """The builder's one read: the staged build sources (it could read the whole lake)."""
    prefix = f"projects/_/buckets/{config.bucket}/objects/{DEPLOY_AREA}/{config.name}/{BUILD_SOURCE}/"
    return f'resource.name.startsWith("{prefix}")'


def builder_account_steps(config: DeployConfig) -> list[Step]:
    """Cloud Build's own account for the images: push to the one repository, read the staged source, log."""
    who = f"--member=serviceAccount:{builder_account(config)}"
    return [
        account_step(config, builder_account_id(config), "the account Cloud Build builds the release's images as"),
        Step(
            "account",
            "the builder reads the build's source, staged in the deploy area of the bucket, and nothing else",
            grant(
                "storage",
                "buckets",
                "add-iam-policy-binding",
                f"gs://{config.bucket}",
                who,
                "--role=roles/storage.objectViewer",
                f"--condition=^;^expression={build_source_condition(config)};title=zerolake {config.name} builder",
                project_flag(config),
            ),
        ),
        Step(
            "account",
            "the builder writes the build's log",
            grant(
                "projects",
                "add-iam-policy-binding",
                config.project,
                who,
                "--role=roles/logging.logWriter",
                "--condition=None",
            ),
        ),
    ]


UNPACK_STEP = (
    "- name: gcr.io/cloud-builders/docker",
    "  entrypoint: bash",
    "  args: ['-c', 'tar -xzf zerolake.tar.gz --strip-components=1 && rm zerolake.tar.gz']",
)
"""The VM image's first build step: the release unpacked in the build's workspace (its own Dockerfile and
.dockerignore included), so the image is built from the release object, not from this checkout."""


def cloudbuild_config(
    config: DeployConfig, image: str, build_args: tuple[str, ...] = (), first: tuple[str, ...] = ()
) -> str:
    """The build: Docker from the context (after the steps ``first``), pushed, logged to Cloud Logging only
    (a build under its own account needs a log destination), as the builder account."""
    args = "".join(f", --build-arg, '{arg}'" for arg in build_args)
    return "\n".join(
        [
            "steps:",
            *first,
            "- name: gcr.io/cloud-builders/docker",
            f"  args: [build{args}, --tag, '{image}', .]",
            f"images: ['{image}']",
            f"serviceAccount: projects/{config.project}/serviceAccounts/{builder_account(config)}",
            "options:",
            "  logging: CLOUD_LOGGING_ONLY",
            "timeout: 3600s",
        ]
    )


def _build(config: DeployConfig, context: str, image: str, why: str) -> Step:
    """Cloud Build of one context into ``image`` (a tag naming the release), unless that tag exists."""
    build = gcloud(
        "builds",
        "submit",
        Raw(f'"{context}"'),
        Raw(f'--config="{context}/cloudbuild.yaml"'),
        f"--region={config.dataflow_region}",
        f"--gcs-source-staging-dir={config.deploy_area}/{BUILD_SOURCE}",
        project_flag(config),
    )
    return Step(
        "image",
        f"{why}: build and push it with Cloud Build (no Docker needed here), unless built before",
        unless_exists(
            gcloud("artifacts", "docker", "images", "describe", Raw(f'"{image}"'), project_flag(config)), build
        ),
    )


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
    create = gcloud(
        "artifacts",
        "repositories",
        "create",
        repository,
        "--repository-format=docker",
        f"--location={region}",
        project_flag(config),
        f"--description=zerolake {config.name}: the images of its releases",
    )
    steps = [
        Step(
            "image",
            f"the deployment's image repository, in {region} next to the follower and its jobs",
            unless_exists(
                gcloud(
                    "artifacts", "repositories", "describe", repository, f"--location={region}", project_flag(config)
                ),
                create,
            ),
        )
    ]
    for role in config.planned_roles:
        if role == "trainer" and config.trainer_kind == "tpu":
            continue  # the TPU trainer installs with pip at boot: it pulls no image
        steps.append(
            Step(
                "image",
                f"the {role} VMs pull the release's image"
                + (" (and the follower's Dataflow workers theirs)" if role == "shuffle" else ""),
                grant(
                    "artifacts",
                    "repositories",
                    "add-iam-policy-binding",
                    repository,
                    f"--location={region}",
                    member(config, role),
                    "--role=roles/artifactregistry.reader",
                    project_flag(config),
                ),
            )
        )
    steps.append(
        Step(
            "image",
            "Cloud Build's account pushes the images",
            grant(
                "artifacts",
                "repositories",
                "add-iam-policy-binding",
                repository,
                f"--location={region}",
                f"--member=serviceAccount:{builder_account(config)}",
                "--role=roles/artifactregistry.writer",
                project_flag(config),
            ),
        )
    )
    mismatch = "the release downloaded for the images has sha256 $zerolake_got, not $zerolake_release"
    steps.append(
        Step(
            "image",
            "the release, downloaded once for the builds and checked against its sha256",
            "\n".join(
                [
                    f"zerolake_release_file={SCRATCH_FILE}",
                    gcloud(
                        "storage",
                        "cp",
                        Expand(release_url(config)),
                        Raw('"$zerolake_release_file"'),
                        project_flag(config),
                    ),
                    'zerolake_got=$(sha256sum "$zerolake_release_file" | cut -d" " -f1)',
                    f'if [[ $zerolake_got != "$zerolake_release" ]]; then\n{indent(shell_error(mismatch))}\nfi',
                ]
            ),
        )
    )
    if config.uses_dataflow:
        image = f"{image_name(config)}:{RELEASE_TAG}$zerolake_release"
        context = "\n".join(
            [
                f"zerolake_context={SCRATCH_FOLDER}",
                command("cp", Raw('"$zerolake_release_file"'), Raw('"$zerolake_context/zerolake.tar.gz"')),
                command("cp", str(DATAFLOW_DOCKERFILE), Raw('"$zerolake_context/Dockerfile"')),
                f'cat > "$zerolake_context/cloudbuild.yaml" <<EOF\n{cloudbuild_config(config, image)}\nEOF',
            ]
        )
        steps += [
            Step(
                "image",
                "Dataflow's build context: operations/dataflow/Dockerfile and the release, tagged by its sha256",
                context,
            ),
            _build(config, "$zerolake_context", image, "the Dataflow workers' image"),
        ]
    for kind in kinds:
        image = f"{vm_image_name(config, kind)}:{RELEASE_TAG}$zerolake_release"
        context = "\n".join(
            [
                f"zerolake_vm_context_{kind}={SCRATCH_FOLDER}",
                command("cp", Raw('"$zerolake_release_file"'), Raw(f'"$zerolake_vm_context_{kind}/zerolake.tar.gz"')),
                f'cat > "$zerolake_vm_context_{kind}/cloudbuild.yaml" <<EOF\n'
                f"{cloudbuild_config(config, image, (f'ACCELERATOR={kind}',), UNPACK_STEP)}\nEOF",
            ]
        )
        steps += [
            Step(
                "image",
                f"the {kind.upper()} VMs' build context: the release, unpacked by the build, its "
                f"own Dockerfile built with ACCELERATOR={kind}",
                context,
            ),
            _build(config, f"$zerolake_vm_context_{kind}", image, f"the {kind.upper()} VMs' image"),
        ]
    return steps


def describe_digest(config: DeployConfig, tag: str):
    """The gcloud command that prints the digest (``sha256:...``) of the image ``tag`` names."""
    return gcloud(
        "artifacts",
        "docker",
        "images",
        "describe",
        Raw(f'"{tag}"'),
        project_flag(config),
        "--format=value(image_summary.digest)",
    )


def vm_image_digest_step(config: DeployConfig, kind: str, section: str) -> Step:
    """``$zerolake_vm_image_KIND``: the digest of the release's VM image, which the VMs' metadata names
    (``IMAGE@sha256:...``): a later push to any tag cannot change what a VM pulls."""
    tag = f"{vm_image_name(config, kind)}:{RELEASE_TAG}$zerolake_release"
    describe = describe_digest(config, tag)
    missing = (
        f"there is no {kind.upper()} VM image of release $zerolake_release ({tag}): plan the image section "
        "for it (it builds from the release)"
    )
    var = f"zerolake_vm_image_{kind}"
    return Step(
        section,
        f"the digest of the release's {kind.upper()} VM image, which the VMs' metadata names",
        f"if ! {var}=$({describe}) || [[ ${var} != sha256:* ]]; then\n{indent(shell_error(missing))}\nfi",
    )


def image_digest_step(config: DeployConfig) -> Step:
    """``$zerolake_image_digest``: the digest of the release's Dataflow image, which the follower's jobs name
    (``IMAGE@sha256:...``), so a later push to any tag cannot change what they run."""
    tag = f"{image_name(config)}:{RELEASE_TAG}$zerolake_release"
    describe = describe_digest(config, tag)
    missing = (
        f"there is no Dataflow image of release $zerolake_release ({tag}): plan the image section for it "
        "(it builds from the release)"
    )
    return Step(
        "shuffle",
        "the digest of the release's Dataflow image, which the follower's jobs run",
        f"if ! zerolake_image_digest=$({describe}) || [[ $zerolake_image_digest != sha256:* ]]; then\n"
        f"{indent(shell_error(missing))}\nfi",
    )

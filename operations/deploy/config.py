"""What a deployment is made of: one frozen dataclass, its flags, and the machine tables.

`DeployConfig` holds every choice a person makes when putting zerolake on Google Cloud: the project,
each role's zone, the lake root ``gs://BUCKET/RUN``, and the count, machine and accelerator of each
role.  ``python -m operations.deploy`` turns its fields into flags (format.cli) and validates them
once, in ``__post_init__`` (a TPU type the dated table of `operations.deploy.zones` does not list in
its role's zone is refused there); `operations.deploy.plan` turns a validated config into the shell
plan.  Nothing here touches the network or the environment.

Terms:

* *deployment name* (``--name``): the prefix of every VM, TPU and service account name, and the
  ``zerolake-deployment`` label that ``down`` selects on.
* *role*: ``worker`` (self-play), ``shuffle`` (the shuffle follower), ``trainer``; each has its own
  zone (``--worker-zone`` ...; ``--zone`` by default) and service account ``NAME-<role>``.
* *accelerator kind* of a role: ``cpu``, ``gpu`` (NVIDIA, ``--*-gpu``), ``tpu`` (trainer only).
* *deploy area*: ``gs://BUCKET/zerolake-deploy/<name>/``, outside the lake root: the releases
  (``releases/<sha256>.tar.gz``, create-only), the name of the one the deployment runs
  (``release``), Dataflow's staging and temporary files.  Only the person deploying writes it.
* *release*: one sdist, named by its sha256 (operations.deploy.release).
* *worker group*: the regional managed instance group ``NAME-workers`` of ``--workers`` VMs
  (operations.deploy.workers); each worker's spool lives on its stateful disk ``zerolake-spool``.
"""

from __future__ import annotations

import dataclasses
import re

from cloud.base import validate_prefix
from format.cli import flag_name, root_setting, setting, setting_problems, settings_error
from operations.deploy import zones

ROLES = ("worker", "shuffle", "trainer")

SECTIONS = ("services", "bucket", "account", "package", "image", "shuffle", "trainer", "workers")
"""Plan sections in the order they run; ``--only`` picks some of them.  The
follower and the trainer come before the workers, the roles there is one of
first: the worker group fills up whenever Compute Engine has spot VMs to give
(often later, for spot GPUs), and a TPU trainer's queued request is waited for
after the workers.
``image`` (the Dataflow workers' container) builds from the sdist that
``package`` makes, so it needs ``package`` in the same run."""

SHUFFLE_RUNNERS = ("auto", "local", "dataflow")

DATAFLOW_ABOVE_POSITIONS = 1_000_000
"""``--shuffle-runner auto``: the follower builds a window of at most this many
positions itself (Beam's in-process runner on the follower VM) and a larger
one on Dataflow (pipeline.shuffle --dataflow-above-positions).  A Dataflow job
spends minutes starting its workers before it reads a byte, while the
in-process runner does about 10k elements/s on 2 cores (measured here), so early,
small windows are done sooner on the VM and only large ones need Dataflow's
workers.  A judgement, not a measurement: Dataflow cannot be reached from
the machine this was written on."""


@dataclasses.dataclass(frozen=True)
class GpuKind:
    """How Compute Engine attaches one NVIDIA GPU model.

    ``machines``: GPU count -> machine type.  ``bundled``: the machine type
    comes with its GPUs (A2, A3, G2), so ``--accelerator`` must not be given;
    otherwise (N1) the GPUs are attached with ``--accelerator``.
    """

    machines: dict
    bundled: bool


GPU_KINDS = {
    "nvidia-l4": GpuKind({1: "g2-standard-8", 2: "g2-standard-24", 4: "g2-standard-48", 8: "g2-standard-96"}, True),
    "nvidia-tesla-t4": GpuKind({1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32"}, False),
    "nvidia-tesla-v100": GpuKind(
        {1: "n1-standard-8", 2: "n1-standard-16", 4: "n1-standard-32", 8: "n1-standard-64"}, False
    ),
    "nvidia-tesla-a100": GpuKind(
        {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g"}, True
    ),
    "nvidia-a100-80gb": GpuKind(
        {1: "a2-ultragpu-1g", 2: "a2-ultragpu-2g", 4: "a2-ultragpu-4g", 8: "a2-ultragpu-8g"}, True
    ),
    "nvidia-h100-80gb": GpuKind({1: "a3-highgpu-1g", 2: "a3-highgpu-2g", 4: "a3-highgpu-4g", 8: "a3-highgpu-8g"}, True),
}

# Images.  Every Compute Engine VM runs the release's container image
# (operations/vm/startup-image.sh) on Container-Optimized OS, which comes with
# Docker running, docker-credential-gcr for Artifact Registry, the logging
# agent that ships the containers' JSON lines as fields, and (GPU VMs)
# `cos-extensions install gpu`, the NVIDIA driver path Google documents for
# containers (https://cloud.google.com/container-optimized-os/docs/how-to/run-gpus;
# the image brings CUDA and cuDNN as pip packages).  Image families change
# over time: the defaults are flags.  Not checked here (no cloud account is
# reachable from this machine).
CPU_IMAGE = ("cos-cloud", "cos-stable")
GPU_IMAGE = CPU_IMAGE

LABEL_VALUE = re.compile(r"[a-z][a-z0-9-]{0,20}")
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]")
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z][a-z0-9]*")
"""A zone: ``us-central1-a``, and the AI zones such as ``us-central1-ai1`` or ``us-south1-ai1b``."""
ANY_ZONE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)+")
"""With ``--no-check-zones``: any name of that shape (it is only ever quoted into gcloud's flags)."""
DURATION = re.compile(r"[1-9][0-9]*[smhd]")
"""A gcloud duration (``gcloud topic datetimes``): ``30m``, ``6h``, ``7d``."""
NETWORK_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
"""A VPC network or subnet name (RFC 1035, as Compute Engine names resources)."""
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
IMAGE = re.compile(r"[a-z][a-z0-9.:-]*[a-z0-9]/[a-z][a-z0-9-]*[a-z0-9]")
"""An image's project and family (``ubuntu-os-cloud/ubuntu-2204-lts``; a domain project has ``.`` and ``:``)."""
MACHINE_TYPE = re.compile(r"[a-z0-9]+-[a-z0-9-]+")
TPU_TYPE = re.compile(r"v[0-9][a-z0-9]*-[0-9]+")
ROOT_PREFIX = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*/?")
"""The run's object prefix after ``gs://BUCKET/``: '/'-separated segments of
letters, digits and ``_.-``.  The root travels in instance metadata (where ','
separates entries) and into each VM's systemd environment file (a
double-quoted value, where quotes, '$', '\\' and newlines act), so nothing else
is safe there, though GCS object names would allow it."""
ROOT_PREFIX_MAX = 512
"""Characters of that prefix: GCS object names end at 1024 bytes, and the
lake's own paths under the root (chunk names carry the worker's host name)
need the rest."""
TPU_RUNTIME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""A TPU VM software version (``tpu-vm-tf-2.18.0-pjrt``, ``v2-alpha-tpuv5-lite``): gcloud takes it quoted,
and the plan's step comment names it."""
SHA256 = re.compile(r"[0-9a-f]{64}")
"""A release's name: the sha256 of its file, in lower-case hex (sha256sum's)."""
DEPLOY_AREA = "zerolake-deploy"
"""The bucket's top-level folder of the deployments' releases and Dataflow files; no lake root may lie in it
(the role accounts cannot write it, operations.deploy.sections)."""
ARGS_TEXT = re.compile(r"[A-Za-z0-9_./:= -]*")
"""Extra role flags travel in instance metadata, where ',' separates entries:
letters, digits and ``_./:=-`` and spaces only."""


def _field(default, help_text, **options):
    return setting(default, help_text, **options)


@dataclasses.dataclass(frozen=True)
class DeployConfig:
    """Every choice of one deployment (see the module docstring for the terms)."""

    project: str = _field("", "Google Cloud project id", required=True)
    root: str = root_setting(note="here gs://BUCKET/RUN (the bucket is created if missing)")
    zone: str = _field(
        "us-central1-a", "zone of each role not given one of its own (the bucket is created in its region)"
    )
    worker_zone: str = _field("", "zone of the worker VMs ('' = --zone)")
    shuffle_zone: str = _field("", "zone of the shuffle follower VM ('' = --zone); its Dataflow jobs run in its region")
    trainer_zone: str = _field(
        "", "zone of the trainer ('' = --zone): each TPU generation exists in a few zones only (see docs/deploy.md)"
    )
    check_zones: bool = _field(
        True,
        "refuse a TPU type that the dated table in operations/deploy/zones.py does "
        "not list in its role's zone, and a zone not shaped like us-central1-a or "
        "us-central1-ai1 (GPU types are checked live only); --no-check-zones trusts "
        "the zone (the plan still asks gcloud, live, before creating anything)",
    )
    network: str = _field(
        "", "VPC network of every VM, TPU VM and Dataflow worker ('' = the project's 'default' network)"
    )
    subnet: str = _field(
        "",
        "subnet of that network in the roles' region (every role must then be in one "
        "region); '' = the network's own choice (auto-mode networks)",
    )
    external_ip: bool = _field(
        True,
        "give VMs external IPs; --no-external-ip for organisations that forbid "
        "them (the subnet then needs Private Google Access, and Cloud NAT for "
        "the packages the VMs install: docs/deploy.md, 'Networks')",
    )
    name: str = _field("zerolake", "deployment name: prefix of VM names, label value, service account name")
    # --- workers ---
    workers: int = _field(0, "self-play worker VMs", at_least=0)
    worker_gpu: str = _field("", f"NVIDIA GPU of each worker VM ({', '.join(GPU_KINDS)}); '' = CPU VMs")
    worker_gpu_count: int = _field(1, "GPUs per worker VM")
    worker_machine: str = _field("", "machine type of a worker VM ('' = the GPU's default, or c2d-standard-16)")
    worker_processes: int = _field(
        0,
        "worker processes per VM (0 = 4 per GPU, or 8 on a CPU VM); "
        "see docs/accelerators.md, 'How many workers per GPU'",
        at_least=0,
    )
    worker_args: str = _field("", "extra flags for every selfplay.worker, e.g. '--visits 128 --board-size 19'")
    worker_zones: str = _field(
        "",
        "zones of the regional worker group, comma-separated, all in the region of "
        "--worker-zone ('' = --worker-zone alone); the group creates its VMs where "
        "they can be had (target distribution shape ANY)",
    )
    spot: bool = _field(
        True,
        "worker VMs are spot VMs (the group recreates a preempted one; its spool is kept on "
        "its stateful disk); --no-spot for standard VMs",
    )
    # --- shuffle follower ---
    shuffle: bool = _field(True, "run the shuffle follower VM (--no-shuffle: none)")
    shuffle_machine: str = _field("n2-standard-8", "machine type of the shuffle follower VM")
    shuffle_runner: str = _field(
        "auto",
        "where windows are built: local (on the follower VM), dataflow (every "
        "window), or auto (each window by its size: see "
        "--dataflow-above-positions)",
        choices=SHUFFLE_RUNNERS,
    )
    dataflow_above_positions: int = _field(
        DATAFLOW_ABOVE_POSITIONS,
        "with --shuffle-runner auto: windows of at "
        "most this many positions are built on the "
        "follower VM, larger ones on Dataflow",
        at_least=1,
    )
    dataflow_max_workers: int = _field(20, "--max_num_workers of each Dataflow job", at_least=1)
    dataflow_machine: str = _field("n2-standard-4", "machine type of the Dataflow workers")
    shuffle_args: str = _field("", "extra flags for pipeline.shuffle --follow")
    # --- trainer ---
    trainer_tpu: str = _field("", "train on a Cloud TPU VM of this type, e.g. v5litepod-8, v4-8")
    trainer_tpu_runtime: str = _field(
        "",
        "TPU VM software version (--runtime-version); '' = the generation's base image, "
        "where install.sh adds the pinned tensorflow-tpu (operations/deploy/zones.py)",
    )
    trainer_tpu_valid_for: str = _field(
        "24h",
        "how long the TPU trainer's queued request waits for capacity "
        "(gcloud --valid-until-duration: 30m, 6h, 7d); after that it "
        "fails and a rerun of the plan queues a new one",
    )
    trainer_wait_minutes: int = _field(
        20,
        "how long the plan waits for a queued TPU to become ACTIVE before it "
        "goes on without it (the request stays queued: the TPU VM starts "
        "training whenever it comes; the plan then exits 3 naming it)",
        at_least=0,
    )
    trainer_gpu: str = _field("", f"or train on a GPU VM with this NVIDIA GPU ({', '.join(GPU_KINDS)})")
    trainer_gpu_count: int = _field(1, "GPUs of the trainer VM (more than one: MirroredStrategy)")
    trainer_machine: str = _field(
        "", "machine type of a GPU or CPU trainer VM ('' = the GPU's default, or n2-standard-16)"
    )
    trainer_cpu: bool = _field(False, "train on a CPU VM (small boards, trials)")
    trainer_args: str = _field("", "extra flags for model.train --follow")
    # --- images ---
    cpu_image: str = _field("/".join(CPU_IMAGE), "image project/family of CPU VMs")
    gpu_image: str = _field("/".join(GPU_IMAGE), "image project/family of GPU VMs (NVIDIA driver included)")
    # --- plan ---
    only: str = _field("", f"comma-separated plan sections to print ({', '.join(SECTIONS)}); '' = all")
    release: str = _field(
        "",
        "the sha256 of a release already uploaded (releases/SHA256.tar.gz in the deploy area) "
        "for the VMs to run, instead of building one from this checkout; '' = the package "
        "section's build, or without that section the release the deployment runs",
    )
    python: str = _field(
        "", "the local Python that builds the sdist (needs Cython and numpy; '' = the one running this command)"
    )

    def __post_init__(self):
        errors = []

        def need(ok: bool, field: str, problem: str) -> None:
            if not ok:
                errors.append(f"{flag_name(field)}: {problem}")

        need(
            bool(PROJECT_ID.fullmatch(self.project)),
            "project",
            f"{self.project!r} is not a project id (6-30 of a-z, 0-9, '-', starting with a letter)",
        )
        zone_shape = ZONE if self.check_zones else ANY_ZONE  # --no-check-zones overrides the shape too
        for field in ("zone", "worker_zone", "shuffle_zone", "trainer_zone"):
            value = getattr(self, field)
            need(
                bool(zone_shape.fullmatch(value)) or (field != "zone" and not value),
                field,
                f"{value!r} is not a zone such as us-central1-a or us-central1-ai1"
                + (" (--no-check-zones accepts other names)" if self.check_zones else ""),
            )
        worker_region = region_of(self.zone_of("worker"))
        for zone in self.worker_group_zones:
            need(
                bool(zone_shape.fullmatch(zone)) and region_of(zone) == worker_region,
                "worker_zones",
                f"{zone!r} is not a zone of {worker_region}, the region of the worker group (--worker-zone's): "
                "a regional group spreads over the zones of one region",
            )
        need(
            bool(LABEL_VALUE.fullmatch(self.name)),
            "name",
            f"{self.name!r}: 1-21 of a-z, 0-9 and '-', starting with a letter (it prefixes VM names)",
        )
        bucket, _ = split_root(self.root) if self.root.startswith("gs://") else ("", "")
        if not (bucket and BUCKET_NAME.fullmatch(bucket)):
            need(False, "root", f"{self.root!r} is not gs://BUCKET/RUN with a valid bucket name")
        else:
            prefix = self.root.removeprefix("gs://").partition("/")[2]
            problem = root_prefix_problem(prefix)
            if problem is None and prefix.strip("/").split("/")[0] == DEPLOY_AREA:
                problem = f"the run may not lie in {DEPLOY_AREA}/, the deploy area that only you can write"
            need(problem is None, "root", f"{self.root!r}: {problem}")
        errors += setting_problems(self)  # declared ranges (format.cli)
        for field in dataclasses.fields(self):
            # Every text setting reaches the generated script somewhere, a step's comment line at least,
            # where a newline would end the comment and make the rest a command that --apply runs.
            value = getattr(self, field.name)
            if isinstance(value, str) and not value.isprintable():
                need(False, field.name, f"{value!r} holds a control character (a newline or tab, for one)")
        need(
            not self.trainer_tpu_runtime or bool(TPU_RUNTIME.fullmatch(self.trainer_tpu_runtime)),
            "trainer_tpu_runtime",
            f"{self.trainer_tpu_runtime!r} is not a TPU software version such as tpu-vm-tf-2.18.0-pjrt",
        )
        for field in ("worker_gpu", "trainer_gpu"):
            value = getattr(self, field)
            need(not value or value in GPU_KINDS, field, f"{value!r} is not one of {', '.join(GPU_KINDS)}")
        for field, gpu in (("worker_gpu_count", self.worker_gpu), ("trainer_gpu_count", self.trainer_gpu)):
            count = getattr(self, field)
            allowed = sorted(GPU_KINDS[gpu].machines) if gpu in GPU_KINDS else [1, 2, 4, 8]
            need(count in allowed, field, f"{count}: {gpu or 'the GPU'} comes {allowed} to a VM")
        for field in ("worker_machine", "trainer_machine", "shuffle_machine", "dataflow_machine"):
            value = getattr(self, field)
            need(not value or bool(MACHINE_TYPE.fullmatch(value)), field, f"{value!r} is not a machine type")
        need(
            not self.trainer_tpu or bool(TPU_TYPE.fullmatch(self.trainer_tpu)),
            "trainer_tpu",
            f"{self.trainer_tpu!r} is not a TPU type such as v5litepod-8 or v4-8",
        )
        trainers = [
            flag
            for flag, on in (
                ("--trainer-tpu", self.trainer_tpu),
                ("--trainer-gpu", self.trainer_gpu),
                ("--trainer-cpu", self.trainer_cpu),
            )
            if on
        ]
        need(len(trainers) <= 1, "trainer_tpu", f"give at most one of {', '.join(trainers)}")
        if self.trainer_tpu and TPU_TYPE.fullmatch(self.trainer_tpu):
            # Also with --trainer-tpu-runtime: the environment TensorFlow needs comes from the same table.
            problem = zones.tpu_problem(self.trainer_tpu)
            need(problem is None, "trainer_tpu", problem or "")
        need(
            bool(DURATION.fullmatch(self.trainer_tpu_valid_for)),
            "trainer_tpu_valid_for",
            f"{self.trainer_tpu_valid_for!r} is not a duration such as 30m, 6h or 7d",
        )
        for field in ("network", "subnet"):
            value = getattr(self, field)
            need(
                not value or bool(NETWORK_NAME.fullmatch(value)),
                field,
                f"{value!r} is not a network or subnet name (a-z, 0-9, '-', starting with a letter)",
            )
        regions = sorted({region_of(self.zone_of(role)) for role in self.planned_roles} | {self.region})
        need(
            not self.subnet or len(regions) == 1,
            "subnet",
            f"a subnet lives in one region, and these roles run in {', '.join(regions)}: put every role in one "
            "region (--zone), or drop --subnet",
        )
        if self.check_zones and not errors:
            for field, problem in self.zone_problems():
                need(False, field, problem)
        for field in ("worker_args", "shuffle_args", "trainer_args"):
            need(
                bool(ARGS_TEXT.fullmatch(getattr(self, field))),
                field,
                "may hold only letters, digits, spaces and _./:=- (it travels in instance metadata)",
            )
        for field in ("cpu_image", "gpu_image"):
            need(bool(IMAGE.fullmatch(getattr(self, field))), field, "must be PROJECT/FAMILY")
        unknown = sorted(set(self.chosen_sections) - set(SECTIONS))
        need(not unknown, "only", f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
        need(
            not self.release or bool(SHA256.fullmatch(self.release)),
            "release",
            f"{self.release!r} is not a sha256 (64 of 0-9, a-f), the name of a release in the deploy area",
        )
        if errors:
            raise ValueError(settings_error(errors, "invalid deployment"))

    # --- derived values (one place each) ------------------------------------------
    @property
    def chosen_sections(self) -> tuple[str, ...]:
        """The names --only gives, as given."""
        return tuple(s.strip() for s in self.only.split(",") if s.strip())

    @property
    def sections(self) -> tuple[str, ...]:
        """The sections to plan, always in SECTIONS' order (--only picks, it does not reorder)."""
        chosen = self.chosen_sections
        return tuple(s for s in SECTIONS if s in chosen) if chosen else SECTIONS

    @property
    def region(self) -> str:
        """The bucket's region: --zone's."""
        return region_of(self.zone)

    def zone_of(self, role: str) -> str:
        """The zone of one role's VMs: its own flag, else --zone."""
        return getattr(self, f"{role}_zone") or self.zone

    @property
    def worker_group_zones(self) -> tuple[str, ...]:
        """The zones the worker group spreads over: --worker-zones, else the worker zone alone."""
        given = tuple(z.strip() for z in self.worker_zones.split(",") if z.strip())
        return given or (self.zone_of("worker"),)

    @property
    def worker_region(self) -> str:
        """The worker group's region (a regional managed instance group)."""
        return region_of(self.zone_of("worker"))

    @property
    def dataflow_region(self) -> str:
        """Dataflow jobs run next to the follower that launches them."""
        return region_of(self.zone_of("shuffle"))

    @property
    def tpu_runtime(self) -> str:
        """The TPU VM's software version: --trainer-tpu-runtime, else its generation's TensorFlow image."""
        return self.trainer_tpu_runtime or zones.tpu_runtime(self.trainer_tpu) or ""

    @property
    def tpu_generation(self) -> str:
        """``v5litepod`` for ``--trainer-tpu v5litepod-8`` ('' without a TPU trainer)."""
        return zones.tpu_generation(self.trainer_tpu) or ""

    def zone_problems(self) -> list[tuple[str, str]]:
        """(flag field, problem) for each accelerator the table does not list in its role's zone."""
        found = []
        checks = [
            ("worker_zone", "worker", "gpu", self.worker_gpu if self.workers else ""),
            ("trainer_zone", "trainer", "gpu", self.trainer_gpu),
            ("trainer_zone", "trainer", "tpu", self.trainer_tpu),
        ]
        for field, role, kind, accelerator in checks:
            if accelerator:
                problem = zones.zone_problem(kind, accelerator, self.zone_of(role))
                if problem:
                    found.append((field if getattr(self, field) else "zone", problem))
        return found

    @property
    def bucket(self) -> str:
        return split_root(self.root)[0]

    def service_account_id(self, role: str) -> str:
        """``NAME-worker``, ``NAME-shuffle``, ``NAME-trainer``: each role acts with its own grants only."""
        return f"{self.name}-{role}"

    def service_account(self, role: str) -> str:
        return f"{self.service_account_id(role)}@{self.project}.iam.gserviceaccount.com"

    @property
    def planned_roles(self) -> tuple[str, ...]:
        """The roles this plan has VMs for (their accounts are created; the others are left alone)."""
        return tuple(
            role
            for role, planned in (
                ("worker", self.workers > 0),
                ("shuffle", self.shuffle),
                ("trainer", bool(self.trainer_kind)),
            )
            if planned
        )

    @property
    def deploy_area(self) -> str:
        """``gs://BUCKET/zerolake-deploy/<name>``: the package and Dataflow's files, outside the lake."""
        return f"gs://{self.bucket}/{DEPLOY_AREA}/{self.name}"

    @property
    def trainer_kind(self) -> str:
        """'tpu', 'gpu', 'cpu', or '' when the plan has no trainer."""
        return "tpu" if self.trainer_tpu else "gpu" if self.trainer_gpu else "cpu" if self.trainer_cpu else ""

    @property
    def worker_kind(self) -> str:
        return "gpu" if self.worker_gpu else "cpu"

    @property
    def uses_dataflow(self) -> bool:
        """Whether some windows may be built on Dataflow (its API, roles and Beam flags are then planned)."""
        return self.shuffle and self.shuffle_runner != "local"

    @property
    def processes_per_worker(self) -> int:
        if self.worker_processes:
            return self.worker_processes
        return 4 * self.worker_gpu_count if self.worker_gpu else 8

    def worker_machine_type(self) -> str:
        if self.worker_machine:
            return self.worker_machine
        return GPU_KINDS[self.worker_gpu].machines[self.worker_gpu_count] if self.worker_gpu else "c2d-standard-16"

    def trainer_machine_type(self) -> str:
        if self.trainer_machine:
            return self.trainer_machine
        return GPU_KINDS[self.trainer_gpu].machines[self.trainer_gpu_count] if self.trainer_gpu else "n2-standard-16"


def root_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` (the root's text after ``gs://BUCKET/``) cannot name a deployment's run, or None."""
    if len(prefix) > ROOT_PREFIX_MAX:
        return f"the run after the bucket is {len(prefix)} characters, more than {ROOT_PREFIX_MAX}"
    if prefix and not ROOT_PREFIX.fullmatch(prefix):
        return (
            "the run after the bucket may hold only letters, digits and _.- in '/'-separated segments "
            "(it travels in instance metadata and the VMs' environment file)"
        )
    try:
        validate_prefix(prefix)  # no '.' or '..' segment, no temp-file marker
    except ValueError as exc:
        return str(exc)
    return None


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1``."""
    return zone.rsplit("-", 1)[0]


def split_root(root: str) -> tuple[str, str]:
    """``gs://bucket/run/x`` -> ('bucket', 'run/x')."""
    bucket, _, prefix = root.removeprefix("gs://").partition("/")
    return bucket, prefix.strip("/")

"""Where each accelerator exists, and how each TPU generation runs TensorFlow: one dated table.

Accelerators exist only in some zones, and a plan that asks for one elsewhere fails half-way, after the
bucket and accounts are made.  So `operations.deploy.config.DeployConfig` refuses, before printing
anything, a TPU type that `TPU_GENERATIONS` does not list in its role's zone, naming the zones that
have it (``zone_problem``).  GPU types have no table (each is offered in dozens of zones, and a
partial table would refuse good ones).  Tables age, so ``--no-check-zones`` trusts the zone instead,
and every generated script asks gcloud again, live, before it creates anything there
(`operations.deploy.vms.accelerator_check`).

A TPU VM boots a *software version* (``--runtime-version``).  The plan boots its generation's base image,
the one Google's own TensorFlow TPU tests boot, and operations/vm/install.sh installs the tensorflow-tpu that
setup.py pins (with libtpu, looked up also in Google's libtpu index, as those tests install it:
`TF_INSTALL_SOURCE`).  That TensorFlow finds the TPU only when PJRT_DEVICE, NEXT_PLUGGABLE_DEVICE_USE_C_API and
TF_PLUGGABLE_DEVICE_LIBRARY_PATH (its libtpu) are set before it is imported (`TF_PJRT_SOURCE`).
operations/vm/run-role.sh exports exactly that environment for every role on a TPU VM, read from this table
with ``python -m operations.deploy.zones environment GEN``.  A generation the table does not have has no
tested TensorFlow path and is refused by the plan; the generated script asks gcloud, live, whether the zone
offers the image (`operations.deploy.vms.accelerator_check`).

Nothing here reaches Google: the table is read from the pages below on the date `AS_OF`;
docs/deploy.md says what each page gave.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys

AS_OF = "2026-11"
"""When the table below was read from the pages it cites."""

TPU_ZONES_SOURCE = "https://cloud.google.com/tpu/docs/regions-zones"
TPU_RUNTIMES_SOURCE = "https://cloud.google.com/tpu/docs/runtimes"
TF_PJRT_SOURCE = (
    "the Keras-RS example 'DistributedEmbedding using TPU SparseCore and TensorFlow' "
    "(keras.io/keras_rs/examples, 2025-09-02: tensorflow-tpu on TPU v5p and v6e)"
)

TF_INSTALL_SOURCE = (
    "Google's TensorFlow TPU tests (github.com/GoogleCloudPlatform/ml-auto-solutions, "
    "dags/solutions_team/configs/tensorflow/common.py install_tf: pip install tensorflow-tpu==X.Y.Z "
    "-f https://storage.googleapis.com/libtpu-tf-releases/index.html, on the base images of dags/vm_resource.py)"
)
LIBTPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
"""Google's index of libtpu builds for TensorFlow (operations/vm/install.sh adds it for a TPU VM)."""

UBUNTU_BASE = "tpu-ubuntu2204-base"
"""The base image the runtime page lists for v2, v3 and v4 (Ubuntu 22.04, no framework)."""

LIBTPU = "{libtpu}"
"""Stands for the libtpu.so of the Python that runs the role; resolved on the VM (`environment`)."""

PJRT_ENVIRONMENT = (
    ("PJRT_DEVICE", "TPU"),
    ("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true"),
    ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", LIBTPU),
)
"""What a pip-installed tensorflow-tpu on the PJRT runtime needs before ``import tensorflow``."""

SINGLE_HOST_SIZE = 8
"""The largest accelerator-type size (``-8``) that is one TPU VM in every generation here: v2-8,
v3-8, v4-8 and v5p-8 count TensorCores (one host), v5litepod-8 and v6e-8 count chips (one host).
A larger slice spans several hosts, each running the start-up script; the trainer is one process."""


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """How the plan runs the trainer on one TPU generation (all as documented on `AS_OF`)."""

    zones: tuple[str, ...]
    """Multi-tenant zones that offer it (`TPU_ZONES_SOURCE`); AI zones where the page lists them."""
    runtime: str
    """The base software version the TPU VM boots (`TPU_RUNTIMES_SOURCE`; `TF_INSTALL_SOURCE` boots the same)."""
    environment: tuple[tuple[str, str], ...]
    """Set before TensorFlow is imported, by operations/vm/run-role.sh (`TF_PJRT_SOURCE`)."""
    documented_by: tuple[str, ...]


_PAGES = (TPU_ZONES_SOURCE, TPU_RUNTIMES_SOURCE, TF_INSTALL_SOURCE, TF_PJRT_SOURCE)
TPU_GENERATIONS = {
    # v2-8 is in us-central1-b and -c only, larger v2 slices in us-central1-a: the live check tells those apart.
    "v2": TpuGeneration(
        ("us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a", "asia-east1-c"),
        UBUNTU_BASE,
        PJRT_ENVIRONMENT,
        _PAGES,
    ),
    "v3": TpuGeneration(("us-central1-a", "us-central1-b", "europe-west4-a"), UBUNTU_BASE, PJRT_ENVIRONMENT, _PAGES),
    "v4": TpuGeneration(("us-central2-b",), UBUNTU_BASE, PJRT_ENVIRONMENT, _PAGES),
    "v5litepod": TpuGeneration(
        ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
        "v2-alpha-tpuv5-lite",
        PJRT_ENVIRONMENT,
        _PAGES,
    ),
    "v5p": TpuGeneration(("us-central1-a", "us-east5-a"), "v2-alpha-tpuv5", PJRT_ENVIRONMENT, _PAGES),
    # us-central1-ai1 and us-south1-ai1b are AI zones (the page lists them for v6e since 2026).
    "v6e": TpuGeneration(
        (
            "us-central1-ai1",
            "us-central1-b",
            "us-east1-d",
            "us-east5-a",
            "us-east5-b",
            "us-south1-ai1b",
            "europe-west4-a",
        ),
        "v2-alpha-tpuv6e",
        PJRT_ENVIRONMENT,
        _PAGES,
    ),
}
"""TPU generation (the accelerator type without its ``-<size>``) -> zones, runtime, environment, pages.

Only the rows read on the zones page are here: its North American and
European tables (its other regions' rows could not be read from here), so a
TPU in an Asian zone, say, is refused until ``--no-check-zones``, after which
the script's live check still asks gcloud.  A generation that is not here
(TPU7x, say, which the page lists for the Compute Engine API only) has no
TensorFlow path documented by `TPU_RUNTIMES_SOURCE` and is refused."""

GPU_ZONES_SOURCE = "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones"
GPU_ZONES: dict[str, tuple[str, ...]] = {}
"""NVIDIA GPU type -> the zones that offer it.  Empty on purpose (see the module docstring): every
GPU type is checked live only, by the generated script, before its VM is created."""

_TPU_TYPE = re.compile(r"(v[0-9][a-z0-9]*)-([0-9]+)")


def tpu_generation(tpu_type: str) -> str | None:
    """``v5litepod-8`` -> ``v5litepod``; None when the text is not a TPU type."""
    match = _TPU_TYPE.fullmatch(tpu_type)
    return match.group(1) if match else None


def tpu_size(tpu_type: str) -> int:
    """``v5litepod-8`` -> 8 (chips or TensorCores, by generation); 0 when the text is not a TPU type."""
    match = _TPU_TYPE.fullmatch(tpu_type)
    return int(match.group(2)) if match else 0


def generation_of(tpu_type: str) -> TpuGeneration | None:
    return TPU_GENERATIONS.get(tpu_generation(tpu_type) or "")


def tpu_runtime(tpu_type: str) -> str | None:
    """The software version a TPU of this type boots, or None for a generation not in the table."""
    generation = generation_of(tpu_type)
    return generation.runtime if generation else None


def known_tpu_generations() -> str:
    return "known: " + ", ".join(TPU_GENERATIONS)


def tpu_problem(tpu_type: str) -> str | None:
    """Why the plan cannot train on this TPU type (no documented TensorFlow path, or several hosts), or None."""
    if generation_of(tpu_type) is None:
        return (
            f"no tested TensorFlow path for {tpu_generation(tpu_type) or tpu_type!r}: operations/deploy/zones.py "
            f"lists the generations whose base image {TPU_RUNTIMES_SOURCE} gives as of {AS_OF} "
            f"({known_tpu_generations()})"
        )
    if tpu_size(tpu_type) > SINGLE_HOST_SIZE:
        return (
            f"{tpu_type} is a multi-host slice (the -pod runtimes): each host would run its own trainer; "
            f"choose a single-host type of at most -{SINGLE_HOST_SIZE}, e.g. "
            f"{tpu_generation(tpu_type)}-{SINGLE_HOST_SIZE}"
        )
    return None


def zone_problem(kind: str, accelerator: str, zone: str) -> str | None:
    """Why ``zone`` cannot host ``accelerator`` (``kind`` 'tpu' or 'gpu') by the tables, or None.

    A type the table does not know is not refused here (the live check in the
    script decides); a known type in a zone the table does not list is.
    """
    if kind == "tpu":
        generation = tpu_generation(accelerator)
        row = TPU_GENERATIONS.get(generation or "")
        zones, source = (row.zones if row else None), TPU_ZONES_SOURCE
    else:
        generation, source = accelerator, GPU_ZONES_SOURCE
        zones = GPU_ZONES.get(accelerator)
    if zones is None or zone in zones:
        return None
    return (
        f"{zone} has no {accelerator} ({generation} is in {', '.join(zones)}, by {source} as of {AS_OF}); "
        "choose one of those zones, or --no-check-zones if Google has added this one since"
    )


def libtpu_path() -> str | None:
    """The libtpu.so of the Python running this (the pinned libtpu package), found without importing it."""
    spec = importlib.util.find_spec("libtpu")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")
    return path if os.path.isfile(path) else None


def environment(generation: str) -> dict[str, str]:
    """The environment a role needs on a TPU VM of ``generation`` (table row, libtpu resolved here).

    Raises ValueError naming what is missing: an unknown generation, or no
    libtpu in this Python (install.sh --accelerator tpu installs it).
    """
    row = TPU_GENERATIONS.get(generation)
    if row is None:
        raise ValueError(
            f"TPU generation {generation!r} is not in operations/deploy/zones.py ({known_tpu_generations()})"
        )
    values = dict(row.environment)
    if LIBTPU in values.values():
        library = libtpu_path()
        if library is None:
            raise ValueError(
                f"no libtpu.so in this Python's libtpu package ({sys.executable}): "
                "operations/vm/install.sh --accelerator tpu installs the one setup.py pins"
            )
        values = {name: library if value == LIBTPU else value for name, value in values.items()}
    return values


def main(argv: list[str]) -> int:
    """``python -m operations.deploy.zones environment GEN``: print KEY=VALUE lines (operations/vm/run-role.sh
    exports them)."""
    if len(argv) != 2 or argv[0] != "environment":
        print(
            "usage: python -m operations.deploy.zones environment GENERATION  (prints the TensorFlow environment "
            "of a TPU generation, one KEY=VALUE a line)",
            file=sys.stderr,
        )
        return 2
    try:
        values = environment(argv[1])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, value in values.items():
        print(f"{name}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Where each accelerator exists, and which runtime each TPU generation boots: dated tables from Google's docs.

Accelerators exist only in some zones (v4 TPUs in one), and a plan that asks
for one elsewhere fails half-way, after the bucket and accounts are made.  So
`cloud.deploy.config.DeployConfig` refuses, before printing anything, a TPU
type that the table below does not list in its role's zone, naming the zones
that have it (``zone_problem``).  GPU types have no table (Google offers each
in dozens of zones, and a partial table would refuse good ones): they are
checked live only.  Tables age: Google adds zones, so
``--no-check-zones`` trusts the zone instead, and every generated script asks
gcloud again, live, before it creates anything there
(`cloud.deploy.plan.accelerator_check`).

TPU runtimes: a TPU VM boots a *software version* (``gcloud compute tpus
tpu-vm create --version``) that must match the TPU's generation.  Google's
runtime page gives ``tpu-ubuntu2204-base`` for v2, v3 and v4 only; v5e, v5p and
v6e boot their own ``v2-alpha-tpuv*`` base images.  For TensorFlow it also
names images with TensorFlow installed (``tpu-vm-tf-x.y.z[-pod][-pjrt]``), but
those carry the TensorFlow of their name, and zerolake pins the last
tensorflow-tpu release (setup.py: 2.20, with the libtpu it names) for every
TPU; so the plan boots the generation's base image and install.sh installs the
pinned tensorflow-tpu from PyPI, the same on every generation.  Nothing here
reaches Google: the tables are read from the documentation on the date below.
"""
from __future__ import annotations

import re

AS_OF = "2026-11"
"""When the tables below were read from the pages they cite."""

TPU_ZONES_SOURCE = "https://cloud.google.com/tpu/docs/regions-zones"
TPU_ZONES = {
    # Multi-tenant zones only (the page also lists single-tenant and AI zones, which need a reservation).
    # v2-8 is in us-central1-b and -c only, larger v2 slices in us-central1-a: the live check tells those apart.
    "v2": ("us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a", "asia-east1-c"),
    "v3": ("us-central1-a", "us-central1-b", "europe-west4-a"),
    "v4": ("us-central2-b",),
    "v5litepod": ("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a"),
    "v5p": ("us-central1-a", "us-east5-a"),
    "v6e": ("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b", "europe-west4-a"),
}
"""TPU generation (the accelerator type without its ``-<chips>`` size) -> the zones that offer it.

Only the rows read on the page are here: its North American and European
tables (its other regions' rows could not be read from here), so a TPU in an
Asian zone, say, is refused until ``--no-check-zones``, after which the
script's live check still asks gcloud."""

TPU_RUNTIMES_SOURCE = "https://cloud.google.com/tpu/docs/runtimes"
TPU_RUNTIMES = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
"""TPU generation -> the base software version it boots (install.sh then installs tensorflow-tpu)."""

GPU_ZONES_SOURCE = "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones"
GPU_ZONES: dict[str, tuple[str, ...]] = {}
"""NVIDIA GPU type -> the zones that offer it.  Empty on purpose (see the module docstring): every
GPU type is checked live only, by the generated script, before its VM is created."""

_TPU_TYPE = re.compile(r"(v[0-9][a-z0-9]*)-[0-9]+")


def tpu_generation(tpu_type: str) -> str | None:
    """``v5litepod-8`` -> ``v5litepod``; None when the text is not a TPU type."""
    match = _TPU_TYPE.fullmatch(tpu_type)
    return match.group(1) if match else None


def tpu_runtime(tpu_type: str) -> str | None:
    """The base software version a TPU of this type boots, or None for a generation not in the table."""
    return TPU_RUNTIMES.get(tpu_generation(tpu_type) or "")


def known_tpu_generations() -> str:
    return "known: " + ", ".join(TPU_RUNTIMES)


def zone_problem(kind: str, accelerator: str, zone: str) -> str | None:
    """Why ``zone`` cannot host ``accelerator`` (``kind`` 'tpu' or 'gpu') by the tables, or None.

    A type the table does not know is not refused here (the live check in the
    script decides); a known type in a zone the table does not list is.
    """
    if kind == "tpu":
        generation, table, source = tpu_generation(accelerator), TPU_ZONES, TPU_ZONES_SOURCE
    else:
        generation, table, source = accelerator, GPU_ZONES, GPU_ZONES_SOURCE
    zones = table.get(generation or "")
    if zones is None or zone in zones:
        return None
    return (f"{zone} has no {accelerator} ({generation} is in {', '.join(zones)}, by {source} as of {AS_OF}); "
            "choose one of those zones, or --no-check-zones if Google has added this one since")

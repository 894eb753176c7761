"""A release: the sdist repacked so that its bytes, and so its sha256, depend only on its content.

The deploy plan uploads each release once, create-only, to
``gs://BUCKET/zerolake-deploy/<name>/releases/<sha256>.tar.gz`` and writes that
sha256 into every VM's metadata (``zerolake-release-sha256``); the VM's start-up
script refuses a package whose sha256 differs.  ``setup.py sdist`` stamps file
times and owners into the archive and the time into its gzip header, so two
builds of one checkout would be two releases, and a rerun of ``plan`` (to add a
worker, say) would meet a "different" release than the one the deployment runs.
`repack` writes the same members with fixed times, owners and order, so one
source is one release.

    python -m operations.deploy.release DIST_DIR

finds the one ``zerolake-*.tar.gz`` that ``setup.py sdist`` left in DIST_DIR,
writes ``DIST_DIR/release.tar.gz`` and prints its sha256 (the plan's shell
reads it into ``$zerolake_release``).  Exit 2 with one line when DIST_DIR does
not hold exactly one sdist.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import pathlib
import sys
import tarfile

RELEASE_FILE = "release.tar.gz"
SHA256_HEX = 64


def repack(sdist: pathlib.Path, out: pathlib.Path) -> str:
    """Write ``sdist``'s members to ``out`` in name order with fixed metadata; return out's sha256 (hex)."""
    buffer = io.BytesIO()
    with (
        tarfile.open(sdist, "r:gz") as source,
        tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in sorted(source.getmembers(), key=lambda m: m.name):
            clean = tarfile.TarInfo(member.name)
            clean.type, clean.linkname, clean.size = member.type, member.linkname, member.size
            # Only the executable bit matters to the VMs (startup.sh runs the unpacked scripts).
            clean.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
            clean.mtime, clean.uid, clean.gid, clean.uname, clean.gname = 0, 0, 0, "", ""
            target.addfile(clean, source.extractfile(member) if member.isfile() else None)
    with open(out, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped:
        zipped.write(buffer.getvalue())
    return sha256_of(out)


def sha256_of(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m operations.deploy.release DIST_DIR", file=sys.stderr)
        return 2
    dist = pathlib.Path(argv[0])
    found = sorted(dist.glob("zerolake-*.tar.gz"))
    if len(found) != 1:
        print(
            f"error: {dist} holds {len(found)} zerolake-*.tar.gz sdists, not one: build the release from a fresh "
            "folder",
            file=sys.stderr,
        )
        return 2
    print(repack(found[0], dist / RELEASE_FILE))
    return 0


if __name__ == "__main__":
    sys.exit(main())

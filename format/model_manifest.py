"""The model manifest, ``models/<gen>/MANIFEST.json`` (format/SPEC.md, "Model manifest"): each file of a
published generation with its sha256 and size, and the trainer's metadata.

format.registry writes it with `ModelManifest.to_bytes` after the files, and reads it with
`ModelManifest.from_bytes` (`parse_model_manifest`); a damaged one is a ManifestError
(format.documents) naming the object and the field.
"""

from __future__ import annotations

import dataclasses
import json
import re

from format import schema
from format.documents import ManifestError, check_numbers, json_object

MODEL_MANIFEST_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ModelFile:
    """One file of a published model: its sha256 (64 hex digits) and size in bytes."""

    sha256: str
    size: int


@dataclasses.dataclass(frozen=True)
class ModelManifest:
    """A published generation's manifest, ``models/<gen>/MANIFEST.json`` (format/SPEC.md, "Model
    manifest"): the one owner of its schema.

    ``files`` maps each file's '/'-separated path inside the model folder to
    its ModelFile; ``metadata`` is the whole record the trainer wrote
    (board_size, global_step, network, the int8 copy's figures, ...), which
    readers may show but the format only requires board_size of (the
    `board_size` property).  The registry writes it with `to_bytes` after the
    files and reads it with `from_bytes`.
    """

    generation: int
    files: dict
    metadata: dict

    @property
    def board_size(self) -> int:
        """The network's board (``metadata.board_size``, checked by `parse_model_manifest`)."""
        return self.metadata["board_size"]

    @property
    def input_planes(self) -> int:
        """The network's input width, 17 or 22 (`model_input_planes`)."""
        return model_input_planes(self.metadata)

    def to_bytes(self) -> bytes:
        document = {
            "version": MODEL_MANIFEST_VERSION,
            "generation": self.generation,
            "files": {path: {"sha256": f.sha256, "size": f.size} for path, f in self.files.items()},
            "metadata": self.metadata,
        }
        return json.dumps(document, indent=2, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, generation: int, url: str) -> "ModelManifest":
        return parse_model_manifest(data, generation, url)


_SHA256 = re.compile(r"[0-9a-f]{64}")


def model_input_planes(metadata: dict) -> int:
    """A model's input width, 17 or 22, from its manifest's ``metadata.feature_set_planes``
    (checked by `parse_model_manifest`; 17 when absent: every model before liberty planes)."""
    return int(metadata.get("feature_set_planes", schema.BASIC_INPUT_PLANES))


def parse_model_manifest(data: bytes, generation: int, url: str) -> ModelManifest:
    """Validate a model manifest (``{"version", "generation", "files", "metadata"}``); ManifestError
    names the object and the field (a file entry by its name)."""
    document = json_object(data, url)
    if document.get("version") != MODEL_MANIFEST_VERSION:
        raise ManifestError(
            url, "version", f"is {document.get('version')!r}; this reader knows version {MODEL_MANIFEST_VERSION}"
        )
    if document.get("generation") != generation:
        raise ManifestError(url, "generation", f"is {document.get('generation')!r}, expected {generation}")
    if not isinstance(document.get("files"), dict) or not document["files"]:
        raise ManifestError(url, "files", "must map file names to {sha256, size}")
    files = {}
    for relative, entry in document["files"].items():
        if not relative or relative.startswith("/") or any(part in ("", ".", "..") for part in relative.split("/")):
            raise ManifestError(url, "files", f"names a file {relative!r} outside the model's folder")
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256.fullmatch(entry["sha256"])
            or not isinstance(entry.get("size"), int)
            or isinstance(entry["size"], bool)
            or entry["size"] < 0
        ):
            raise ManifestError(url, f"files.{relative}", 'must be {"sha256": 64 hex digits, "size": int >= 0}')
        files[relative] = ModelFile(entry["sha256"], entry["size"])
    metadata = document.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("board_size"), int):
        raise ManifestError(url, "metadata", "must be an object with an int board_size")
    if not schema.MIN_BOARD_SIZE <= metadata["board_size"] <= schema.MAX_BOARD_SIZE:
        raise ManifestError(
            url,
            "metadata.board_size",
            f"{metadata['board_size']} is outside {schema.MIN_BOARD_SIZE}..{schema.MAX_BOARD_SIZE}",
        )
    planes = metadata.get("feature_set_planes", schema.BASIC_INPUT_PLANES)
    if planes not in schema.INPUT_PLANE_CHOICES or isinstance(planes, bool):
        raise ManifestError(
            url,
            "metadata.feature_set_planes",
            f"is {planes!r}; a model takes one of {schema.INPUT_PLANE_CHOICES} input planes",
        )
    check_numbers(document, url)
    return ModelManifest(generation=generation, files=files, metadata=metadata)

"""Typed access to ``tf.train.Example`` features, shared by both record kinds.

`format.game_records` and `format.position_records` write features with
:func:`set_int64` / :func:`set_float` / :func:`set_bytes` and read them back
through :class:`FeatureReader`, which checks each feature's presence, kind
and length and raises :class:`FormatError` naming the source and the field.
"""

from __future__ import annotations

import builtins

import numpy as np

from format import schema
from format.example_proto import Example


class FormatError(ValueError):
    """A record does not satisfy format/SPEC.md.

    ``source`` names the file (and record), ``field`` the offending field
    (``None`` for framing or compression damage).
    """

    def __init__(self, source: str, field: str | None, problem: str):
        self.source, self.field, self.problem = source, field, problem
        where = f"field '{field}'" if field else "framing"
        super().__init__(f"{source}: {where}: {problem}")


# SetInParent(): an empty list must still mark which kind the feature is, or
# readers (ours and tf.io.parse_example) see a feature of no type.
def set_int64(example, name, values):
    kind = example.features.feature[name].int64_list
    kind.SetInParent()
    kind.value.extend(np.asarray(values, dtype=np.int64).ravel().tolist())


def set_float(example, name, values):
    kind = example.features.feature[name].float_list
    kind.SetInParent()
    kind.value.extend(np.asarray(values, dtype=np.float32).ravel().tolist())


def set_bytes(example, name, value: bytes):
    example.features.feature[name].bytes_list.value.append(value)


class FeatureReader:
    """Typed, validated access to one parsed Example's features."""

    def __init__(self, example, source: str):
        self.features = example.features.feature
        self.source = source

    def error(self, field, problem):
        return FormatError(self.source, field, problem)

    def _feature(self, name, kind):
        if name not in self.features:
            raise self.error(name, "is missing")
        feature = self.features[name]
        if feature.WhichOneof("kind") != kind:
            raise self.error(name, f"has type {feature.WhichOneof('kind')}, expected {kind}")
        return getattr(feature, kind).value

    def ints(self, name) -> np.ndarray:
        return np.asarray(self._feature(name, "int64_list"), dtype=np.int64)

    def int(self, name) -> int:
        values = self._feature(name, "int64_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return int(values[0])

    def float(self, name) -> float:
        values = self._feature(name, "float_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return float(values[0])

    def floats(self, name) -> np.ndarray:
        return np.asarray(self._feature(name, "float_list"), dtype=np.float32)

    def bytes(self, name) -> bytes:
        values = self._feature(name, "bytes_list")
        if len(values) != 1:
            raise self.error(name, f"has {len(values)} values, expected 1")
        return values[0]

    def text(self, name) -> str:
        try:
            return self.bytes(name).decode()
        except UnicodeDecodeError:
            raise self.error(name, "is not UTF-8 text") from None

    def header(self, version_field, size_field) -> tuple[builtins.int, builtins.int]:  # int: the method above
        version = self.int(version_field)
        if version not in schema.SUPPORTED_VERSIONS:
            raise self.error(
                version_field,
                f"unknown format version {version} (this reader knows {sorted(schema.SUPPORTED_VERSIONS)})",
            )
        size = self.int(size_field)
        if not schema.MIN_BOARD_SIZE <= size <= schema.MAX_BOARD_SIZE:
            raise self.error(size_field, f"impossible board size {size}")
        return version, size


def parse_example(data: bytes, source: str):
    example = Example()
    try:
        example.ParseFromString(data)
    except Exception as exc:  # protobuf raises DecodeError (message varies by backend)
        raise FormatError(source, None, f"not a tf.train.Example ({exc})") from None
    return example

"""What every JSON document of the lake shares: its size bounds, its error, and the value rules its readers apply.

A lake document is a JSON object stored at a path `format.layout` names: a window manifest
(format.window_manifest), a model manifest (format.model_manifest), a settings record
(format.settings_record), and the small records (run.json, models/LATEST, leases, claims, the
loop's budget).  Each kind has one validating reader; a damaged or foreign document is refused with a `ManifestError`
that names the object and the field, the same way everywhere.  Readers refuse an object past its
kind's bound (MAX_DOCUMENT_BYTES, MAX_POINTER_BYTES) before reading it whole.
"""

from __future__ import annotations

import math

from format import lake_json

MAX_DOCUMENT_BYTES = 64 << 20
"""The most a JSON document of the lake may hold (window and model manifests,
settings records): a window manifest lists its games at ~40 bytes each, so this
is some 1.5M games.  Readers refuse a larger object before reading it whole."""


MAX_POINTER_BYTES = 64 << 10
"""The most a small record may hold: run.json, models/LATEST, the trainer's
lease and window claims (each a few hundred bytes)."""


def too_large(max_bytes: int) -> str:
    """What a reader says of a document past its bound (after the object's URL)."""
    return lake_json.too_large(max_bytes)


class ManifestError(ValueError):
    """A manifest is missing, unreadable or not what its reader expects.

    ``url`` names the object, ``field`` the offending field ('' for the file
    as a whole); the message says both.
    """

    def __init__(self, url: str, field: str, problem: str):
        where = f"{url}: field '{field}'" if field else url
        super().__init__(f"{where}: {problem}")
        self.url = url
        self.field = field


def shown(value) -> str:
    """``value`` as an error message shows it: repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:36] + "..."


def printable(text: str) -> str:
    """``text`` safe to print on a terminal line: each control or format character (a newline, an
    escape sequence's ESC, a bidi override) as its Python escape.  Lake text may come from any
    account that can write the lake; raw, it could set a window title or a clipboard."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


MAX_DOCUMENT_NUMBER = 2**53
"""No number in a lake document is larger in magnitude (the last integer a
JSON reader's double holds exactly)."""


def document_value(value, kinds, fail, at_least: int | None = None):
    """``value``, read from a field of a lake document, if it is of one of the field's ``kinds``;
    otherwise raises ``fail(problem)``, the reader's own error naming the document and field.

    The one rule every document owner in format/ applies: a bool is no number; an int
    stands for a float (and comes back as one); a number is finite and at most
    MAX_DOCUMENT_NUMBER in magnitude; an int is at least ``at_least`` when given; a text
    holds no control character (what readers print must not reach a terminal as escapes).
    """
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # An int is compared as it is: a JSON integer of 400 digits overflows float() and isfinite().
    in_range = number and abs(value) <= MAX_DOCUMENT_NUMBER and (isinstance(value, int) or math.isfinite(value))
    if in_range and float in kinds and isinstance(value, int):
        value = float(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or (number and not in_range)
        or (number and at_least is not None and isinstance(value, int) and value < at_least)
    ):
        names = " or ".join("null" if kind is type(None) else kind.__name__ for kind in kinds)
        bound = f" >= {at_least}" if at_least is not None and int in kinds else ""
        raise fail(f"is {shown(value)}, expected {names}{bound}")
    if isinstance(value, str) and not value.isprintable():
        raise fail(f"is {shown(value)}, a text with a control character")
    return value


def required_field(document: dict, name: str, kinds, url: str):
    """``document[name]`` checked as `document_value` checks it; a ManifestError naming ``url`` and the
    field when it is missing or not of ``kinds``."""
    if name not in document:
        raise ManifestError(url, name, "is missing")
    return document_value(document[name], kinds, lambda problem: ManifestError(url, name, problem))


def check_numbers(value, url: str, where: str = "") -> None:
    """Every number anywhere in a document is finite and at most MAX_DOCUMENT_NUMBER
    in magnitude (Python's json reads NaN and Infinity; statistics are nested)."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_numbers(item, url, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_numbers(item, url, f"{where}[{index}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (abs(value) <= MAX_DOCUMENT_NUMBER and (isinstance(value, int) or math.isfinite(value))):
            raise ManifestError(
                url,
                where,
                f"is {value}, not a number a lake document holds "
                f"(finite, at most {MAX_DOCUMENT_NUMBER:,} in magnitude)",
            )


def json_object(data: bytes, url: str) -> dict:
    try:
        document = lake_json.parse(data, MAX_DOCUMENT_BYTES)
    except lake_json.NotADocument as exc:
        raise ManifestError(url, "", str(exc)) from None
    if not isinstance(document, dict):
        raise ManifestError(url, "", "is not a JSON object")
    return document

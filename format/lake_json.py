"""Parsing a lake document's JSON: the one step from a document's bytes to its values.

A lake document (run.json, a lease or window claim, a window or model
manifest, a settings record, a loop record, the ladder's ratings and chunk
counts) was written by another process, maybe on another machine, and is read
by roles that must not die of it.  Data flows: the reader reads the object
within its size bound (`format.documents.MAX_POINTER_BYTES` or
`MAX_DOCUMENT_BYTES`) -> `parse` -> the value, which the reader then checks
field by field.  `parse` refuses, as `NotADocument` with a reason and no
object name:

* bytes past the reader's bound (a document handed over as bytes is held to
  the bound its object read is);
* text that is not JSON or not UTF-8 (json's ValueError);
* arrays or objects nested more than `MAX_DEPTH` levels.  Past Python's
  recursion limit (some 1,000 levels, which 3,000 ``[`` in 6 KB reach) json
  raises RecursionError, a RuntimeError that no reader caught, so a trainer,
  shuffle job or run page died with a traceback; a document just inside it
  would still exhaust the stack of a reader that walks it recursively.

The reader puts the object's name in front (``f"{url}: {exc}"``) and raises
its own kind of error, so damage is one line naming the object.
"""

from __future__ import annotations

import json

MAX_DEPTH = 64
"""The deepest nesting of arrays and objects a lake document may have (the lake's own nest a few levels)."""


class NotADocument(ValueError):
    """Bytes that are no JSON document within the bound; the text says why, without naming the object."""


def too_large(max_bytes: int) -> str:
    """What a reader says of a document past its bound (after the object's URL; `format.documents.too_large`)."""
    return f"is larger than {max_bytes:,} bytes, the most a document of its kind holds; not read"


def parse(data: bytes | str, max_bytes: int):
    """The JSON value of ``data``, a document of at most ``max_bytes`` bytes; NotADocument otherwise."""
    if len(data) > max_bytes:
        raise NotADocument(too_large(max_bytes))
    deep = NotADocument(
        f"not valid JSON (arrays or objects nested too deeply: a lake document nests at most {MAX_DEPTH} levels)"
    )
    try:
        value = json.loads(data)
    except RecursionError:
        raise deep from None
    except ValueError as exc:  # UnicodeDecodeError is a ValueError too
        raise NotADocument(f"not valid JSON ({exc})") from None
    if _deeper_than(value, MAX_DEPTH):
        raise deep
    return value


def _deeper_than(value, depth: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``depth`` levels (walked without recursion)."""
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        if level > depth:
            return True
        pending.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return False

"""The settings record, ``loop/settings/<run_id>.json`` or ``cluster/settings/<run_id>.json``: one launcher
invocation's full settings, written once at start (operations.roles.record_settings) and read back
by tools (`parse_settings_record`; a damaged one is a ManifestError of format.documents).
"""

from __future__ import annotations

import dataclasses
import json

from format.documents import ManifestError, json_object

SETTINGS_RECORD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class SettingsRecord:
    """One launcher invocation's full settings, ``loop/settings/<run_id>.json`` (or ``cluster/``).

    ``settings`` is every field of the launcher's config (its role configs
    nested), ``argv`` its command line, ``storage_retry`` the retry policy's
    fields (None: the default); ``host`` the machine it ran on.  Written once
    at start by `operations.roles.record_settings` with `to_bytes`."""

    launcher: str
    run_id: str
    started: str
    argv: tuple[str, ...]
    settings: dict
    host: str = ""
    storage_retry: dict | None = None

    def to_bytes(self) -> bytes:
        document = {
            "version": SETTINGS_RECORD_VERSION,
            "launcher": self.launcher,
            "run_id": self.run_id,
            "started": self.started,
            "host": self.host,
            "argv": list(self.argv),
            "settings": self.settings,
            "storage_retry": self.storage_retry,
        }
        return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, url: str) -> "SettingsRecord":
        return parse_settings_record(data, url)


def parse_settings_record(data: bytes, url: str) -> SettingsRecord:
    """Validate a settings record (``{"version", "launcher", "run_id", "started", "argv", "settings"}``)."""
    document = json_object(data, url)
    if document.get("version") != SETTINGS_RECORD_VERSION:
        raise ManifestError(
            url, "version", f"is {document.get('version')!r}; this reader knows version {SETTINGS_RECORD_VERSION}"
        )
    for name, kind in (("launcher", str), ("run_id", str), ("started", str), ("argv", list), ("settings", dict)):
        if not isinstance(document.get(name), kind):
            raise ManifestError(url, name, f"is missing or not {kind.__name__}")
    if not all(isinstance(word, str) for word in document["argv"]):
        raise ManifestError(url, "argv", "must be the command line's words")
    retry = document.get("storage_retry")
    if retry is not None and not isinstance(retry, dict):
        raise ManifestError(url, "storage_retry", "must be the retry policy's fields or null")
    host = document.get("host", "")
    return SettingsRecord(
        launcher=document["launcher"],
        run_id=document["run_id"],
        started=document["started"],
        argv=tuple(document["argv"]),
        settings=document["settings"],
        host=host if isinstance(host, str) else "",
        storage_retry=retry,
    )

"""Stand-ins for scripts/check_vm_boot.sh, run with the checkout's .venv python from the repository root.

  metadata ATTRIBUTES_JSON GUEST_JSON [--port 80]
      A small fake of the Compute Engine metadata server on 127.0.0.1: GET
      /computeMetadata/v1/instance/attributes/<key> answers the attribute from
      ATTRIBUTES_JSON (read at each request, so the check can change it between
      boots), 404 where there is none; PUT .../instance/guest-attributes/<ns>/<key>
      records the value in GUEST_JSON (startup.sh reports zerolake/state there).
      Like the real one it answers only requests with the header
      ``Metadata-Flavor: Google`` (403 otherwise) and sends that header back.
  upload EMULATOR_JSON FILE OBJECT
      Put FILE into the emulator's bucket as OBJECT (replacing it).
  games EMULATOR_JSON LAKE
      One JSON line: the chunks under LAKE's games/ and the game ids they hold.
  journal JOURNAL_DIR SINCE
      One JSON line from the worker's events in the VM's journal (journalctl -D
      JOURNAL_DIR): the game ids of game_finished, and for chunk_uploaded the
      games and time of those after SINCE (unix seconds), the last one's time.
"""
from __future__ import annotations

import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading

PREFIX = "/computeMetadata/v1/instance/"


def serve_metadata(attributes_file: str, guest_file: str, port: int) -> None:
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self, status: int, body: str = "") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _checked(self) -> str | None:
            if self.headers.get("Metadata-Flavor") != "Google":
                self._answer(403, "Missing Metadata-Flavor: Google header\n")
                return None
            return self.path.split("?", 1)[0]

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self._checked()
            if path is None:
                return
            if path.startswith(PREFIX + "attributes/"):
                key = path[len(PREFIX + "attributes/"):]
                attributes = json.loads(pathlib.Path(attributes_file).read_text())
                if key in attributes:
                    return self._answer(200, attributes[key])
            self._answer(404, "not found\n")

        def do_PUT(self) -> None:  # noqa: N802
            path = self._checked()
            if path is None:
                return
            if not path.startswith(PREFIX + "guest-attributes/"):
                return self._answer(404, "not found\n")
            value = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            with lock:
                guest = pathlib.Path(guest_file)
                state = json.loads(guest.read_text()) if guest.exists() else {}
                state[path[len(PREFIX + "guest-attributes/"):]] = value
                guest.write_text(json.dumps(state))
            self._answer(200)

        def log_message(self, fmt, *args) -> None:
            print(f"[metadata] {self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"[metadata] serving on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def _bucket_storage(emulator_json: str, url: str):
    settings = json.loads(pathlib.Path(emulator_json).read_text())
    for key, value in settings.items():
        if key != "BUCKET":
            os.environ[key] = value
    from cloud.storage import open_storage
    return open_storage(url.replace("BUCKET", settings["BUCKET"], 1) if url.startswith("gs://BUCKET") else url)


def upload(emulator_json: str, file: str, name: str) -> None:
    _bucket_storage(emulator_json, "gs://BUCKET").write_replace(name, pathlib.Path(file).read_bytes())


def games(emulator_json: str, lake: str) -> None:
    from format import codec, layout
    storage = _bucket_storage(emulator_json, lake)
    chunks, ids = 0, []
    for item in storage.list(layout.games_prefix()):
        if layout.parse_chunk_path(item.path):
            chunks += 1
            ids += [record.game_id for record in codec.read_chunk(storage.read(item.path), storage.url(item.path))]
    print(json.dumps({"chunks": chunks, "game_ids": ids}))


def journal(directory: str, since: float) -> None:
    out = subprocess.run(["journalctl", "-D", directory, "-o", "json", "--no-pager",
                          "SYSLOG_IDENTIFIER=zerolake-worker-0"], check=True, capture_output=True, text=True).stdout
    finished, uploaded_after, last_upload = [], 0, None
    for line in out.splitlines():
        message = json.loads(line).get("MESSAGE")
        if not isinstance(message, str) or '"zerolake.event"' not in message:
            continue
        try:
            event = json.loads(message)
        except ValueError:
            continue
        if event.get("event") == "game_finished":
            finished.append(event["game_id"])
        elif event.get("event") == "chunk_uploaded" and event["time"] >= since:
            uploaded_after += event.get("games", 0)
            last_upload = max(last_upload or 0.0, event["time"])
    print(json.dumps({"finished": finished, "uploaded_after": uploaded_after, "last_upload": last_upload}))


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "metadata":
        port = int(args[args.index("--port") + 1]) if "--port" in args else 80
        serve_metadata(args[0], args[1], port)
    elif command == "upload":
        upload(*args)
    elif command == "games":
        games(*args)
    elif command == "journal":
        journal(args[0], float(args[1]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

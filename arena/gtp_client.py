"""A small GTP client that drives GNU Go over pipes.

GNU Go is the project's rules referee (tests/engine/test_rules_against_gnugo.py) and a
fixed-strength opponent.  `GnuGo` starts::

    gnugo --mode gtp --chinese-rules --positional-superko --capture-all-dead --level N

and speaks GTP version 2: a command is one line; the reply is ``= text`` on
success or ``? text`` on failure, ended by an empty line.  `send` returns the
text of a success and raises GtpError on a failure; `send_many` writes a whole
batch before reading the replies, which saves one pipe round trip per command
(GTP engines answer strictly in order).

`find_gnugo` looks in PATH, then in /usr/games (where Debian installs it and
which is often not on PATH); if it is absent, GnuGoNotFound says how to
install it (scripts/setup.sh --test).
"""

import os
import shutil
import subprocess
from dataclasses import dataclass

GNUGO_DIRS = ("/usr/games",)
INSTALL_HINT = "install it with scripts/setup.sh --test (Debian package gnugo)"


class GnuGoNotFound(FileNotFoundError):
    """GNU Go is not installed where we look."""


class GtpError(RuntimeError):
    """The engine answered '?' (or died).  `command` and `reply` say which."""

    def __init__(self, command, reply):
        super().__init__(f"GTP command {command!r} failed: {reply}")
        self.command = command
        self.reply = reply


@dataclass(frozen=True)
class GtpReply:
    """One answer: ok is False for '?' replies; text is without the '= '."""

    ok: bool
    text: str


def find_gnugo():
    """Path of the gnugo executable, from PATH or /usr/games."""
    found = shutil.which("gnugo")
    if found:
        return found
    for folder in GNUGO_DIRS:
        candidate = os.path.join(folder, "gnugo")
        if os.access(candidate, os.X_OK):
            return candidate
    raise GnuGoNotFound(f"gnugo not found in PATH or {', '.join(GNUGO_DIRS)}: {INSTALL_HINT}")


class GtpClient:
    """A GTP engine subprocess.  Use as a context manager, or call close()."""

    def __init__(self, argv):
        self.argv = list(argv)
        self._proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
        )

    def send(self, command):
        """Send one command; return its reply text or raise GtpError."""
        reply = self.send_many([command])[0]
        if not reply.ok:
            raise GtpError(command, reply.text)
        return reply.text

    def send_many(self, commands):
        """Send a batch of commands, then read one GtpReply per command."""
        if self._proc.poll() is not None:
            raise GtpError(commands[0] if commands else "", f"engine exited with code {self._proc.returncode}")
        for command in commands:
            if "\n" in command:
                raise ValueError(f"a GTP command is one line, got {command!r}")
        self._proc.stdin.write("".join(command + "\n" for command in commands))
        self._proc.stdin.flush()
        return [self._read_reply(command) for command in commands]

    def _read_reply(self, command):
        lines = []
        while True:
            line = self._proc.stdout.readline()
            if line == "":
                raise GtpError(command, "engine closed its output")
            line = line.rstrip("\r\n")
            if line == "" and lines:
                break
            if line == "" and not lines:
                continue  # tolerate stray blank lines between replies
            lines.append(line)
        head = lines[0]
        if head[:1] not in ("=", "?"):
            raise GtpError(command, f"malformed reply {head!r}")
        first = head[1:].lstrip(" 0123456789") if len(head) > 1 and head[1].isdigit() else head[1:].lstrip()
        text = "\n".join([first] + lines[1:]).strip()
        return GtpReply(head[0] == "=", text)

    def close(self):
        """Ask the engine to quit, then make sure the process is gone."""
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write("quit\n")
                self._proc.stdin.flush()
                self._proc.wait(timeout=5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class GnuGo(GtpClient):
    """GNU Go with Chinese (area) rules and positional superko."""

    def __init__(self, level=1, board_size=None, komi=None, executable=None):
        if not 0 <= int(level) <= 10:
            raise ValueError(f"GNU Go level must be in 0..10, got {level!r}")
        exe = executable or find_gnugo()
        # --capture-all-dead: under Tromp-Taylor scoring every stone left on
        # the board counts, so GNU Go must remove dead stones before it
        # passes (without it, it lost games to uniform random moves).
        super().__init__(
            [
                exe,
                "--mode",
                "gtp",
                "--chinese-rules",
                "--positional-superko",
                "--capture-all-dead",
                "--level",
                str(int(level)),
            ]
        )
        if board_size is not None:
            self.send(f"boardsize {int(board_size)}")
        if komi is not None:
            self.send(f"komi {float(komi)}")
        self.send("clear_board")

"""Run a command where the only network is loopback, and record every connection it attempts.

Used by tests/system/test_no_telemetry.py.  A socket monkeypatch would miss child
processes and native code (OpenVINO's telemetry forks a copy of the process
to send, and its C++ runtime could connect by itself), so the command runs:

* in a new network namespace (``unshare --net``) whose only interface is
  ``lo``: a connection to anywhere else fails at once with ENETUNREACH, so an
  attempt is recorded but no packet ever leaves the machine, even when the
  code under test is wrong;
* under ``strace --follow-forks --trace=connect`` (with a seccomp-bpf filter,
  so only connect(2) stops the process), which logs every connect of the
  command and all its descendants, whatever language made it.

`Attempt` is one logged connect to an IPv4 or IPv6 address; Unix sockets and
netlink are local by construction and not reported.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import re
import shutil
import subprocess

_CONNECT = re.compile(r"^(?P<pid>\d+)\s+connect\(\d+, \{sa_family=(?P<family>AF_INET6?), (?P<fields>[^}]*)\}")
_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")
_ADDRESS = re.compile(r'inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)"')


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One connect(2) to an internet address: who tried, where to."""

    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def missing_tools() -> str | None:
    """None when unshare, ip and strace are installed, else what is missing (scripts/setup.sh --test
    installs them)."""
    absent = [tool for tool in ("unshare", "ip", "strace") if shutil.which(tool) is None]
    return f"not installed: {', '.join(absent)}" if absent else None


def parse_attempts(strace_log: str) -> list[Attempt]:
    """Every IPv4/IPv6 connect in an ``strace -f -e trace=connect`` log."""
    attempts = []
    for line in strace_log.splitlines():
        match = _CONNECT.match(line)
        if not match:
            continue
        port = _PORT.search(match["fields"])
        address = _ADDRESS.search(match["fields"])
        if port and address:
            attempts.append(Attempt(int(match["pid"]), address[1] or address[2], int(port[1])))
    return attempts


def run_offline(command: list[str], log_path: str, **popen_kwargs) -> tuple[subprocess.CompletedProcess,
                                                                             list[Attempt]]:
    """Run ``command`` with loopback as its only network; return (its result, its connection attempts).

    ``popen_kwargs`` go to `subprocess.run` (cwd, env, timeout, capture_output, text...).  Whatever
    the command serves on 127.0.0.1 must be started inside the same call (the namespace is new).
    """
    script = 'ip link set lo up && exec strace -f -qq --seccomp-bpf -e trace=connect -e signal=none -o "$0" -- "$@"'
    result = subprocess.run(["unshare", "--net", "sh", "-c", script, log_path, *command], **popen_kwargs)
    with open(log_path, encoding="utf-8", errors="replace") as log:
        return result, parse_attempts(log.read())

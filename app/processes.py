"""Facts about other processes of this machine: alive, when they started, their command line, and which
one listens on a TCP port (read from /proc on Linux; elsewhere as far as the OS says without a library)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state of a listening socket in /proc/net/tcp
PS_TIMEOUT_S = 5


def alive(pid: int) -> bool:
    """Whether a process with this id runs (a zombie counts as gone)."""
    if pid <= 0:
        return False
    if sys.platform == "win32":
        return _windows_alive(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    stat = _stat_fields(pid)
    return stat is None or stat[0] != "Z"


def start_time(pid: int) -> str | None:
    """When the process started, as an opaque string that a reused pid does not repeat (None: unknown).

    Linux: field 22 of /proc/<pid>/stat (clock ticks since boot); other Unix: `ps -o lstart=`."""
    stat = _stat_fields(pid)
    if stat is not None:
        return stat[19]  # fields from the 3rd on: state is field 3, starttime field 22
    if sys.platform == "win32" or PROC.is_dir():
        return None
    try:
        out = subprocess.run(
            ["ps", "-o", "lstart=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=PS_TIMEOUT_S,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out or None


def command_line(pid: int) -> str:
    """The process's command line, or its name, or "" where the OS does not tell."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        raw = b""
    if raw:
        return " ".join(p.decode("utf-8", "replace") for p in raw.rstrip(b"\0").split(b"\0"))
    try:
        return (PROC / str(pid) / "comm").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PortHolder:
    """A program listening on a port: its pid and command line where the OS tells (else None and "")."""

    port: int
    pid: int | None
    command: str

    def describe(self) -> str:
        """The holder in words: "python3 -m http.server 8080 (pid 1234)", or "another program"."""
        if self.pid is None:
            return "another program"
        command = self.command if len(self.command) <= 80 else self.command[:77] + "..."
        return f"{command or 'a program'} (pid {self.pid})"


def port_holder(port: int) -> PortHolder | None:
    """Who listens on TCP `port` on this machine: None where nobody does (as far as /proc shows); a holder
    without a pid where the OS does not say who (not Linux, or another user's process)."""
    inodes = _listening_inodes(port)
    if inodes is None:  # no /proc/net: the OS does not tell
        return PortHolder(port, None, "")
    if not inodes:
        return None
    for pid_dir in PROC.iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        pid = int(pid_dir.name)
                        return PortHolder(port, pid, command_line(pid))
    return PortHolder(port, None, "")


def _listening_inodes(port: int) -> set[str] | None:
    tables = [PROC / "net" / name for name in ("tcp", "tcp6")]
    if not any(t.is_file() for t in tables):
        return None
    found: set[str] = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its 3rd field on (the name in parentheses may hold spaces), or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def _windows_alive(pid: int) -> bool:
    import ctypes

    synchronize, wait_timeout = 0x00100000, 0x102
    kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(synchronize, False, pid)
    if not handle:
        return False
    try:
        return kernel32.WaitForSingleObject(handle, 0) == wait_timeout
    finally:
        kernel32.CloseHandle(handle)

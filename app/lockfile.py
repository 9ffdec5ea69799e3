"""The engine lock files: one per engine process a window started, in the data dir, naming the process
(pid and start time), its window (the same), its private port and its admin token.

The engine writes its file once its port is bound and removes it when it ends. A file whose engine runs
while its window is gone names a leftover: the next window ends it, but only when the pid, the start
time, the port and the token all match (pids are reused; the token proves the port is that engine's).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from app import paths, processes

FOLDER = "engines"


@dataclass(frozen=True)
class EngineRecord:
    pid: int
    started: str | None  # processes.start_time of the engine
    port: int  # the private listener's
    token: str  # the admin token of that listener
    parent_pid: int  # the window's
    parent_started: str | None

    @classmethod
    def for_this_process(cls, port: int, token: str, parent_pid: int | None = None) -> EngineRecord:
        pid = os.getpid()
        parent = parent_pid if parent_pid is not None else os.getppid()
        return cls(pid, processes.start_time(pid), port, token, parent, processes.start_time(parent))

    @property
    def running(self) -> bool:
        """The engine this file names still runs (the same process: its start time matches)."""
        return processes.alive(self.pid) and processes.start_time(self.pid) == self.started

    @property
    def orphaned(self) -> bool:
        """The window that started the engine has gone (or its pid now names another process)."""
        if not processes.alive(self.parent_pid):
            return True
        return processes.start_time(self.parent_pid) != self.parent_started


def folder() -> Path:
    path = paths.data_dir() / FOLDER
    path.mkdir(parents=True, exist_ok=True)
    return path


def path_of(pid: int) -> Path:
    return folder() / f"{pid}.json"


def write(record: EngineRecord) -> Path:
    """Write the record where only this user can read it (it holds the token)."""
    path = path_of(record.pid)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(asdict(record), out)
    return path


def remove(pid: int) -> None:
    path_of(pid).unlink(missing_ok=True)


def records() -> Iterator[tuple[Path, EngineRecord]]:
    """Every readable lock file and its record; an unreadable one is skipped (it may be half written)."""
    for path in sorted(folder().glob("*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            yield path, EngineRecord(**json.loads(path.read_text(encoding="utf-8")))

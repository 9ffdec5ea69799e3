"""Engines of our own that outlived their window, found through their lock files (app.lockfile) when a
window starts, and ended; and, for a port that is taken, who holds it.

A lock file's engine is ended only when everything matches: its pid runs with the recorded start time,
its window is gone, and its private port answers the recorded admin token (a reused pid, or a port now
held by someone else, is left alone). SIGTERM first, SIGKILL after END_WAIT_MS.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from PySide6.QtCore import QObject, QTimer, QUrl, Signal
from PySide6.QtNetwork import QNetworkAccessManager, QNetworkReply, QNetworkRequest

from app import lockfile, processes

CHECK_TIMEOUT_MS = 10_000
END_WAIT_MS = 10_000
POLL_MS = 200


def port_taken_by(port: int) -> str | None:
    """Who listens on `port`, in words ("another program" where the OS does not say), or None."""
    holder = processes.port_holder(port)
    if holder is None:
        return None
    ours = {r.pid for _, r in lockfile.records()}
    if holder.pid in ours:
        return f"the engine of another Foresight window (pid {holder.pid})"
    return holder.describe()


class LeftoverEngines(QObject):
    """`check()` looks at every lock file and ends the leftovers; `finished` follows once, with what it
    did in words (empty: nothing was left over)."""

    finished = Signal(list)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._manager = QNetworkAccessManager(self)
        self._pending = 0
        self._notes: list[str] = []
        self.running = False

    def check(self) -> None:
        if self.running:
            return
        self.running, self._notes, self._pending = True, [], 0
        for path, record in list(lockfile.records()):
            if not record.running:
                path.unlink(missing_ok=True)  # its engine has ended: the file was left behind
            elif record.orphaned:
                self._pending += 1
                self._ask(path, record)
        if not self._pending:
            QTimer.singleShot(0, self._done)

    def _ask(self, path: Path, record: lockfile.EngineRecord) -> None:
        request = QNetworkRequest(QUrl(f"http://127.0.0.1:{record.port}/admin/public"))
        request.setRawHeader(b"Authorization", f"Bearer {record.token}".encode())
        request.setTransferTimeout(CHECK_TIMEOUT_MS)
        reply = self._manager.get(request)
        reply.finished.connect(lambda: self._answered(reply, path, record))

    def _answered(self, reply: QNetworkReply, path: Path, record: lockfile.EngineRecord) -> None:
        ok = reply.error() == QNetworkReply.NetworkError.NoError
        reply.deleteLater()
        if not ok or not record.running:  # not our engine on that port after all: leave it be
            self._settle()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
        self._wait_for_end(path, record, END_WAIT_MS, killed=False)

    def _wait_for_end(self, path: Path, record: lockfile.EngineRecord, left_ms: int, killed: bool) -> None:
        if not record.running:
            path.unlink(missing_ok=True)
            self._notes.append(
                f"A Foresight engine left running by an earlier window (pid {record.pid}) was ended."
            )
            self._settle()
            return
        if left_ms <= 0:
            if killed or not hasattr(signal, "SIGKILL"):
                self._notes.append(
                    f"A Foresight engine left running by an earlier window (pid {record.pid}) could not be "
                    "ended; it may still hold memory and ports."
                )
                self._settle()
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)
            killed, left_ms = True, END_WAIT_MS
        QTimer.singleShot(POLL_MS, self, lambda: self._wait_for_end(path, record, left_ms - POLL_MS, killed))

    def _settle(self) -> None:
        self._pending -= 1
        if self._pending <= 0:
            self._done()

    def _done(self) -> None:
        self.running = False
        self.finished.emit(list(self._notes))

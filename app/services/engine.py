"""The engine process, supervised from the GUI: start, READY, a bounded log, crash detection, stop.

The GUI never loads a model: it starts `python -m app serve ...` (frozen: `Foresight --engine ...`)
through QProcess on 127.0.0.1 with a port the OS picks, hands it a per-launch admin token on stdin
(never argv), waits for the `READY port=<n>` line, and reports a crash with the last log lines so the
window can offer a restart.
"""

from __future__ import annotations

import collections
import secrets
import sys

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

STOPPED, STARTING, READY, STOPPING, CRASHED = "stopped", "starting", "ready", "stopping", "crashed"
LOG_LINES = 2000
STOP_TIMEOUT_MS = 5000


def engine_command(args: list[str]) -> tuple[str, list[str]]:
    """(program, arguments) that start the engine process, frozen or from source."""
    if getattr(sys, "frozen", False):
        return sys.executable, ["--engine", *args]
    return sys.executable, ["-m", "app", "serve", *args]


def app_command(args: list[str]) -> tuple[str, list[str]]:
    """(program, arguments) of a `python -m app` command (`Foresight <command>` when frozen)."""
    if getattr(sys, "frozen", False):
        return sys.executable, list(args)
    return sys.executable, ["-m", "app", *args]


class AppCommand(QObject):
    """A `python -m app ... --json` command in a child process, killed after `timeout_ms`.

    Device probes load GPU drivers, which may hang or crash: a child keeps that out of the window's
    process. A subclass starts it with `_run` and reads its output in `_result`."""

    def __init__(self, timeout_ms: int, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._proc: QProcess | None = None
        self._timer = QTimer(self, singleShot=True, interval=timeout_ms, timeout=self._timeout)

    @property
    def running(self) -> bool:
        return self._proc is not None

    def _run(self, args: list[str], env: dict[str, str] | None = None) -> None:
        if self._proc is not None:
            return
        program, argv = app_command(args)
        proc = QProcess(self)
        if env:
            environment = QProcessEnvironment.systemEnvironment()
            for key, value in env.items():
                environment.insert(key, value)
            proc.setProcessEnvironment(environment)
        proc.finished.connect(self._finished)
        self._proc = proc
        proc.start(program, argv)
        self._timer.start()

    def _timeout(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    def _finished(self, code: int, _status: QProcess.ExitStatus) -> None:
        proc, self._proc = self._proc, None
        self._timer.stop()
        if proc is None:
            return
        out = bytes(proc.readAllStandardOutput()).decode("utf-8", errors="replace")
        err = bytes(proc.readAllStandardError()).decode("utf-8", errors="replace").strip()
        proc.deleteLater()
        self._result(code, out, err)

    def _result(self, code: int, out: str, err: str) -> None:
        raise NotImplementedError


class EngineProcess(QObject):
    """One engine subprocess. Signals carry state changes, READY, log lines and crashes."""

    stateChanged = Signal(str)
    ready = Signal(int)  # the port
    logLine = Signal(str)
    crashed = Signal(int, str)  # exit code (or -1 when killed by a signal), the last log lines

    def __init__(self, parent: QObject | None = None, log_lines: int = LOG_LINES) -> None:
        super().__init__(parent)
        self.log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self.state = STOPPED
        self.port: int | None = None
        self.token = ""
        self.exit_code: int | None = None
        self._args: list[str] = []
        self._partial = b""
        self._proc: QProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}" if self.port else ""

    @property
    def pid(self) -> int:
        return int(self._proc.processId()) if self._proc is not None else 0

    def start(self, args: list[str]) -> None:
        """Start the engine with model and placement flags (host and port are chosen here)."""
        if self.state in (STARTING, READY, STOPPING):
            raise RuntimeError(f"the engine is {self.state}; stop it first")
        self._args = list(args)
        self.token = secrets.token_urlsafe(32)
        self.port, self.exit_code, self._partial = None, None, b""
        proc = QProcess(self)
        proc.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        env = QProcessEnvironment.systemEnvironment()
        for secret in ("FORESIGHT_ADMIN_TOKEN", "FORESIGHT_API_KEY"):
            env.remove(secret)  # the token goes through stdin; a public API key is set at run time
        env.insert("PYTHONUNBUFFERED", "1")
        proc.setProcessEnvironment(env)
        proc.readyReadStandardOutput.connect(self._read)
        proc.finished.connect(self._finished)
        proc.errorOccurred.connect(self._error)
        self._proc = proc
        flags = ["--host", "127.0.0.1", "--port", "0", "--token-stdin", *self._args]
        program, arguments = engine_command(flags)
        self._set_state(STARTING)
        proc.start(program, arguments)
        proc.write((self.token + "\n").encode())
        proc.closeWriteChannel()

    def restart(self) -> None:
        if self.state in (STARTING, READY):
            self.stop()
        self.start(self._args)

    def stop(self, timeout_ms: int = STOP_TIMEOUT_MS) -> None:
        """Terminate (SIGTERM: the engine finishes cleanly), then kill after the timeout. Blocks."""
        proc = self._proc
        if proc is None or proc.state() == QProcess.ProcessState.NotRunning:
            self._set_state(STOPPED)
            return
        self._set_state(STOPPING)
        proc.terminate()
        if not proc.waitForFinished(timeout_ms):
            self._append(f"the engine did not stop within {timeout_ms / 1000:g} s: killed")
            proc.kill()
            proc.waitForFinished(timeout_ms)

    # --- process events ------------------------------------------------------------------------

    def _read(self) -> None:
        assert self._proc is not None
        data = self._partial + bytes(self._proc.readAllStandardOutput())
        *lines, self._partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            self._append(line)
            if self.state == STARTING and line.startswith("READY port="):
                self.port = int(line.split("=", 1)[1])
                self._set_state(READY)
                self.ready.emit(self.port)

    def _append(self, line: str) -> None:
        self.log.append(line)
        self.logLine.emit(line)

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read()
        self.exit_code = code if status == QProcess.ExitStatus.NormalExit else -1
        if self.state == STOPPING:
            self._set_state(STOPPED)
            return
        self._set_state(CRASHED)
        self.crashed.emit(self.exit_code, "\n".join(list(self.log)[-20:]))

    def _error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            why = self._proc.errorString() if self._proc else str(error)
            self._append(f"the engine could not be started: {why}")
            self.exit_code = -1
            self._set_state(CRASHED)
            QTimer.singleShot(0, lambda: self.crashed.emit(-1, "\n".join(list(self.log)[-20:])))

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.stateChanged.emit(state)

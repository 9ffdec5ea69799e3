"""The engine process, supervised from the GUI: start, READY, a bounded log, crash detection, stop.

The GUI never loads a model: it starts `python -m app serve ...` (frozen: `Foresight serve ...`)
through QProcess on 127.0.0.1 with a port the OS picks, hands it a per-launch admin token on stdin
(never argv), waits for the `READY port=<n>` line, and reports a crash with the last log lines so the
window can offer a restart. `EngineLaunch` holds what the engine is started with as typed values (the
fields of app.config's EngineSettings and DraftSettings) and writes them as its command line.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import secrets
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from pydantic import ValidationError
from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from app.config import ConfigError, DraftSettings, EngineSettings, Settings, add_section_flags

STOPPED, STARTING, READY, STOPPING, CRASHED = "stopped", "starting", "ready", "stopping", "crashed"
LOG_LINES = 2000
STOP_TIMEOUT_MS = 5000


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"engine arguments: {message}")


def _launch_parser() -> _Parser:
    parser = _Parser(add_help=False, allow_abbrev=False)
    parser.add_argument("--target")
    parser.add_argument("--draft", dest="draft_model")
    parser.add_argument("--ngram", action="store_true")
    parser.add_argument("--no-draft", action="store_true")
    add_section_flags(parser, "engine", EngineSettings.model_fields)
    add_section_flags(parser, "draft", [name for name in DraftSettings.model_fields if name != "mode"])
    return parser


def _checked(model: type[EngineSettings | DraftSettings], values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` as `model` types them; ConfigError names a field it does not have or a value out of bounds."""
    try:
        typed = model.model_validate(dict(values))
    except ValidationError as exc:
        raise ConfigError(f"engine arguments: {exc}") from exc
    return {name: getattr(typed, name) for name in values}


def _flag(name: str, value: Any) -> list[str]:
    """One settings field as the engine's command line takes it (app.config.add_section_flags' flags)."""
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    if isinstance(value, list):
        return [flag, ",".join(str(v) for v in value)]
    return [flag, str(value)]


@dataclasses.dataclass(frozen=True)
class EngineLaunch:
    """What the window starts its engine with: the pair, the EngineSettings and DraftSettings fields given
    for this run (typed as app.config types them), and any other flags as they were given (sampling).

    Fields not given are left to the engine, which reads the same settings file and environment.
    `draft["mode"]` is "model" (with `draft_model`), "ngram" or "none" when given.
    """

    target: str | None = None  # a GGUF path or a packaged model's key; None: the engine's default
    draft_model: str | None = None
    engine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    draft: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", _checked(EngineSettings, self.engine))
        object.__setattr__(self, "draft", _checked(DraftSettings, self.draft))
        if (self.draft.get("mode") == "model") != (self.draft_model is not None):
            raise ConfigError("engine arguments: a drafter model goes with draft mode 'model' and no other")

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> EngineLaunch:
        """The launch an argument list describes (`python -m app gui`'s model flags); flags it does not
        know are kept, in order, for the engine."""
        args, extra = _launch_parser().parse_known_args(list(argv))
        given: dict[str, dict[str, Any]] = {"engine": {}, "draft": {}}
        for key, value in vars(args).items():
            section, _, name = key.partition("__")
            if name and value is not None:
                given[section][name] = value
        if args.draft_model is not None:
            given["draft"]["mode"] = "model"
        elif args.ngram:
            given["draft"]["mode"] = "ngram"
        elif args.no_draft:
            given["draft"]["mode"] = "none"
        return cls(args.target, args.draft_model, given["engine"], given["draft"], tuple(extra))

    def argv(self) -> list[str]:
        """The engine's command line (host, port and token are the process wrapper's)."""
        out = [] if self.target is None else ["--target", self.target]
        mode = self.draft.get("mode")
        if mode == "model":
            out += ["--draft", str(self.draft_model)]
        elif mode in ("ngram", "none"):
            out.append("--ngram" if mode == "ngram" else "--no-draft")
        for values in (self.engine, self.draft):
            for name, value in values.items():
                if name != "mode" and value is not None:
                    out += _flag(name, value)
        return [*out, *self.extra]

    def with_target(self, target: str) -> EngineLaunch:
        return dataclasses.replace(self, target=target)

    def with_pair(
        self, target: str, draft_model: str | None, ngram: bool, mmproj: str | None
    ) -> EngineLaunch:
        """This launch on another pair: a drafter model, n-gram drafting or neither, and its projector."""
        mode = "model" if draft_model else "ngram" if ngram else "none"
        engine = {k: v for k, v in self.engine.items() if k != "mmproj"}
        if mmproj:
            engine["mmproj"] = mmproj
        draft = {**self.draft, "mode": mode}
        return dataclasses.replace(
            self, target=target, draft_model=draft_model or None, engine=engine, draft=draft
        )

    def with_engine(self, **values: Any) -> EngineLaunch:
        """This launch with EngineSettings fields given (e.g. `device="cpu"`)."""
        return dataclasses.replace(self, engine={**self.engine, **values})

    def settings(self, base: Settings) -> Settings:
        """`base` (the settings file's) with this launch's fields over it: what the engine runs with."""
        return base.model_copy(
            update={
                "engine": base.engine.model_copy(update=self.engine),
                "draft": base.draft.model_copy(update=self.draft),
            }
        )


def engine_command(args: list[str]) -> tuple[str, list[str]]:
    """(program, arguments) that start the engine process, frozen or from source; it logs its INFO lines
    (load stages, assembly progress), which the window's engine log and status read."""
    return app_command(["--log-level", "INFO", "serve", *args])


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


LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (?P<level>[A-Z]+)\s+(?P<name>[\w.]+): (?P<message>.*)$")
EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit|Missing)\b(?::.*)?$")


def stop_reason(lines: Sequence[str], exit_code: int | None) -> str:
    """Why the engine stopped, in one line for people: its last error (a logged error, the `error:` line
    of a refused start, the last line of a traceback), else how it ended."""
    for line in reversed(lines):
        line = line.strip()
        logged = LOG_LINE.match(line)
        if logged is not None:
            if logged["level"] in ("ERROR", "CRITICAL"):
                return logged["message"]
            continue
        if line.startswith("error: "):
            return line.removeprefix("error: ")
        if EXCEPTION_LINE.match(line):
            return line
    if exit_code == -1:
        return "it was killed (by a signal, or by the system when memory ran out)"
    return f"it ended with exit code {exit_code} without saying why (see View > Engine log)"


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
        # the engine watches this process and ends with it (app.server.parent)
        flags = ["--host", "127.0.0.1", "--port", "0", "--token-stdin", "--parent-pid", str(os.getpid())]
        flags += self._args
        program, arguments = engine_command(flags)
        self._set_state(STARTING)
        proc.start(program, arguments)
        proc.write((self.token + "\n").encode())
        proc.closeWriteChannel()

    def restart(self, args: list[str] | None = None) -> None:
        """Stop the engine if it runs and start it again, with `args` or the last start's."""
        if self.state in (STARTING, READY):
            self.stop()
        self.start(self._args if args is None else args)

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

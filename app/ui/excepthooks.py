"""Uncaught exceptions in the GUI process: sys.excepthook and threading.excepthook log them with their
traceback and say them to the user through the window's banner; the window carries on (an exception in
a Qt slot ends that slot only)."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from types import TracebackType

from PySide6.QtCore import QObject, Signal

from app import paths

log = logging.getLogger(__name__)


def user_message(exc_type: type[BaseException], exc: BaseException | None) -> str:
    """An uncaught exception in words for the banner (its traceback is in the log)."""
    what = f"{exc_type.__name__}: {exc}" if exc is not None and str(exc) else exc_type.__name__
    return (
        f"Something went wrong: {what}. Foresight carries on; the details are in its log ({paths.log_dir()})."
    )


class ExceptionHooks(QObject):
    """`install()` puts both hooks in place for the life of the process (`uninstall()` puts back the ones
    it found); `raised` carries the words for the user, queued to the main thread when the exception
    came from another thread."""

    raised = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._previous: tuple = (sys.excepthook, threading.excepthook)

    def install(self) -> ExceptionHooks:
        self._previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = self._uncaught
        threading.excepthook = self._uncaught_in_thread
        return self

    def uninstall(self) -> None:
        sys.excepthook, threading.excepthook = self._previous

    def _uncaught(
        self, exc_type: type[BaseException], exc: BaseException, traceback: TracebackType | None
    ) -> None:
        if issubclass(exc_type, KeyboardInterrupt):  # Ctrl+C in the terminal ends the app, as before
            self._previous[0](exc_type, exc, traceback)
            return
        log.error("Uncaught exception", exc_info=(exc_type, exc, traceback))
        self._say(user_message(exc_type, exc))

    def _uncaught_in_thread(self, args: threading.ExceptHookArgs) -> None:
        if issubclass(args.exc_type, SystemExit):  # threading's own hook ignores a thread's exit too
            return
        name = args.thread.name if args.thread is not None else "?"
        log.error(
            "Uncaught exception in thread %s",
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )
        self._say(user_message(args.exc_type, args.exc_value))

    def _say(self, text: str) -> None:
        with contextlib.suppress(RuntimeError):  # the Qt side is gone (the process is ending): the log has it
            self.raised.emit(text)

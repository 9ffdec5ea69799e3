"""Logging set-up shared by every process: one format, stderr, an optional rotating file, and the hooks that
log uncaught exceptions."""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str = "INFO", file: Path | None = None) -> None:
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    console = logging.StreamHandler()
    console.setLevel(level.upper())
    console.setFormatter(logging.Formatter(FORMAT, "%H:%M:%S"))
    root.addHandler(console)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        rotating = logging.handlers.RotatingFileHandler(
            file, maxBytes=2_000_000, backupCount=3, encoding="utf-8"
        )
        rotating.setLevel(logging.DEBUG)
        rotating.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(rotating)
    # llama.cpp's own lines are chatty at load; keep them for -v.
    logging.getLogger("llama.cpp").setLevel(logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING)


def install_excepthooks(show: Callable[[str], None] | None = None) -> None:
    """Uncaught exceptions, in the main thread or any other, go to the log with their traceback (and to
    `show`, the process's way of telling the user, where it has one) instead of only to stderr."""
    log = logging.getLogger("foresight.crash")

    def report(kind: type[BaseException], exc: BaseException, tb: TracebackType | None, where: str) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, exc, tb)
            return
        log.critical("uncaught %s in %s: %s", kind.__name__, where, exc, exc_info=(kind, exc, tb))
        if show is not None:
            show(f"{kind.__name__} in {where}: {exc}")

    def main_hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        report(kind, exc, tb, "the main thread")

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "a thread"
        report(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback, f"thread {name!r}")

    sys.excepthook = main_hook
    threading.excepthook = thread_hook

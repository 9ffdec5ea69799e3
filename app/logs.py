"""Logging set-up shared by every process: one format, stderr, and an optional rotating file."""

from __future__ import annotations

import logging
import logging.handlers
from pathlib import Path

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

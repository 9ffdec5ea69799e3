"""Where Foresight keeps its config, data, cache and models (platformdirs; one base dir overrides all)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import platformdirs

APP_NAME = "Foresight"
BASE_ENV = "FORESIGHT_HOME"


def _base() -> Path | None:
    base = os.environ.get(BASE_ENV)
    return Path(base).expanduser() if base else None


def _dir(kind: str, default: str) -> Path:
    base = _base()
    path = base / kind if base else Path(default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_dir() -> Path:
    return _dir("config", platformdirs.user_config_dir(APP_NAME, appauthor=False))


def data_dir() -> Path:
    return _dir("data", platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    return _dir("cache", platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def log_dir() -> Path:
    return _dir("logs", platformdirs.user_log_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_file() -> Path:
    return config_dir() / "config.toml"


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a temporary file beside `path`, then rename it over `path`: a crash leaves either
    the old file or the whole new one, never half of it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

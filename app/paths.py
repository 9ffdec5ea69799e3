"""Where Foresight keeps its config, data, cache and models (platformdirs; one base dir overrides all)."""

from __future__ import annotations

import os
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

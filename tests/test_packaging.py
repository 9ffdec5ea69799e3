"""What a wheel carries: every package under app/, the kernel sources and the bench prompts, found again."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from app.cli.commands import DEFAULT_PROMPTS
from app.engine.kernels.runtime import SOURCE_DIR, native_sources
from app.resources import CHECKOUT

SETUPTOOLS = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_under_app_is_listed() -> None:
    found = {
        ".".join(init.parent.relative_to(CHECKOUT).parts) for init in (CHECKOUT / "app").rglob("__init__.py")
    }
    mapped = set(SETUPTOOLS["package-dir"])
    assert set(SETUPTOOLS["packages"]) == found | mapped


def _shipped(package: str, folder: Path) -> set[str]:
    globs = SETUPTOOLS["package-data"][package]
    files = [p for p in folder.iterdir() if p.is_file()]
    return {p.name for p in files if any(fnmatch.fnmatch(p.name, g) for g in globs)}


def test_the_wheel_ships_every_kernel_source_and_the_prompts() -> None:
    sources = {p.name for p in SOURCE_DIR.iterdir() if p.suffix in (".cu", ".cuh")}
    assert _shipped("app.engine.kernels", SOURCE_DIR) == sources
    assert SETUPTOOLS["package-dir"] == {"app.bench": "bench"}
    assert _shipped("app.bench", CHECKOUT / "bench") == {"prompts.json"}


def test_code_finds_them_in_this_checkout() -> None:
    assert SOURCE_DIR == CHECKOUT / "app" / "engine" / "kernels"  # beside their host modules
    assert {p.stem for p in native_sources()} >= {"gemv", "attention", "sample"}
    assert CHECKOUT / "bench" / "prompts.json" == DEFAULT_PROMPTS
    assert DEFAULT_PROMPTS.is_file()

"""What a wheel carries: every package under app/, the kernel sources and the bench prompts, found again."""

from __future__ import annotations

import fnmatch
import tomllib

from app.cli.commands import DEFAULT_PROMPTS
from app.engine.kernels.runtime import NATIVE_DIR, native_sources
from app.resources import CHECKOUT

SETUPTOOLS = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_under_app_is_listed() -> None:
    found = {
        ".".join(init.parent.relative_to(CHECKOUT).parts) for init in (CHECKOUT / "app").rglob("__init__.py")
    }
    mapped = set(SETUPTOOLS["package-dir"])
    assert set(SETUPTOOLS["packages"]) == found | mapped


def test_the_mapped_folders_ship_every_kernel_source_and_the_prompts() -> None:
    data = SETUPTOOLS["package-data"]
    for package, folder in SETUPTOOLS["package-dir"].items():
        files = [p for p in (CHECKOUT / folder).iterdir() if p.is_file()]
        shipped_files = {p.name for p in files if any(fnmatch.fnmatch(p.name, g) for g in data[package])}
        if package == "app.native":
            assert shipped_files == {p.name for p in files if p.suffix in (".cu", ".cuh")}
        else:
            assert shipped_files == {"prompts.json"}


def test_code_finds_them_in_this_checkout() -> None:
    assert NATIVE_DIR == CHECKOUT / "native"  # no installed copy in a checkout
    assert {p.stem for p in native_sources()} >= {"gemv", "attention", "sample"}
    assert CHECKOUT / "bench" / "prompts.json" == DEFAULT_PROMPTS
    assert DEFAULT_PROMPTS.is_file()

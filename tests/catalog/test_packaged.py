"""Models shipped as PyPI packages: assembled once, checked, reused; a clear error when missing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.catalog.packaged import GEMMA_270M, ModelPackageMissing, PackagedModel


def test_gemma_is_assembled_verified_and_reused(tmp_path: Path, gemma_path: Path) -> None:
    assert gemma_path.stat().st_size == GEMMA_270M.size
    digest = hashlib.sha256(gemma_path.read_bytes()).hexdigest()
    assert digest == GEMMA_270M.sha256
    fresh = GEMMA_270M.path(tmp_path)
    mtime = fresh.stat().st_mtime_ns
    assert GEMMA_270M.path(tmp_path) == fresh
    assert fresh.stat().st_mtime_ns == mtime


def test_a_tampered_file_is_rebuilt(tmp_path: Path, gemma_path: Path) -> None:
    path = GEMMA_270M.path(tmp_path)
    with path.open("r+b") as f:
        f.seek(1000)
        f.write(b"\xff" * 16)
    path.touch()
    rebuilt = GEMMA_270M.path(tmp_path)
    assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() == GEMMA_270M.sha256


def test_missing_packages_say_what_to_install(tmp_path: Path) -> None:
    absent = PackagedModel(
        "x", "x.gguf", "0" * 64, 1, ("no_such_model_part1",), ("x.bin",), "default-model", "model X"
    )
    with pytest.raises(ModelPackageMissing, match=r"pip install -e '\.\[default-model\]'"):
        absent.path(tmp_path)

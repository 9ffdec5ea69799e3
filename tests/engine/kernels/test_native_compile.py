"""Every kernel source compiles offline with nvcc for the architectures we ship (no GPU needed), and holds
nothing NVRTC lacks: host standard headers do not exist when CuPy compiles at run time."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine.kernels.runtime import NATIVE_DIR, NVCC_ARCHS, native_sources, nvcc_command

SOURCES = native_sources()


def test_the_kernel_sources_are_there() -> None:
    names = {p.stem for p in SOURCES}
    assert {"gemv", "norm", "rope", "attention", "activation", "sample"} <= names
    assert (NATIVE_DIR / "compat.cuh").is_file()


@pytest.mark.parametrize("source", [*SOURCES, *sorted(NATIVE_DIR.glob("*.cuh"))], ids=lambda p: p.name)
def test_sources_include_only_our_own_headers(source: Path) -> None:
    includes = re.findall(r'^\s*#\s*include\s*([<"][^>"]+[>"])', source.read_text(), flags=re.M)
    system = [inc for inc in includes if inc.startswith("<")]
    assert not system, f"{source.name} includes {system}: NVRTC has no host headers"
    for inc in includes:
        assert (NATIVE_DIR / inc.strip('"')).is_file(), f"{source.name}: {inc} is not in native/"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", NVCC_ARCHS)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_source_compiles_with_nvcc(source: Path, arch: str, tmp_path: Path) -> None:
    cmd = nvcc_command(source, arch, tmp_path / f"{source.stem}.o")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr[-4000:]}"
    warnings = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / f"{source.stem}.o").stat().st_size > 0

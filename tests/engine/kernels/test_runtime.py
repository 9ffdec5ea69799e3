"""Every kernel source compiles offline for the GPUs we ship for (no GPU needed): with nvcc for NVIDIA,
with hipcc (Debian 12's ROCm 5.2: `apt-get install hipcc`) for AMD's wave32 RDNA2 and wave64 CDNA2. It
holds nothing NVRTC and hipRTC lack (host standard headers do not exist when CuPy compiles at run time),
takes the constants it shares with its launches from runtime.KERNEL_CONSTANTS as -D defines, refusing to
compile without them, and refuses a warp size other than its target's."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.engine.kernels.runtime import (
    HIPCC_ARCHS,
    KERNEL_CONSTANTS,
    NVCC_ARCHS,
    SOURCE_DIR,
    hipcc_command,
    hipcc_environment,
    kernel_defines,
    native_sources,
    nvcc_command,
)

SOURCES = native_sources()
HEADERS = sorted(SOURCE_DIR.glob("*.cuh"))
NVCC = shutil.which("nvcc")
HIPCC = shutil.which("hipcc")
DEFINED_BY_RUNTIME = [*KERNEL_CONSTANTS, "FS_WARP_SIZE"]  # kernel_defines: the table and the warp size


def _text(path: Path) -> str:
    return path.read_text()


def _included(path: Path) -> set[Path]:
    """The path and every header of the kernels it includes, directly or not."""
    seen = {path}
    for name in re.findall(r'^\s*#\s*include\s*"([^"]+)"', _text(path), flags=re.M):
        seen |= _included(SOURCE_DIR / name)
    return seen


def _guarded_in(name: str) -> Path:
    """The source or header that refuses to compile without `name`."""
    pattern = rf"#ifndef {name}\n#error \"{name} is not defined"
    found = [p for p in (*SOURCES, *HEADERS) if re.search(pattern, _text(p))]
    assert len(found) == 1, f"{name}: guarded in {[p.name for p in found]}, expected exactly one file"
    return found[0]


def test_the_kernel_sources_are_there() -> None:
    names = {p.stem for p in SOURCES}
    assert {"gemv", "norm", "rope", "attention", "activation", "sample"} <= names
    assert (SOURCE_DIR / "compat.cuh").is_file()


@pytest.mark.parametrize("source", [*SOURCES, *HEADERS], ids=lambda p: p.name)
def test_sources_include_only_our_own_headers(source: Path) -> None:
    includes = re.findall(r'^\s*#\s*include\s*([<"][^>"]+[>"])', source.read_text(), flags=re.M)
    system = [inc for inc in includes if inc.startswith("<")]
    assert not system, f"{source.name} includes {system}: NVRTC has no host headers"
    for inc in includes:
        assert (SOURCE_DIR / inc.strip('"')).is_file(), f"{source.name}: {inc} is not beside it"


@pytest.mark.parametrize("name", DEFINED_BY_RUNTIME)
def test_each_shared_constant_has_one_guard_and_no_second_definition(name: str) -> None:
    guard = _guarded_in(name)
    users = [p for p in (*SOURCES, *HEADERS) if re.search(rf"\b{name}\b", _text(p))]
    assert users, f"{name} is passed to every compile but no kernel source uses it"
    for user in users:
        assert guard in _included(user), f"{user.name} uses {name} without including its guard ({guard.name})"
        assert not re.search(rf"^\s*#\s*define\s+{name}\b", _text(user), flags=re.M), (
            f"{user.name} defines {name}: its one value is runtime.KERNEL_CONSTANTS"
        )


def test_every_fs_name_the_sources_use_is_defined_there_or_in_the_table() -> None:
    defined = set(DEFINED_BY_RUNTIME)
    used: set[str] = set()
    for path in (*SOURCES, *HEADERS):
        code = re.sub(r"//[^\n]*|\"[^\"\n]*\"", "", _text(path))  # comments and strings name things too
        defined |= set(re.findall(r"^\s*#\s*define\s+(FS_[A-Z0-9_]+)", code, flags=re.M))
        used |= set(re.findall(r"\b(FS_[A-Z0-9_]+)\b", code))
    assert used - defined == set()


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", DEFINED_BY_RUNTIME)
def test_a_missing_define_stops_the_compile(name: str, tmp_path: Path) -> None:
    guard = _guarded_in(name)
    source = guard if guard.suffix == ".cu" else next(s for s in SOURCES if guard in _included(s))
    defines = [d for d in kernel_defines(32) if not d.startswith(f"-D{name}=")]
    cmd = nvcc_command(source, NVCC_ARCHS[0], tmp_path / "out.i", defines)
    cmd[cmd.index("-c")] = "-E"  # the guards are preprocessor errors: preprocessing is enough
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"{name} is not defined" in done.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", NVCC_ARCHS)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_source_compiles_with_nvcc(source: Path, arch: str, tmp_path: Path) -> None:
    cmd = nvcc_command(source, arch, tmp_path / f"{source.stem}.o")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr[-4000:]}"
    warnings = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / f"{source.stem}.o").stat().st_size > 0


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line.lower()]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_nvcc_refuses_launches_shaped_for_wave64(tmp_path: Path) -> None:
    cmd = nvcc_command(SOURCE_DIR / "rope.cu", NVCC_ARCHS[-1], tmp_path / "rope.o", kernel_defines(64))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "other than the one the launches assume" in done.stderr


@pytest.mark.skipif(HIPCC is None, reason="hipcc is not installed (Debian 12: apt-get install hipcc)")
@pytest.mark.parametrize("arch", HIPCC_ARCHS)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_source_compiles_with_hipcc(source: Path, arch: str, tmp_path: Path) -> None:
    cmd = hipcc_command(source, arch, tmp_path / f"{source.stem}.o")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=hipcc_environment())
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr[-4000:]}"
    assert not _warnings(done.stderr), "\n".join(_warnings(done.stderr))
    assert (tmp_path / f"{source.stem}.o").stat().st_size > 0


@pytest.mark.skipif(HIPCC is None, reason="hipcc is not installed (Debian 12: apt-get install hipcc)")
@pytest.mark.parametrize("arch", HIPCC_ARCHS)
def test_hipcc_refuses_a_warp_size_other_than_the_targets(arch: str, tmp_path: Path) -> None:
    other = 96 - HIPCC_ARCHS[arch]  # wave32 <-> wave64
    cmd = hipcc_command(SOURCE_DIR / "rope.cu", arch, tmp_path / "rope.o", kernel_defines(other))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=hipcc_environment())
    assert done.returncode != 0
    assert f"'{HIPCC_ARCHS[arch]} == {other}'" in done.stderr  # the device pass's static_assert
    assert f"compiling for {arch}" in done.stderr

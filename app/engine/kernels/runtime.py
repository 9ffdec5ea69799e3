"""Our CUDA/HIP kernels, the *.cu sources beside their host modules in this folder: compiled at first use
by CuPy (NVRTC / hipRTC), cached, checked.

Compiler flags and the kernels' shared constants live here and nowhere else: the runtime compile (CuPy)
and the offline checks with nvcc and hipcc (tests/engine/kernels/test_runtime.py) all take them
from `compile_options`, `nvcc_command` and `hipcc_command`.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app import paths

# The kernel sources sit beside this module: in a checkout, a wheel (package data) and a frozen app alike.
SOURCE_DIR = Path(__file__).resolve().parent
# Architectures every source must compile for offline: Turing (RTX 20), Ampere (RTX 30), Hopper (H100/H200).
NVCC_ARCHS = ("sm_75", "sm_86", "sm_90")
# AMD targets every source must compile for offline, with their wavefront size: RDNA2 (RX 6000) runs wave32,
# CDNA2 (MI200) wave64. (ROCm 5.2, Debian 12's hipcc, has no device library for gfx1100.)
HIPCC_ARCHS = {"gfx1030": 32, "gfx90a": 64}
# No fast math: the kernels are checked against the NumPy reference, and llama.cpp's CUDA build keeps
# precise expf/tanhf too. C++17 for `if constexpr` in the block decoders.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)
HIPRTC_OPTIONS: tuple[str, ...] = ("-std=c++17",)

# The constants the kernels and their launches share. Python is their one source: every compile passes
# them as -D defines (`kernel_defines`), each source that uses one stops with #error where it is missing,
# and each family's host module (norm.py, attention.py, gemv.py, ...) reads them from this table.
KERNEL_CONSTANTS: dict[str, int] = {
    # GEMV (gemv.cu): threads of a block (4 warps of 32 or 2 of 64), output rows per warp, staging buffers
    # per warp, most rows of x per launch (its entry points are b1 .. b8); threads of a get_rows block.
    "FS_GEMV_THREADS": 128,
    "FS_GEMV_RPW": 4,
    "FS_GEMV_PF": 3,
    "FS_GEMV_MAX_BATCH": 8,
    "FS_GET_ROWS_THREADS": 128,
    # Weights decoded at a time (quant.cuh): a row's length must be a multiple of it.
    "FS_PIECE": 16,
    # Int8-activation GEMV (mmvq.cu): lanes that share one output row (a warp holds warp / this rows at a
    # time), most warps of a block (they split a row's length), threads of an activation-quantising block.
    "FS_MMVQ_LANES": 8,
    "FS_MMVQ_MAX_WARPS": 4,
    "FS_QUANT_THREADS": 128,
    # Tensor-core GEMV (mmvq_tc.cu): most warps of a block (they split a tile's row length).
    "FS_TC_MAX_WARPS": 16,
    # Attention (attention.cuh): threads of a block, most context splits of a launch, threads of a combine
    # block, floats of a tile (query vectors per block and keys per tile are this / head_dim).
    "FS_ATTN_THREADS": 128,
    "FS_ATTN_MAX_SPLITS": 1024,
    "FS_ATTN_COMBINE_THREADS": 512,
    "FS_ATTN_TILE_FLOATS": 2048,
    # Argmax and top-k (sample.cu): threads of a block, top-k candidates each thread holds.
    "FS_ARGMAX_THREADS": 256,
    "FS_TOPK_PER_THREAD": 16,
}


class KernelError(RuntimeError):
    """A kernel could not be compiled or was launched with arguments it does not take."""


def native_sources() -> list[Path]:
    return sorted(SOURCE_DIR.glob("*.cu"))


def kernel_defines(warp: int) -> tuple[str, ...]:
    """-D defines of every compile: the table, and the warp size the launches are shaped for (compat.cuh
    refuses to compile for a target whose warps differ)."""
    return (*(f"-D{name}={value}" for name, value in KERNEL_CONSTANTS.items()), f"-DFS_WARP_SIZE={warp}")


def _headers_digest() -> str:
    # CuPy's binary cache is keyed by the source and the options, not by the headers the source includes:
    # their digest among the options makes a changed header compile anew.
    digest = hashlib.sha256()
    for header in sorted(SOURCE_DIR.glob("*.cuh")):
        digest.update(header.name.encode() + header.read_bytes())
    return digest.hexdigest()[:16]


def compile_options(hip: bool, warp: int) -> tuple[str, ...]:
    """Options of the runtime compile (NVRTC, or hipRTC under ROCm's CuPy) for a device of `warp` lanes."""
    return (
        *(HIPRTC_OPTIONS if hip else NVRTC_OPTIONS),
        f"-I{SOURCE_DIR}",
        *kernel_defines(warp),
        f"-DFS_HEADERS_DIGEST=0x{_headers_digest()}",
    )


def nvcc_command(source: Path, arch: str, output: Path, defines: Sequence[str] | None = None) -> list[str]:
    """The offline compile of one source: the same language options and defines as the runtime compile."""
    return [
        "nvcc",
        "-c",
        "-std=c++17",
        f"-arch={arch}",
        f"-I{SOURCE_DIR}",
        *(kernel_defines(32) if defines is None else defines),
        "-Xcompiler",
        "-Wall",
        "-o",
        str(output),
        str(source),
    ]


def hipcc_command(source: Path, arch: str, output: Path, defines: Sequence[str] | None = None) -> list[str]:
    """The offline compile of one source for an AMD GPU, as hipRTC compiles it at run time: HIP's runtime
    header included first, this arch's wavefront size as FS_WARP_SIZE. Run it with HIP_PLATFORM=amd
    (`hipcc_environment`): where nvcc is on PATH, hipcc targets NVIDIA otherwise."""
    return [
        "hipcc",
        "-c",
        "-x",
        "hip",
        "-include",
        "hip/hip_runtime.h",
        "-std=c++17",
        f"--offload-arch={arch}",
        f"-I{SOURCE_DIR}",
        *(kernel_defines(HIPCC_ARCHS[arch]) if defines is None else defines),
        "-Wall",
        "-o",
        str(output),
        str(source),
    ]


def hipcc_environment() -> dict[str, str]:
    return {**os.environ, "HIP_PLATFORM": "amd"}


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise KernelError(
            "the native backend needs CuPy: pip install 'foresight[cuda12]' (or cuda13, rocm)"
        ) from exc
    return cupy


def is_hip() -> bool:
    cupy = _cupy()
    return bool(getattr(cupy.cuda.runtime, "is_hip", False))


_warp_sizes: dict[int, int] = {}


def warp_size() -> int:
    """Lanes of a warp on the current device: 32 on NVIDIA and on AMD's RDNA, 64 on AMD's CDNA and GCN."""
    cupy = _cupy()
    device = int(cupy.cuda.Device().id)
    size = _warp_sizes.get(device)
    if size is None:
        size = _warp_sizes[device] = int(cupy.cuda.Device(device).attributes["WarpSize"])
    return size


class KernelLibrary:
    """Every *.cu source compiled once per process (CuPy keeps the binaries on disk between runs)."""

    def __init__(self) -> None:
        self._modules: dict[str, Any] = {}
        self._kernels: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def module(self, source: str) -> Any:
        """The compiled module of <source>.cu."""
        with self._lock:
            mod = self._modules.get(source)
            if mod is None:
                mod = self._modules[source] = self._compile(source)
            return mod

    def kernel(self, source: str, name: str) -> Any:
        key = (source, name)
        fn = self._kernels.get(key)
        if fn is None:
            try:
                fn = self.module(source).get_function(name)
            except Exception as exc:
                raise KernelError(f"{source}.cu has no kernel {name!r}: {exc}") from exc
            self._kernels[key] = fn
        return fn

    def _compile(self, source: str) -> Any:
        cupy = _cupy()
        path = SOURCE_DIR / f"{source}.cu"
        if not path.is_file():
            raise KernelError(f"no kernel source {path}")
        os.environ.setdefault("CUPY_CACHE_DIR", str(paths.cache_dir() / "kernels"))
        options = compile_options(is_hip(), warp_size())
        try:
            mod = cupy.RawModule(code=path.read_text(), options=options, backend="nvrtc")
            mod.compile()
        except Exception as exc:
            raise KernelError(f"{source}.cu failed to compile: {exc}") from exc
        return mod


_library: KernelLibrary | None = None


def library() -> KernelLibrary:
    global _library
    if _library is None:
        _library = KernelLibrary()
    return _library


def check(name: str, array: Any, shape: Sequence[int | None], dtype: str, rows: bool = False) -> None:
    """Raise KernelError unless `array` is a C-contiguous device array of this shape (None: any) and dtype.

    rows: a 2-D array need only be rows of contiguous elements, such as a column slice of a wider one."""
    if not hasattr(array, "data") or not hasattr(array, "device"):
        raise KernelError(f"{name}: expected a device array, got {type(array).__name__}")
    if str(array.dtype) != dtype:
        raise KernelError(f"{name}: dtype {array.dtype}, expected {dtype}")
    if len(array.shape) != len(shape) or any(
        want is not None and got != want for got, want in zip(array.shape, shape, strict=True)
    ):
        raise KernelError(f"{name}: shape {tuple(array.shape)}, expected {tuple(shape)}")
    if rows:
        row, col = array.strides
        overlapping = array.shape[0] > 1 and row < col * array.shape[1]
        if col != array.itemsize or row % array.itemsize or overlapping:
            raise KernelError(f"{name}: strides {array.strides} are not rows of contiguous elements")
    elif not array.flags.c_contiguous:
        raise KernelError(f"{name}: not contiguous")


class LaunchProfile:
    """Device time per kernel of the launches made while it is active (eager launches, not graph replays)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, Any]] = []

    def __enter__(self) -> LaunchProfile:
        global _profile
        _profile = self
        return self

    def __exit__(self, *exc: object) -> None:
        global _profile
        _profile = None

    def by_kernel(self) -> dict[str, tuple[int, float]]:
        """kernel -> (launches, milliseconds), after the stream has been synchronised."""
        cupy = _cupy()
        out: dict[str, tuple[int, float]] = {}
        for name, start, end in self.events:
            count, ms = out.get(name, (0, 0.0))
            out[name] = (count + 1, ms + cupy.cuda.get_elapsed_time(start, end))
        return out


_profile: LaunchProfile | None = None


def launch(
    source: str, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple, shared_mem: int = 0
) -> None:
    """Launch <source>.cu:<name> on the current stream (inside a graph capture, it is recorded)."""
    if any(g <= 0 for g in grid) or any(b <= 0 for b in block) or block[0] * (block[1:2] or (1,))[0] > 1024:
        raise KernelError(f"{source}.{name}: bad launch shape grid={grid} block={block}")
    fn = library().kernel(source, name)
    if _profile is None:
        fn(grid, block, args, shared_mem=shared_mem)
        return
    cupy = _cupy()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn(grid, block, args, shared_mem=shared_mem)
    end.record()
    _profile.events.append((name, start, end))

"""kernel sources built for the CPU (tests/support/cuda_cpu.h) and launched from NumPy through ctypes,
with the compile's -D defines from app.engine.kernels.runtime: the kernels' own code, run where no GPU is."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import platformdirs

from app.engine.kernels.runtime import SOURCE_DIR, kernel_defines

SHIM = Path(__file__).with_name("cuda_cpu.h")
CXX = shutil.which("g++")


class KernelsOnCpu:
    """The kernels `names` of <source>.cu for each source, compiled into one shared library."""

    def __init__(self, sources: list[str], names: list[str], warp: int = 32) -> None:
        if CXX is None:
            raise RuntimeError("g++ is not installed")
        includes = "".join(f'#include "{SOURCE_DIR / f"{s}.cu"}"\n' for s in sources)
        table = "".join(f'    {{"{n}", [](void** a) {{ fs_cpu_call(&{n}, a); }}}},\n' for n in names)
        code = f"""#include "{SHIM}"
{includes}
#include <cstring>
struct FsCpuEntry {{
    const char* name;
    void (*run)(void**);
}};
static const FsCpuEntry fs_cpu_table[] = {{
{table}}};
extern "C" int fs_cpu_run(const char* name, unsigned gx, unsigned gy, unsigned bx, void** args) {{
    for (const auto& e : fs_cpu_table) {{
        if (std::strcmp(e.name, name) == 0) {{
            fs_cpu_launch(dim3{{gx, gy, 1}}, dim3{{bx, 1, 1}}, [&] {{ e.run(args); }});
            return 0;
        }}
    }}
    return -1;
}}
"""
        defines = [*kernel_defines(warp), "-D__HIP__"]
        flags = [
            "-std=c++20",
            "-O1",
            "-pthread",
            "-shared",
            "-fPIC",
            "-ffp-contract=off",
            "-fno-strict-aliasing",
        ]
        digest = hashlib.sha256(code.encode() + " ".join(defines + flags).encode())
        for path in sorted([*SOURCE_DIR.glob("*.cu*"), SHIM]):
            digest.update(path.read_bytes())
        out_dir = Path(platformdirs.user_cache_dir("Foresight")) / "kernels-on-cpu"  # kept across sessions
        out_dir.mkdir(parents=True, exist_ok=True)
        lib = out_dir / f"{digest.hexdigest()[:16]}.so"
        if not lib.exists():
            src = out_dir / f"{digest.hexdigest()[:16]}.cc"
            src.write_text(code)
            cmd = [CXX, *flags, f"-I{SOURCE_DIR}", *defines, "-o", str(lib) + ".part", str(src)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{' '.join(cmd)}\n{done.stderr[-6000:]}")
            Path(str(lib) + ".part").rename(lib)
        self._lib = ctypes.CDLL(str(lib))
        self._lib.fs_cpu_run.restype = ctypes.c_int
        self._lib.fs_cpu_run.argtypes = [
            ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)
        ]  # fmt: skip

    def launch(self, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: tuple) -> None:
        """As runtime.launch: NumPy arrays for device pointers (C-contiguous; the kernel writes into them),
        np.int32 / np.int64 / np.float32 / np.uint64 (0: a null pointer) for the rest."""
        values: list[Any] = []
        for a in args:
            if isinstance(a, np.ndarray):
                if not a.flags.c_contiguous and not _rows_of_elements(a):
                    raise ValueError(f"{name}: an argument is not contiguous rows")
                values.append(ctypes.c_void_p(a.ctypes.data))
            elif isinstance(a, np.int32):
                values.append(ctypes.c_int(int(a)))
            elif isinstance(a, np.int64):
                values.append(ctypes.c_longlong(int(a)))
            elif isinstance(a, np.uint64):
                values.append(ctypes.c_void_p(int(a) or None))
            elif isinstance(a, np.float32):
                values.append(ctypes.c_float(float(a)))
            else:
                raise TypeError(f"{name}: argument {a!r} of type {type(a).__name__}")
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        gx, gy = (*grid, 1)[:2]
        if self._lib.fs_cpu_run(name.encode(), gx, gy, block[0], pointers) != 0:
            raise KeyError(f"{name} is not among the kernels built")


def _rows_of_elements(a: np.ndarray) -> bool:
    return a.ndim == 2 and a.strides[1] == a.itemsize

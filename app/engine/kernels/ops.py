"""Helpers the kernel families' host modules share: CuPy on demand, scalars, grid arithmetic, array checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.runtime import KernelError, check

# Threads of an element-wise block (activation.cu, attention.cu's kv_store).
ELEMENT_THREADS = 256


def cupy_module() -> Any:
    """CuPy, imported where device memory is first used, so the host modules import without it."""
    import cupy

    return cupy


def i32(value: int) -> np.int32:
    return np.int32(value)


def f32(value: float) -> np.float32:
    return np.float32(value)


def blocks(count: int, per_block: int) -> int:
    """Blocks of per_block that cover count."""
    return (count + per_block - 1) // per_block


def row_stride(name: str, a: Any, n: int, width: int) -> int:
    """Row stride (elements) of a float32 [n, width] device array whose rows are contiguous, such as a
    column slice of a fused projection's output."""
    check(name, a, (n, width), "float32", rows=True)
    return a.strides[0] // 4


def check_device(name: str, array: Any) -> None:
    """A CuPy array 16-byte aligned (the GEMVs read it in wide words)."""
    cupy = cupy_module()
    if not isinstance(array, cupy.ndarray):
        raise KernelError(f"{name}: expected a CuPy array, got {type(array).__name__}")
    if array.data.ptr % 16:
        raise KernelError(f"{name}: not 16-byte aligned")

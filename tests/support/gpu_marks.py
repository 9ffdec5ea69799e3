"""Marks for tests that need CuPy and a CUDA/HIP device (kernel tests run where llama.cpp is not built)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

try:
    import cupy
except ImportError:  # pragma: no cover - depends on the machine
    cupy = None


def _device_count() -> int:
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no driver, no device
        return 0


HAVE_GPU = _device_count() > 0


def gpu_test(fn: Callable[..., None]) -> Callable[..., None]:
    """Mark a test `gpu` and skip it without CuPy or a device."""
    fn = pytest.mark.skipif(not HAVE_GPU, reason="needs CuPy and a CUDA/HIP device")(fn)
    return pytest.mark.gpu(fn)

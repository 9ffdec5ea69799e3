"""Little-endian loads from byte buffers as a kernel lane makes them, for the NumPy ports of the kernels:
a 1-D buffer is read at every address; a 2-D one (a row per lane) at one address per row. Unaligned loads
fail, as they would on the device."""

from __future__ import annotations

import numpy as np


def u8(buf: np.ndarray, addr: np.ndarray) -> np.ndarray:
    picked = buf[addr] if buf.ndim == 1 else buf[np.arange(buf.shape[0]), addr]
    return picked.astype(np.uint64)


def u16(buf: np.ndarray, addr: np.ndarray) -> np.ndarray:
    assert np.all(addr % 2 == 0), "unaligned 16-bit load"
    return u8(buf, addr) | (u8(buf, addr + 1) << np.uint64(8))


def u32(buf: np.ndarray, addr: np.ndarray) -> np.ndarray:
    assert np.all(addr % 4 == 0), "unaligned 32-bit load"
    return u16(buf, addr) | (u16(buf, addr + 2) << np.uint64(16))


def u128(buf: np.ndarray, addr: np.ndarray) -> list[np.ndarray]:
    assert np.all(addr % 16 == 0), "unaligned 128-bit load"
    return [u32(buf, addr + 4 * i) for i in range(4)]


def half(bits: np.ndarray) -> np.ndarray:
    """Half-precision bits as float32."""
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)

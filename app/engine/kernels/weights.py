"""GGUF tensors as arrays: a model file's weights memory-mapped as raw blocks, or dequantised to float32.

One reader for both consumers: the native backend uploads the raw blocks its kernels decode, the NumPy
reference (reference.py) multiplies by the dequantised rows. The header comes from app.catalog.gguf (40x
faster than gguf.GGUFReader on a 262k-token vocabulary); the data stays in the file, mapped, and is read
when a tensor is used.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from app.catalog.gguf import GGML_TYPES, GGUFHeader, read_file

# ggml_type ids (ggml.h)
F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 6, 8, 12, 13, 14, 30
QK_K = 256


# --- dequantisation: one decoder per block layout (ggml-common.h) ---------------------------------------
def _f16(b: np.ndarray) -> np.ndarray:
    """Little-endian half-precision fields [nb, 2] -> float32 [nb, 1]."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _q8_0(b: np.ndarray) -> np.ndarray:
    # 34 bytes per 32 weights: d (f16), qs[32] (int8); w = d * q
    return _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)


def _q5_0(b: np.ndarray) -> np.ndarray:
    # 22 bytes per 32 weights: d (f16), qh (u32: bit j is the 5th bit of weight j), qs[16];
    # weight j < 16 is qs[j] & 0xF, weight j + 16 is qs[j] >> 4; w = d * (q - 16)
    qh = np.ascontiguousarray(b[:, 2:6]).view("<u4")
    high = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    qs = b[:, 6:]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1) | (high << 4)
    return _f16(b[:, :2]) * (q.astype(np.float32) - 16)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 scale bytes of Q4_K/Q5_K -> 6-bit scale and min of each of the 8 sub-blocks of 32 weights."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _q4_k_like(b: np.ndarray, qh: np.ndarray | None, qs: np.ndarray) -> np.ndarray:
    # d, dmin (f16), scales[12], [qh[32]], qs[128]; qs byte l of 64-weight chunk c holds weight 64c + l
    # (low nibble, sub-block 2c) and 64c + 32 + l (high nibble, sub-block 2c + 1); Q5_K's 5th bit of
    # weight 32j + l is bit j of qh[l]. w = d * sc[j] * q - dmin * mn[j]
    nb = b.shape[0]
    sc, mn = _k_scales(b[:, 4:16])
    qs = qs.reshape(nb, 4, 1, 32)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32)
    if qh is not None:
        q = q | (((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4)
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return ((d * sc)[:, :, None] * q.astype(np.float32) - (dmin * mn)[:, :, None]).reshape(nb, QK_K)


def _q4_k(b: np.ndarray) -> np.ndarray:  # 144 bytes per 256 weights
    return _q4_k_like(b, None, b[:, 16:])


def _q5_k(b: np.ndarray) -> np.ndarray:  # 176 bytes per 256 weights
    return _q4_k_like(b, b[:, 16:48], b[:, 48:])


def _q6_k(b: np.ndarray) -> np.ndarray:
    # 210 bytes per 256 weights: ql[128], qh[64], scales[16] (int8), d (f16), in two halves of 128.
    # In half h, weight 32k + l (k < 4, l < 32) has low 4 bits from ql[64h + l + 32 (k & 1)], shifted
    # right by 4 when k >= 2, and high 2 bits (qh[32h + l] >> 2k) & 3; w = d * scales[i // 16] * (q - 32)
    nb = b.shape[0]
    ql = b[:, :128].reshape(nb, 2, 64)
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)
    low = np.concatenate([ql & 0xF, ql >> 4], axis=2)
    high = ((qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3).reshape(nb, 2, 128)
    q = ((low | (high << 4)).astype(np.float32) - 32).reshape(nb, 16, 16)
    scale = _f16(b[:, 208:210]) * b[:, 192:208].view(np.int8).astype(np.float32)
    return (scale[:, :, None] * q).reshape(nb, QK_K)


def _bf16(b: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(b).view("<u2").astype(np.uint32) << 16).view(np.float32)


# ggml_type -> decoder of [n_blocks, bytes per block] -> [n_blocks, weights per block] (sizes: GGML_TYPES)
_DECODERS: dict[int, Any] = {
    F32: lambda b: np.ascontiguousarray(b).view("<f4").astype(np.float32),
    F16: _f16,
    BF16: _bf16,
    Q8_0: _q8_0,
    Q5_0: _q5_0,
    Q4_K: _q4_k,
    Q5_K: _q5_k,
    Q6_K: _q6_k,
}


def _type_name(ggml_type: int) -> str:
    return GGML_TYPES[ggml_type][0] if ggml_type in GGML_TYPES else f"ggml type {ggml_type}"


def _block_size(ggml_type: int) -> tuple[int, int]:
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unsupported tensor type: {_type_name(ggml_type)}")
    return GGML_TYPES[ggml_type][1:]


def _gguf_decoder(ggml_type: int) -> Any:
    """The gguf package's decoder of a type without one here (a development dependency)."""
    try:
        import gguf.quants
        from gguf import GGMLQuantizationType

        qtype = GGMLQuantizationType(ggml_type)
    except (ImportError, ValueError):
        raise ValueError(f"unsupported tensor type: {_type_name(ggml_type)}") from None

    def decode(blocks: np.ndarray) -> np.ndarray:
        try:
            return gguf.quants.dequantize(blocks, qtype)
        except NotImplementedError:
            raise ValueError(f"unsupported tensor type: {_type_name(ggml_type)}") from None

    return decode


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    """GGUF blocks (uint8 bytes, row-major) -> float32 array of `shape` (the last dim runs along a row).

    The types the native kernels read have explicit decoders above; any other type the gguf package
    can decode goes through it, and the rest raise ValueError.
    """
    per_block, block_bytes = _block_size(ggml_type)
    n = math.prod(shape)
    if shape[-1] % per_block or raw.size != n // per_block * block_bytes:
        raise ValueError(
            f"{raw.size} bytes of {_type_name(ggml_type)} do not hold a {shape} tensor "
            f"({block_bytes} bytes per {per_block} weights)"
        )
    blocks = np.ascontiguousarray(raw).view(np.uint8).reshape(n // per_block, block_bytes)
    decode = _DECODERS.get(ggml_type) or _gguf_decoder(ggml_type)
    out = decode(blocks)
    return np.asarray(out, dtype=np.float32).reshape(shape)


class ModelWeights:
    """The tensors of one GGUF file, memory-mapped: by name, as raw blocks or dequantised."""

    def __init__(self, path: str | Path, header: GGUFHeader | None = None) -> None:
        self.path = Path(path)
        self.header = header or read_file(self.path)
        self._data_offset = self.header.data_offset
        self._file = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._tensors = {t.name: t for t in self.header.tensors}

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def raw(self, name: str) -> tuple[np.ndarray, int, tuple[int, ...]]:
        """(bytes [rows, bytes per row] or [bytes], ggml_type, shape (rows, row length)) of a tensor."""
        t = self._tensors.get(name)
        if t is None:
            raise ValueError(f"{self.path.name} has no tensor {name} ({self.header.architecture})")
        shape = tuple(reversed(t.shape))
        start = self._data_offset + t.offset
        data = self._file[start : start + t.n_bytes]
        return (data.reshape(shape[0], -1) if len(shape) == 2 else data), t.type_id, shape

    def weight(self, name: str) -> np.ndarray:
        """A whole tensor dequantised to float32."""
        return dequantize(*self.raw(name))

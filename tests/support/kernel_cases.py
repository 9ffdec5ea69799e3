"""What the per-family kernel tests share: real models' shapes, seeded inputs, device copies."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.support.gpu_marks import cupy


@dataclass(frozen=True)
class Shape:
    name: str
    n_embd: int
    n_head: int
    n_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rope_base: float


SHAPES = [
    Shape("gemma3-270m", 640, 4, 1, 256, 2048, 262144, 10000.0),
    Shape("qwen2.5-0.5b", 896, 14, 2, 64, 4864, 151936, 1e6),
    Shape("qwen2.5-1.5b", 1536, 12, 2, 128, 8960, 151936, 1e6),
    Shape("qwen2.5-7b", 3584, 28, 4, 128, 18944, 152064, 1e6),
]
SHAPE_IDS = [s.name for s in SHAPES]
ROWS = (1, 2, 5, 17)  # decode, and verify batches up to 16 drafted tokens
EPS = 1e-6


def seeded(*key: object) -> np.random.Generator:
    """A generator seeded by the test's own parameters: every case its own inputs, the same on every run."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def dev(a: np.ndarray) -> Any:
    return cupy.asarray(a)


def host(a: Any) -> np.ndarray:
    return cupy.asnumpy(a)


def device_positions(values: Any) -> Any:
    """Positions as the kernels read them: device int32."""
    return dev(np.asarray(values, dtype=np.int32))


def f16_round(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def nan_cache(n_ctx: int, shape: Shape) -> tuple[Any, Any]:
    """A cache full of NaN: any row that attention reads without storing it first poisons the output."""
    dims = (n_ctx, shape.n_kv, shape.head_dim)
    return cupy.full(dims, np.nan, dtype=cupy.float16), cupy.full(dims, np.nan, dtype=cupy.float16)

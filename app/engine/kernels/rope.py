"""Host side of rope.cu: rotary embedding of q, or of q and k in one launch, in place."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.ops import i32
from app.engine.kernels.runtime import KernelError, check, launch


def _rope_launch(
    q: Any,
    k: Any,
    hk: int,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float,
    n_rot: int | None,
    freq_factors: Any,
) -> None:
    n, hq, hd = q.shape
    n_rot = hd if n_rot is None else n_rot
    if n_rot % 2 or not 0 < n_rot <= hd:
        raise KernelError(f"rope: n_rot {n_rot} must be even and within head_dim {hd}")
    half = n_rot // 2
    if freq_factors is not None:
        check("rope.freq_factors", freq_factors, (half,), "float32")
    args = (
        q,
        k,
        positions,
        freq_factors,
        i32(hq),
        i32(hk),
        i32(hd),
        i32(n_rot),
        i32(hq * hd),
        i32(hk * hd),
        np.float64(freq_base),
        np.float64(freq_scale),
        i32(1 if neox else 0),
    )
    launch("rope", "rope_f32", (n,), (half, max(1, 256 // half)), args)


def rope(
    x: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """Rotate x [n, heads, head_dim] in place, as reference.rope; positions: device int32 [n]."""
    n, heads, hd = x.shape
    check("rope.x", x, (n, heads, hd), "float32")
    check("rope.positions", positions, (n,), "int32")
    _rope_launch(x, x, 0, positions, freq_base, neox, freq_scale, n_rot, freq_factors)


def rope_qk(
    q: Any,
    k: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """Rotate q [n, n_head, hd] and k [n, n_head_kv, hd] in place in one launch."""
    n, hq, hd = q.shape
    hk = k.shape[1]
    check("rope_qk.q", q, (n, hq, hd), "float32")
    check("rope_qk.k", k, (n, hk, hd), "float32")
    check("rope_qk.positions", positions, (n,), "int32")
    _rope_launch(q, k, hk, positions, freq_base, neox, freq_scale, n_rot, freq_factors)

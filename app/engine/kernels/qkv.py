"""Host side of qkv.cu: a layer's q/k norms, RoPE and KV store in one launch."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.ops import f32, i32, row_stride
from app.engine.kernels.runtime import KernelError, check, launch, warp_size

# Blocks per token of qk_norm_rope_store: each takes every QKV_HEAD_BLOCKS-th head and forms the rotation
# angles once for them.
QKV_HEAD_BLOCKS = 8


def qk_norm_rope_store(
    q_in: Any,
    k_in: Any,
    v_in: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    q_out: Any,
    cache_k: Any,
    cache_v: Any,
    *,
    q_norm: Any = None,
    k_norm: Any = None,
    eps: float = 0.0,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """In one launch: optional per-head RMSNorm of q and k (q_norm, k_norm [hd]), RoPE, q into q_out
    [n, n_head, hd], and k, v stored as f16 at cache rows positions[i], as norm.rms_norm_heads,
    rope.rope_qk and attention.kv_store do. q_in [n, n_head * hd], k_in and v_in [n, n_head_kv * hd]: rows
    of contiguous elements, which may be column slices of one fused q|k|v projection."""
    n, hq, hd = q_out.shape
    n_ctx, hk = cache_k.shape[:2]
    check("qk_norm_rope_store.q_out", q_out, (n, hq, hd), "float32")
    check("qk_norm_rope_store.cache_k", cache_k, (n_ctx, hk, hd), "float16")
    check("qk_norm_rope_store.cache_v", cache_v, (n_ctx, hk, hd), "float16")
    check("qk_norm_rope_store.positions", positions, (n,), "int32")
    strides = [
        row_stride(f"qk_norm_rope_store.{name}", a, n, heads * hd)
        for name, a, heads in (("q_in", q_in, hq), ("k_in", k_in, hk), ("v_in", v_in, hk))
    ]
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None:
            check(f"qk_norm_rope_store.{name}", w, (hd,), "float32")
    n_rot = hd if n_rot is None else n_rot
    if n_rot % 2 or not 0 < n_rot <= hd or hd % 2:
        raise KernelError(f"qk_norm_rope_store: n_rot {n_rot} must be even and within head_dim {hd}")
    if freq_factors is not None:
        check("qk_norm_rope_store.freq_factors", freq_factors, (n_rot // 2,), "float32")
    null = np.uint64(0)
    args = (
        np.uint64(q_in.data.ptr),
        np.uint64(k_in.data.ptr),
        np.uint64(v_in.data.ptr),
        *(i32(s) for s in strides),
        null if q_norm is None else q_norm,
        null if k_norm is None else k_norm,
        f32(eps),
        positions,
        null if freq_factors is None else freq_factors,
        q_out,
        cache_k,
        cache_v,
        i32(hq),
        i32(hk),
        i32(hd),
        i32(n_rot),
        i32(n_ctx),
        np.float64(freq_base),
        np.float64(freq_scale),
        i32(1 if neox else 0),
    )
    warp = warp_size()
    threads = -(-(hd // 2) // warp) * warp  # whole warps, for the block sum
    launch("qkv", "qk_norm_rope_store_f32", (n, min(hq + hk, QKV_HEAD_BLOCKS)), (threads,), args)

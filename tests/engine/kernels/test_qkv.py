"""qkv.cu through app.engine.kernels.qkv: q/k norms, RoPE and KV store in one launch, as the three
separate kernels and the NumPy reference do, over real models' shapes and projection layouts.

Needs CuPy and a GPU (marked `gpu`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app.engine.kernels import qkv, reference
from tests.support.gpu_marks import cupy, gpu_test
from tests.support.kernel_cases import (
    EPS,
    ROWS,
    SHAPE_IDS,
    SHAPES,
    Shape,
    dev,
    device_positions,
    f16_round,
    host,
    nan_cache,
    normal,
    seeded,
)


def _qkv_inputs(layout: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[Any, Any, Any]:
    """q, k, v [n, heads, hd] as the kernel takes them: column slices of one fused projection's output
    [n, (hq + 2 hk) hd] ("qkv"), of a fused q|k beside a separate v ("qk+v": attn_v of another weight type,
    as in Q4_K_M files), or three arrays ("separate")."""
    n = q.shape[0]
    flat = [a.reshape(n, -1) for a in (q, k, v)]
    groups = {"qkv": [[0, 1, 2]], "qk+v": [[0, 1], [2]], "separate": [[0], [1], [2]]}[layout]
    views: list[Any] = [None, None, None]
    for group in groups:
        fused = dev(np.concatenate([flat[i] for i in group], axis=1))
        col = 0
        for i in group:
            views[i] = fused[:, col : col + flat[i].shape[1]]
            col += flat[i].shape[1]
    return views[0], views[1], views[2]


@gpu_test
@pytest.mark.parametrize("layout", ["qkv", "qk+v", "separate"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["no_norm", "qk_norm"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "normal"])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_qk_norm_rope_store(shape: Shape, n: int, neox: bool, qk_norm: bool, layout: str) -> None:
    """As rms_norm_heads, rope_qk and kv_store; a position past the cache rotates q and stores nothing."""
    rng = seeded("qk_norm_rope_store", shape, n, neox, qk_norm, layout)
    hq, hk, hd = shape.n_head, shape.n_kv, shape.head_dim
    q, k = normal(rng, n, hq, hd, scale=2.0), normal(rng, n, hk, hd, scale=2.0)
    v = normal(rng, n, hk, hd)
    wq, wk = normal(rng, hd) + np.float32(1.0), normal(rng, hd) + np.float32(1.0)
    positions = rng.choice(64, size=n, replace=False)
    if n >= 5:
        positions[2] = 70  # past the 64 cache rows
    in_range = positions < 64
    q_in, k_in, v_in = _qkv_inputs(layout, q, k, v)
    q_out = cupy.full((n, hq, hd), np.nan, dtype=cupy.float32)
    cache_k, cache_v = nan_cache(64, shape)
    qkv.qk_norm_rope_store(
        q_in,
        k_in,
        v_in,
        device_positions(positions),
        shape.rope_base,
        neox,
        q_out,
        cache_k,
        cache_v,
        q_norm=dev(wq) if qk_norm else None,
        k_norm=dev(wk) if qk_norm else None,
        eps=EPS,
    )
    if qk_norm:
        q, k = reference.rms_norm(q, wq, EPS), reference.rms_norm(k, wk, EPS)
    want_q = reference.rope(q, positions, shape.rope_base, neox)
    want_k = reference.rope(k, positions, shape.rope_base, neox)
    np.testing.assert_allclose(host(q_out), want_q, rtol=2e-5, atol=5e-5)
    got_k, got_v = host(cache_k).astype(np.float32), host(cache_v)
    stored = positions[in_range]
    # k rounds to f16 after the float32 norm and rotation: within one f16 step of numpy's rounding
    np.testing.assert_allclose(got_k[stored], f16_round(want_k[in_range]), rtol=2e-3, atol=1e-4)
    want_v = v[in_range].astype(np.float16)
    np.testing.assert_array_equal(got_v[stored].view(np.uint16), want_v.view(np.uint16))
    untouched = np.setdiff1d(np.arange(64), stored)
    assert np.isnan(got_k[untouched]).all()
    assert np.isnan(got_v[untouched]).all()


@gpu_test
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_qk_norm_rope_store_partial_scaled_with_factors(shape: Shape) -> None:
    rng = seeded("qk_norm_rope_store_scaled", shape)
    n, n_rot = 5, shape.head_dim // 2
    hq, hk, hd = shape.n_head, shape.n_kv, shape.head_dim
    q, k, v = normal(rng, n, hq, hd), normal(rng, n, hk, hd), normal(rng, n, hk, hd)
    positions = np.array([4999, 0, 17, 2048, 311])
    factors = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    q_out = cupy.empty((n, hq, hd), dtype=cupy.float32)
    cache_k, cache_v = nan_cache(5000, shape)
    q_in, k_in, v_in = _qkv_inputs("qk+v", q, k, v)
    qkv.qk_norm_rope_store(
        q_in, k_in, v_in, device_positions(positions), 500000.0, True, q_out, cache_k, cache_v,
        freq_scale=0.125, n_rot=n_rot, freq_factors=dev(factors),
    )  # fmt: skip
    want_q = reference.rope(q, positions, 500000.0, True, 0.125, n_rot, factors)
    want_k = reference.rope(k, positions, 500000.0, True, 0.125, n_rot, factors)
    np.testing.assert_allclose(host(q_out), want_q, atol=1e-5)
    np.testing.assert_array_equal(host(q_out)[..., n_rot:], q[..., n_rot:])
    got_k = host(cache_k).astype(np.float32)[positions]
    np.testing.assert_allclose(got_k, f16_round(want_k), rtol=2e-3, atol=1e-4)
    np.testing.assert_array_equal(host(cache_v)[positions], v.astype(np.float16))

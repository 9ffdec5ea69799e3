# Over 500 lines: one test group per kernel source of ops.py, sharing the reference's fixtures.
"""The native kernels (native/*.cu through app.engine.kernels.ops) against the NumPy reference over shapes.

Every test but the first needs CuPy and a GPU: those are marked `gpu` and skip without one. The first
checks, on the CPU, a NumPy port of the kernels' float -> f16 rounding against numpy's own conversion.

Tolerances (kernel vs reference, both float32 at heart):
- f16 KV store, add, scale, argmax: exact (bit for bit, index for index).
- RMSNorm: rtol 1e-5 (float32 sum of squares on the GPU, float64 in the reference).
- RoPE: atol 1e-5 on N(0, 1) inputs (both form theta in float64; the kernel's float sin/cos are ~1e-7 off).
- gated activations: rtol 1e-5, atol 1e-5 (expf/tanhf within a few ulp of numpy's; where 1 + tanh(z)
  cancels to an ulp of 1, an output of ~1e-6 may come out as 0).
- attention: the reference gets K/V rounded to f16 as the cache holds them; rtol 1e-4, atol 2e-5 on
  outputs of size ~1 (float32 online softmax over splits vs one float32 softmax; a key more or less
  visible moves the output by far more).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from app.engine.kernels import ops, reference
from tests.support.gpu_marks import cupy, gpu_test


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
CONTEXTS = (1, 37, 300, 5000)
WINDOWS = (0, 512)
N_CTX = 8192  # cache rows, most of them past the context
EPS = 1e-6


def _rng(*key: object) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _dev(a: np.ndarray) -> Any:
    return cupy.asarray(a)


def _host(a: Any) -> np.ndarray:
    return cupy.asnumpy(a)


def _positions(values: Any) -> Any:
    return _dev(np.asarray(values, dtype=np.int32))


def _f16_round(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


# --- f16 rounding (CPU) ----------------------------------------------------------------------------------


def _half_bits_port(values: np.ndarray) -> np.ndarray:
    """fs_float_to_half_rn of native/attention.cuh, line for line, on arrays of float32."""
    x = values.astype(np.float32).view(np.uint32).astype(np.int64)
    sign = (x >> 16) & 0x8000
    mag = x & 0x7FFFFFFF
    e = (mag >> 23) - 127
    special = 0x7C00 | np.where(mag > 0x7F800000, 0x200 | ((mag >> 13) & 0x3FF), 0)
    h_norm = ((e + 15) << 10) | ((mag >> 13) & 0x3FF)
    rest = mag & 0x1FFF
    h_norm += (rest > 0x1000) | ((rest == 0x1000) & ((h_norm & 1) == 1))
    m = (mag & 0x7FFFFF) | 0x800000
    shift = np.clip(-e - 1, 14, 24)
    h_sub = m >> shift
    rest_sub = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    h_sub += (rest_sub > half) | ((rest_sub == half) & ((h_sub & 1) == 1))
    bits = np.select(
        [mag >= 0x7F800000, e > 15, e >= -14, e < -25], [special, 0x7C00, h_norm, 0], default=h_sub
    )
    return (sign | bits).astype(np.uint16)


def _rounding_cases() -> np.ndarray:
    halves = np.arange(0x10000, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = halves[np.isfinite(halves)].astype(np.float32)
    up = np.nextafter(finite, np.float32(np.inf))
    mids = ((finite.astype(np.float64)[:-1] + finite.astype(np.float64)[1:]) / 2).astype(np.float32)
    mids = mids[np.isfinite(mids)]
    near = np.concatenate(
        [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    )
    bits = _rng("f16").integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, 65504.0, 65519.996, 65520.0, 1e9, 2.0**-25, 2.0**-24, 1e-30], np.float32)
    return np.concatenate([finite, up, near, bits, special, -special])


def test_f16_rounding_port_matches_numpy() -> None:
    values = _rounding_cases()
    with np.errstate(over="ignore", invalid="ignore"):
        want = values.astype(np.float16)
    got = _half_bits_port(values)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan], want[~nan].view(np.uint16))
    assert np.isnan(got[nan].view(np.float16)).all()


# --- norms ----------------------------------------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm(shape: Shape, n: int) -> None:
    rng = _rng("rms", shape, n)
    x = _normal(rng, n, shape.n_embd, scale=3.0) + np.float32(0.5)
    x[0] *= np.float32(3e-4)  # mean(x^2) near eps: eps must enter as in the reference
    w = _normal(rng, shape.n_embd)
    want = reference.rms_norm(x, w, EPS)
    x_d, w_d = _dev(x), _dev(w)
    out = cupy.empty_like(x_d)
    ops.rms_norm(x_d, w_d, out, EPS)
    np.testing.assert_allclose(_host(out), want, rtol=1e-5, atol=1e-6)
    ops.rms_norm(x_d, w_d, x_d, EPS)  # in place
    np.testing.assert_allclose(_host(x_d), want, rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_add_rms_norm(shape: Shape, n: int) -> None:
    rng = _rng("add_rms", shape, n)
    x, res, w = (
        _normal(rng, n, shape.n_embd),
        _normal(rng, n, shape.n_embd, scale=4.0),
        _normal(rng, shape.n_embd),
    )
    total = x + res
    x_d, res_d, w_d = _dev(x), _dev(res), _dev(w)
    out = cupy.empty_like(x_d)
    ops.add_rms_norm(x_d, res_d, w_d, out, EPS)
    np.testing.assert_array_equal(_host(res_d), total)
    np.testing.assert_allclose(_host(out), reference.rms_norm(total, w, EPS), rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm_heads(shape: Shape, n: int) -> None:
    rng = _rng("qk_norm", shape, n)
    q = _normal(rng, n, shape.n_head, shape.head_dim, scale=2.0)
    w = _normal(rng, shape.head_dim) + np.float32(1.0)
    q_d = _dev(q)
    ops.rms_norm_heads(q_d, _dev(w), q_d, EPS)
    np.testing.assert_allclose(_host(q_d), reference.rms_norm(q, w, EPS), rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm_add_rms_norm_is_the_three_launches_bit_for_bit(shape: Shape, n: int) -> None:
    rng = _rng("norm_add_norm", shape, n)
    o, res = _normal(rng, n, shape.n_embd, scale=3.0), _normal(rng, n, shape.n_embd, scale=20.0)
    w_post, w_next = _normal(rng, shape.n_embd), _normal(rng, shape.n_embd)
    o1, res1, out1 = _dev(o), _dev(res), cupy.empty((n, shape.n_embd), dtype=cupy.float32)
    ops.rms_norm(o1, _dev(w_post), o1, EPS)
    ops.add(res1, o1, res1)
    ops.rms_norm(res1, _dev(w_next), out1, EPS)
    o2, res2, out2 = _dev(o), _dev(res), cupy.empty((n, shape.n_embd), dtype=cupy.float32)
    ops.rms_norm_add_rms_norm(o2, _dev(w_post), res2, _dev(w_next), out2, EPS)
    np.testing.assert_array_equal(_host(res2), _host(res1))
    np.testing.assert_array_equal(_host(out2), _host(out1))
    total = res + reference.rms_norm(o, w_post, EPS)
    np.testing.assert_allclose(_host(out2), reference.rms_norm(total, w_next, EPS), rtol=1e-4, atol=1e-5)


# --- rope -----------------------------------------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("start", [0, 300, 4990])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "normal"])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rope(shape: Shape, n: int, neox: bool, start: int) -> None:
    rng = _rng("rope", shape, n, neox, start)
    q = _normal(rng, n, shape.n_head, shape.head_dim)
    k = _normal(rng, n, shape.n_kv, shape.head_dim)
    positions = np.arange(start, start + n)
    q_d, k_d = _dev(q), _dev(k)
    ops.rope_qk(q_d, k_d, _positions(positions), shape.rope_base, neox)
    np.testing.assert_allclose(_host(q_d), reference.rope(q, positions, shape.rope_base, neox), atol=1e-5)
    np.testing.assert_allclose(_host(k_d), reference.rope(k, positions, shape.rope_base, neox), atol=1e-5)


@gpu_test
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "normal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rope_scaled_partial_with_factors(shape: Shape, neox: bool) -> None:
    """freq_scale (linear scaling), llama 3's frequency factors, n_rot < head_dim, scattered positions."""
    rng = _rng("rope_scaled", shape, neox)
    n, n_rot = 5, shape.head_dim // 2
    x = _normal(rng, n, shape.n_head, shape.head_dim)
    positions = np.array([4999, 0, 17, 2048, 311])
    factors = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    want = reference.rope(x, positions, 500000.0, neox, 0.125, n_rot, factors)
    x_d = _dev(x)
    ops.rope(x_d, _positions(positions), 500000.0, neox, 0.125, n_rot, _dev(factors))
    np.testing.assert_allclose(_host(x_d), want, atol=1e-5)
    np.testing.assert_array_equal(_host(x_d)[..., n_rot:], x[..., n_rot:])


# --- KV cache and attention -----------------------------------------------------------------------------


def _cache(n_ctx: int, shape: Shape) -> tuple[Any, Any]:
    """A cache full of NaN: any row that attention reads without storing it first poisons the output."""
    dims = (n_ctx, shape.n_kv, shape.head_dim)
    return cupy.full(dims, np.nan, dtype=cupy.float16), cupy.full(dims, np.nan, dtype=cupy.float16)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_kv_store_rounds_to_f16_like_numpy(shape: Shape, n: int) -> None:
    rng = _rng("kv_store", shape, n)
    k = _normal(rng, n, shape.n_kv, shape.head_dim, scale=30.0)
    v = _normal(rng, n, shape.n_kv, shape.head_dim)
    edge = np.array([65504.0, 65519.0, 65520.0, -7e4, 1e-8, 2.0**-25, 3 * 2.0**-26, 0.0, -0.0], np.float32)
    k[0, 0, : len(edge)] = edge
    positions = rng.choice(64, size=n, replace=False)
    cache_k, cache_v = _cache(64, shape)
    ops.kv_store(_dev(k), _dev(v), _positions(positions), cache_k, cache_v)
    got_k, got_v = _host(cache_k), _host(cache_v)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got_k[positions].view(np.uint16), k.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(got_v[positions].view(np.uint16), v.astype(np.float16).view(np.uint16))
    untouched = np.setdiff1d(np.arange(64), positions)
    assert np.isnan(got_k[untouched]).all()
    assert np.isnan(got_v[untouched]).all()


def _qkv_inputs(layout: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[Any, Any, Any]:
    """q, k, v [n, heads, hd] as the kernel takes them: column slices of one fused projection's output
    [n, (hq + 2 hk) hd] ("qkv"), of a fused q|k beside a separate v ("qk+v": attn_v of another weight type,
    as in Q4_K_M files), or three arrays ("separate")."""
    n = q.shape[0]
    flat = [a.reshape(n, -1) for a in (q, k, v)]
    groups = {"qkv": [[0, 1, 2]], "qk+v": [[0, 1], [2]], "separate": [[0], [1], [2]]}[layout]
    views: list[Any] = [None, None, None]
    for group in groups:
        fused = _dev(np.concatenate([flat[i] for i in group], axis=1))
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
    rng = _rng("qk_norm_rope_store", shape, n, neox, qk_norm, layout)
    hq, hk, hd = shape.n_head, shape.n_kv, shape.head_dim
    q, k = _normal(rng, n, hq, hd, scale=2.0), _normal(rng, n, hk, hd, scale=2.0)
    v = _normal(rng, n, hk, hd)
    wq, wk = _normal(rng, hd) + np.float32(1.0), _normal(rng, hd) + np.float32(1.0)
    positions = rng.choice(64, size=n, replace=False)
    if n >= 5:
        positions[2] = 70  # past the 64 cache rows
    in_range = positions < 64
    q_in, k_in, v_in = _qkv_inputs(layout, q, k, v)
    q_out = cupy.full((n, hq, hd), np.nan, dtype=cupy.float32)
    cache_k, cache_v = _cache(64, shape)
    ops.qk_norm_rope_store(
        q_in,
        k_in,
        v_in,
        _positions(positions),
        shape.rope_base,
        neox,
        q_out,
        cache_k,
        cache_v,
        q_norm=_dev(wq) if qk_norm else None,
        k_norm=_dev(wk) if qk_norm else None,
        eps=EPS,
    )
    if qk_norm:
        q, k = reference.rms_norm(q, wq, EPS), reference.rms_norm(k, wk, EPS)
    want_q = reference.rope(q, positions, shape.rope_base, neox)
    want_k = reference.rope(k, positions, shape.rope_base, neox)
    np.testing.assert_allclose(_host(q_out), want_q, rtol=2e-5, atol=5e-5)
    got_k, got_v = _host(cache_k).astype(np.float32), _host(cache_v)
    stored = positions[in_range]
    # k rounds to f16 after the float32 norm and rotation: within one f16 step of numpy's rounding
    np.testing.assert_allclose(got_k[stored], _f16_round(want_k[in_range]), rtol=2e-3, atol=1e-4)
    want_v = v[in_range].astype(np.float16)
    np.testing.assert_array_equal(got_v[stored].view(np.uint16), want_v.view(np.uint16))
    untouched = np.setdiff1d(np.arange(64), stored)
    assert np.isnan(got_k[untouched]).all()
    assert np.isnan(got_v[untouched]).all()


@gpu_test
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_qk_norm_rope_store_partial_scaled_with_factors(shape: Shape) -> None:
    rng = _rng("qk_norm_rope_store_scaled", shape)
    n, n_rot = 5, shape.head_dim // 2
    hq, hk, hd = shape.n_head, shape.n_kv, shape.head_dim
    q, k, v = _normal(rng, n, hq, hd), _normal(rng, n, hk, hd), _normal(rng, n, hk, hd)
    positions = np.array([4999, 0, 17, 2048, 311])
    factors = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    q_out = cupy.empty((n, hq, hd), dtype=cupy.float32)
    cache_k, cache_v = _cache(5000, shape)
    q_in, k_in, v_in = _qkv_inputs("qk+v", q, k, v)
    ops.qk_norm_rope_store(
        q_in, k_in, v_in, _positions(positions), 500000.0, True, q_out, cache_k, cache_v,
        freq_scale=0.125, n_rot=n_rot, freq_factors=_dev(factors),
    )  # fmt: skip
    want_q = reference.rope(q, positions, 500000.0, True, 0.125, n_rot, factors)
    want_k = reference.rope(k, positions, 500000.0, True, 0.125, n_rot, factors)
    np.testing.assert_allclose(_host(q_out), want_q, atol=1e-5)
    np.testing.assert_array_equal(_host(q_out)[..., n_rot:], q[..., n_rot:])
    got_k = _host(cache_k).astype(np.float32)[positions]
    np.testing.assert_allclose(got_k, _f16_round(want_k), rtol=2e-3, atol=1e-4)
    np.testing.assert_array_equal(_host(cache_v)[positions], v.astype(np.float16))


def _attention_case(
    shape: Shape, n: int, positions: np.ndarray, context: int, window: int, n_splits: int | None = None
) -> None:
    rng = _rng("attention", shape, n, context, window, n_splits, tuple(positions))
    k = _normal(rng, context, shape.n_kv, shape.head_dim)
    v = _normal(rng, context, shape.n_kv, shape.head_dim)
    q = _normal(rng, n, shape.n_head, shape.head_dim, scale=2.0)  # peaky enough that each key matters
    scale = 1.0 / np.sqrt(shape.head_dim)
    cache_k, cache_v = _cache(N_CTX, shape)
    ops.kv_store(_dev(k), _dev(v), _positions(np.arange(context)), cache_k, cache_v)
    ws = ops.Workspace(max_rows=n, n_head=shape.n_head, head_dim=shape.head_dim, vocab=1, max_splits=1024)
    out = cupy.empty((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    ops.attention(_dev(q), cache_k, cache_v, _positions(positions), scale, out, ws, window, n_splits)
    want = reference.attention(q, _f16_round(k), _f16_round(v), positions, scale, window)
    np.testing.assert_allclose(_host(out), want, rtol=1e-4, atol=2e-5)


@gpu_test
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_attention(shape: Shape, n: int, context: int, window: int) -> None:
    """The last n positions of a context attend to it: decode (n = 1) and k-token verify."""
    if context < n:
        pytest.skip("fewer keys than query rows")
    _attention_case(shape, n, np.arange(context - n, context), context, window)


@gpu_test
@pytest.mark.parametrize("n_splits", [1, 3, 100, 1024])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_attention_splits_and_scattered_positions(shape: Shape, n_splits: int) -> None:
    """One split for all keys, one-tile splits, more splits than keys, windows ending mid-split, any order."""
    positions = np.array([299, 3, 150, 0, 298, 64, 65])
    _attention_case(shape, len(positions), positions, 300, 0, n_splits)
    _attention_case(shape, len(positions), positions, 300, 70, n_splits)


@gpu_test
@pytest.mark.parametrize("window", [0, 24])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_attention_graph_replays_with_new_positions(shape: Shape, window: int) -> None:
    """One captured kv_store + attention + argmax graph serves steps at new positions, rollback included."""
    if getattr(cupy.cuda.runtime, "is_hip", False):
        pytest.skip("CuPy captures no graphs on HIP")
    n, n_ctx, prefix = 5, 1024, 100
    rng = _rng("graph", shape, window)
    dims = (shape.n_kv, shape.head_dim)
    k_all = np.zeros((n_ctx, *dims), np.float32)
    v_all = np.zeros((n_ctx, *dims), np.float32)
    k_all[:prefix], v_all[:prefix] = _normal(rng, prefix, *dims), _normal(rng, prefix, *dims)
    cache_k, cache_v = _cache(n_ctx, shape)
    ops.kv_store(_dev(k_all[:prefix]), _dev(v_all[:prefix]), _positions(np.arange(prefix)), cache_k, cache_v)
    ws = ops.Workspace(max_rows=n, n_head=shape.n_head, head_dim=shape.head_dim, vocab=4099)
    q_d = cupy.zeros((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    k_d = cupy.zeros((n, *dims), dtype=cupy.float32)
    v_d = cupy.zeros((n, *dims), dtype=cupy.float32)
    pos_d = cupy.zeros(n, dtype=cupy.int32)
    out = cupy.zeros((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    logits_d = cupy.zeros((n, 4099), dtype=cupy.float32)
    best = cupy.zeros(n, dtype=cupy.int32)
    scale = 1.0 / np.sqrt(shape.head_dim)

    def step() -> None:
        ops.kv_store(k_d, v_d, pos_d, cache_k, cache_v)
        ops.attention(q_d, cache_k, cache_v, pos_d, scale, out, ws, window=window)
        ops.argmax(logits_d, best, ws)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        pos_d[...] = _positions(np.arange(prefix, prefix + n))
        step()  # compiles and loads the kernels before the capture
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        # positions 100..104, then a rollback to 103 (two drafts rejected), then onwards
        for start in (prefix, prefix + 3, prefix + 8):
            positions = np.arange(start, start + n)
            q, k, v = (
                _normal(rng, n, shape.n_head, shape.head_dim),
                _normal(rng, n, *dims),
                _normal(rng, n, *dims),
            )
            k_all[positions], v_all[positions] = k, v
            logits = _normal(rng, n, 4099)
            q_d[...], k_d[...], v_d[...], logits_d[...] = _dev(q), _dev(k), _dev(v), _dev(logits)
            pos_d[...] = _positions(positions)
            graph.launch(stream)
            stream.synchronize()
            end = start + n
            want = reference.attention(
                q, _f16_round(k_all[:end]), _f16_round(v_all[:end]), positions, scale, window
            )
            np.testing.assert_allclose(_host(out), want, rtol=1e-4, atol=2e-5)
            np.testing.assert_array_equal(_host(best), reference.argmax(logits))


# --- element-wise ---------------------------------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gated_activation(shape: Shape, n: int, kind: str, packed: bool) -> None:
    rng = _rng("gate", shape, n, kind, packed)
    gate, up = _normal(rng, n, shape.n_ff, scale=4.0), _normal(rng, n, shape.n_ff)
    gate[0, :4] = [-100.0, 100.0, 0.0, -0.0]
    want = (reference.silu_gate if kind == "silu" else reference.gelu_tanh_gate)(gate, up)
    out = cupy.empty((n, shape.n_ff), dtype=cupy.float32)
    if packed:
        fused = getattr(ops, f"{kind}_gate_packed")
        fused(_dev(np.concatenate([gate, up], axis=1)), out)
    else:
        getattr(ops, f"{kind}_gate")(_dev(gate), _dev(up), out)
    np.testing.assert_allclose(_host(out), want, rtol=1e-5, atol=1e-5)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_add_and_scale(shape: Shape, n: int) -> None:
    rng = _rng("add", shape, n)
    a, b = _normal(rng, n, shape.n_embd), _normal(rng, n, shape.n_embd)
    a_d, b_d = _dev(a), _dev(b)
    out = cupy.empty_like(a_d)
    ops.add(a_d, b_d, out)
    np.testing.assert_array_equal(_host(out), a + b)
    ops.scale(out, 0.125, out)
    np.testing.assert_array_equal(_host(out), (a + b) * np.float32(0.125))
    ops.add(a_d, b_d, a_d)  # in place
    np.testing.assert_array_equal(_host(a_d), a + b)


# --- argmax ---------------------------------------------------------------------------------------------


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("vocab", [262144, 151936, 152064, 4097, 5])
def test_argmax_first_of_ties(vocab: int, n: int) -> None:
    rng = _rng("argmax", vocab, n)
    logits = _normal(rng, n, vocab, scale=5.0)
    r = rng.integers(0, vocab, size=2 * n)
    for i in range(n):
        kind = i % 5
        if kind == 1:  # the maximum twice, possibly in two different blocks: the lower index wins
            lo, hi = sorted({int(r[2 * i]), int(r[2 * i + 1]), vocab - 1})[:2] if vocab > 1 else (0, 0)
            logits[i, lo] = logits[i, hi] = np.float32(100.0)
        elif kind == 2:  # all -inf: index 0, as numpy
            logits[i] = -np.inf
        elif kind == 3:  # a NaN wins over any number (the first NaN)
            logits[i, r[2 * i]] = np.nan
            logits[i, vocab - 1] = np.nan
        elif kind == 4:  # the maximum at the last index
            logits[i, vocab - 1] = np.float32(1e30)
    ws = ops.Workspace(max_rows=n, n_head=1, head_dim=64, vocab=vocab)
    out = cupy.zeros(n, dtype=cupy.int32)
    ops.argmax(_dev(logits), out, ws)
    np.testing.assert_array_equal(_host(out), reference.argmax(logits))

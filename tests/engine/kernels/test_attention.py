"""attention.cu through app.engine.kernels.attention: the f16 KV store and attention over real models'
shapes against the NumPy reference.

The first test checks, on the CPU, a NumPy port of the kernels' float -> f16 rounding against numpy's own
conversion; the others need CuPy and a GPU (marked `gpu`). The f16 KV store is exact (bit for bit);
attention gets the reference K/V rounded to f16 as the cache holds them: rtol 1e-4, atol 2e-5 on outputs of
size ~1 (float32 online softmax over splits vs one float32 softmax; a key more or less visible moves the
output by far more).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels import attention, reference, sample
from tests.support.gpu_marks import cupy, gpu_test
from tests.support.kernel_cases import (
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

CONTEXTS = (1, 37, 300, 5000)
WINDOWS = (0, 512)
N_CTX = 8192  # cache rows, most of them past the context


def _half_bits_port(values: np.ndarray) -> np.ndarray:
    """fs_float_to_half_rn of attention.cuh, line for line, on arrays of float32."""
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
    bits = seeded("f16").integers(0, 2**32, size=1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
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


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_kv_store_rounds_to_f16_like_numpy(shape: Shape, n: int) -> None:
    rng = seeded("kv_store", shape, n)
    k = normal(rng, n, shape.n_kv, shape.head_dim, scale=30.0)
    v = normal(rng, n, shape.n_kv, shape.head_dim)
    edge = np.array([65504.0, 65519.0, 65520.0, -7e4, 1e-8, 2.0**-25, 3 * 2.0**-26, 0.0, -0.0], np.float32)
    k[0, 0, : len(edge)] = edge
    positions = rng.choice(64, size=n, replace=False)
    cache_k, cache_v = nan_cache(64, shape)
    attention.kv_store(dev(k), dev(v), device_positions(positions), cache_k, cache_v)
    got_k, got_v = host(cache_k), host(cache_v)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got_k[positions].view(np.uint16), k.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(got_v[positions].view(np.uint16), v.astype(np.float16).view(np.uint16))
    untouched = np.setdiff1d(np.arange(64), positions)
    assert np.isnan(got_k[untouched]).all()
    assert np.isnan(got_v[untouched]).all()


def _attention_case(
    shape: Shape, n: int, positions: np.ndarray, context: int, window: int, n_splits: int | None = None
) -> None:
    rng = seeded("attention", shape, n, context, window, n_splits, tuple(positions))
    k = normal(rng, context, shape.n_kv, shape.head_dim)
    v = normal(rng, context, shape.n_kv, shape.head_dim)
    q = normal(rng, n, shape.n_head, shape.head_dim, scale=2.0)  # peaky enough that each key matters
    scale = 1.0 / np.sqrt(shape.head_dim)
    cache_k, cache_v = nan_cache(N_CTX, shape)
    attention.kv_store(dev(k), dev(v), device_positions(np.arange(context)), cache_k, cache_v)
    ws = attention.AttentionWorkspace(
        max_rows=n, n_head=shape.n_head, head_dim=shape.head_dim, max_splits=1024
    )
    out = cupy.empty((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    attention.attention(
        dev(q), cache_k, cache_v, device_positions(positions), scale, out, ws, window, n_splits
    )
    want = reference.attention(q, f16_round(k), f16_round(v), positions, scale, window)
    np.testing.assert_allclose(host(out), want, rtol=1e-4, atol=2e-5)


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
    rng = seeded("graph", shape, window)
    dims = (shape.n_kv, shape.head_dim)
    k_all = np.zeros((n_ctx, *dims), np.float32)
    v_all = np.zeros((n_ctx, *dims), np.float32)
    k_all[:prefix], v_all[:prefix] = normal(rng, prefix, *dims), normal(rng, prefix, *dims)
    cache_k, cache_v = nan_cache(n_ctx, shape)
    attention.kv_store(
        dev(k_all[:prefix]), dev(v_all[:prefix]), device_positions(np.arange(prefix)), cache_k, cache_v
    )
    ws = attention.AttentionWorkspace(max_rows=n, n_head=shape.n_head, head_dim=shape.head_dim)
    samples = sample.SampleWorkspace(max_rows=n, vocab=4099)
    q_d = cupy.zeros((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    k_d = cupy.zeros((n, *dims), dtype=cupy.float32)
    v_d = cupy.zeros((n, *dims), dtype=cupy.float32)
    pos_d = cupy.zeros(n, dtype=cupy.int32)
    out = cupy.zeros((n, shape.n_head, shape.head_dim), dtype=cupy.float32)
    logits_d = cupy.zeros((n, 4099), dtype=cupy.float32)
    best = cupy.zeros(n, dtype=cupy.int32)
    scale = 1.0 / np.sqrt(shape.head_dim)

    def step() -> None:
        attention.kv_store(k_d, v_d, pos_d, cache_k, cache_v)
        attention.attention(q_d, cache_k, cache_v, pos_d, scale, out, ws, window=window)
        sample.argmax(logits_d, best, samples)

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        pos_d[...] = device_positions(np.arange(prefix, prefix + n))
        step()  # compiles and loads the kernels before the capture
        stream.synchronize()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        # positions 100..104, then a rollback to 103 (two drafts rejected), then onwards
        for start in (prefix, prefix + 3, prefix + 8):
            positions = np.arange(start, start + n)
            q, k, v = (
                normal(rng, n, shape.n_head, shape.head_dim),
                normal(rng, n, *dims),
                normal(rng, n, *dims),
            )
            k_all[positions], v_all[positions] = k, v
            logits = normal(rng, n, 4099)
            q_d[...], k_d[...], v_d[...], logits_d[...] = dev(q), dev(k), dev(v), dev(logits)
            pos_d[...] = device_positions(positions)
            graph.launch(stream)
            stream.synchronize()
            end = start + n
            want = reference.attention(
                q, f16_round(k_all[:end]), f16_round(v_all[:end]), positions, scale, window
            )
            np.testing.assert_allclose(host(out), want, rtol=1e-4, atol=2e-5)
            np.testing.assert_array_equal(host(best), reference.argmax(logits))

"""norm.cu through app.engine.kernels.norm against the NumPy reference over real models' shapes.

Needs CuPy and a GPU (marked `gpu`). RMSNorm: rtol 1e-5 (float32 sum of squares on the GPU, float64 in the
reference); the fused norm-add-norm is the three launches bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels import activation, norm, reference
from tests.support.gpu_marks import cupy, gpu_test
from tests.support.kernel_cases import (
    EPS,
    ROWS,
    SHAPE_IDS,
    SHAPES,
    Shape,
    dev,
    host,
    normal,
    seeded,
)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm(shape: Shape, n: int) -> None:
    rng = seeded("rms", shape, n)
    x = normal(rng, n, shape.n_embd, scale=3.0) + np.float32(0.5)
    x[0] *= np.float32(3e-4)  # mean(x^2) near eps: eps must enter as in the reference
    w = normal(rng, shape.n_embd)
    want = reference.rms_norm(x, w, EPS)
    x_d, w_d = dev(x), dev(w)
    out = cupy.empty_like(x_d)
    norm.rms_norm(x_d, w_d, out, EPS)
    np.testing.assert_allclose(host(out), want, rtol=1e-5, atol=1e-6)
    norm.rms_norm(x_d, w_d, x_d, EPS)  # in place
    np.testing.assert_allclose(host(x_d), want, rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_add_rms_norm(shape: Shape, n: int) -> None:
    rng = seeded("add_rms", shape, n)
    x, res, w = (
        normal(rng, n, shape.n_embd),
        normal(rng, n, shape.n_embd, scale=4.0),
        normal(rng, shape.n_embd),
    )
    total = x + res
    x_d, res_d, w_d = dev(x), dev(res), dev(w)
    out = cupy.empty_like(x_d)
    norm.add_rms_norm(x_d, res_d, w_d, out, EPS)
    np.testing.assert_array_equal(host(res_d), total)
    np.testing.assert_allclose(host(out), reference.rms_norm(total, w, EPS), rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm_heads(shape: Shape, n: int) -> None:
    rng = seeded("qk_norm", shape, n)
    q = normal(rng, n, shape.n_head, shape.head_dim, scale=2.0)
    w = normal(rng, shape.head_dim) + np.float32(1.0)
    q_d = dev(q)
    norm.rms_norm_heads(q_d, dev(w), q_d, EPS)
    np.testing.assert_allclose(host(q_d), reference.rms_norm(q, w, EPS), rtol=1e-5, atol=1e-6)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rms_norm_add_rms_norm_is_the_three_launches_bit_for_bit(shape: Shape, n: int) -> None:
    rng = seeded("norm_add_norm", shape, n)
    o, res = normal(rng, n, shape.n_embd, scale=3.0), normal(rng, n, shape.n_embd, scale=20.0)
    w_post, w_next = normal(rng, shape.n_embd), normal(rng, shape.n_embd)
    o1, res1, out1 = dev(o), dev(res), cupy.empty((n, shape.n_embd), dtype=cupy.float32)
    norm.rms_norm(o1, dev(w_post), o1, EPS)
    activation.add(res1, o1, res1)
    norm.rms_norm(res1, dev(w_next), out1, EPS)
    o2, res2, out2 = dev(o), dev(res), cupy.empty((n, shape.n_embd), dtype=cupy.float32)
    norm.rms_norm_add_rms_norm(o2, dev(w_post), res2, dev(w_next), out2, EPS)
    np.testing.assert_array_equal(host(res2), host(res1))
    np.testing.assert_array_equal(host(out2), host(out1))
    total = res + reference.rms_norm(o, w_post, EPS)
    np.testing.assert_allclose(host(out2), reference.rms_norm(total, w_next, EPS), rtol=1e-4, atol=1e-5)

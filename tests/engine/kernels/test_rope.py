"""rope.cu through app.engine.kernels.rope against the NumPy reference over real models' shapes.

Needs CuPy and a GPU (marked `gpu`). atol 1e-5 on N(0, 1) inputs (both form theta in float64; the kernel's
float sin/cos are ~1e-7 off).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels import reference, rope
from tests.support.gpu_marks import gpu_test
from tests.support.kernel_cases import (
    ROWS,
    SHAPE_IDS,
    SHAPES,
    Shape,
    dev,
    device_positions,
    host,
    normal,
    seeded,
)


@gpu_test
@pytest.mark.parametrize("start", [0, 300, 4990])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "normal"])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rope(shape: Shape, n: int, neox: bool, start: int) -> None:
    rng = seeded("rope", shape, n, neox, start)
    q = normal(rng, n, shape.n_head, shape.head_dim)
    k = normal(rng, n, shape.n_kv, shape.head_dim)
    positions = np.arange(start, start + n)
    q_d, k_d = dev(q), dev(k)
    rope.rope_qk(q_d, k_d, device_positions(positions), shape.rope_base, neox)
    np.testing.assert_allclose(host(q_d), reference.rope(q, positions, shape.rope_base, neox), atol=1e-5)
    np.testing.assert_allclose(host(k_d), reference.rope(k, positions, shape.rope_base, neox), atol=1e-5)


@gpu_test
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "normal"])
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_rope_scaled_partial_with_factors(shape: Shape, neox: bool) -> None:
    """freq_scale (linear scaling), llama 3's frequency factors, n_rot < head_dim, scattered positions."""
    rng = seeded("rope_scaled", shape, neox)
    n, n_rot = 5, shape.head_dim // 2
    x = normal(rng, n, shape.n_head, shape.head_dim)
    positions = np.array([4999, 0, 17, 2048, 311])
    factors = rng.uniform(1.0, 8.0, n_rot // 2).astype(np.float32)
    want = reference.rope(x, positions, 500000.0, neox, 0.125, n_rot, factors)
    x_d = dev(x)
    rope.rope(x_d, device_positions(positions), 500000.0, neox, 0.125, n_rot, dev(factors))
    np.testing.assert_allclose(host(x_d), want, atol=1e-5)
    np.testing.assert_array_equal(host(x_d)[..., n_rot:], x[..., n_rot:])

"""activation.cu through app.engine.kernels.activation against the NumPy reference over real models'
shapes.

Needs CuPy and a GPU (marked `gpu`). Add and scale: exact. Gated activations: rtol 1e-5, atol 1e-5 (expf/tanhf
within a few ulp of numpy's; where 1 + tanh(z) cancels to an ulp of 1, an output of ~1e-6 may come out as 0).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.kernels import activation, reference
from tests.support.gpu_marks import cupy, gpu_test
from tests.support.kernel_cases import (
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
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_gated_activation(shape: Shape, n: int, kind: str, packed: bool) -> None:
    rng = seeded("gate", shape, n, kind, packed)
    gate, up = normal(rng, n, shape.n_ff, scale=4.0), normal(rng, n, shape.n_ff)
    gate[0, :4] = [-100.0, 100.0, 0.0, -0.0]
    want = (reference.silu_gate if kind == "silu" else reference.gelu_tanh_gate)(gate, up)
    out = cupy.empty((n, shape.n_ff), dtype=cupy.float32)
    if packed:
        fused = getattr(activation, f"{kind}_gate_packed")
        fused(dev(np.concatenate([gate, up], axis=1)), out)
    else:
        getattr(activation, f"{kind}_gate")(dev(gate), dev(up), out)
    np.testing.assert_allclose(host(out), want, rtol=1e-5, atol=1e-5)


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
def test_add_and_scale(shape: Shape, n: int) -> None:
    rng = seeded("add", shape, n)
    a, b = normal(rng, n, shape.n_embd), normal(rng, n, shape.n_embd)
    a_d, b_d = dev(a), dev(b)
    out = cupy.empty_like(a_d)
    activation.add(a_d, b_d, out)
    np.testing.assert_array_equal(host(out), a + b)
    activation.scale(out, 0.125, out)
    np.testing.assert_array_equal(host(out), (a + b) * np.float32(0.125))
    activation.add(a_d, b_d, a_d)  # in place
    np.testing.assert_array_equal(host(a_d), a + b)

"""sample.cu through app.engine.kernels.sample (argmax, and the device top-k of sampled requests) and
NativeBackend.decode_topk.

The kernels need CuPy and a GPU (marked `gpu`); none of this needs llama.cpp. Argmax: numpy.argmax, index for
index (first of ties, NaN first). Top-k: best value first, ties to the lower id (numpy.argmax repeated);
values and ids exact.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from app.engine.kernels import reference, sample
from app.engine.kernels.runtime import KernelError
from tests.support.gpu_marks import cupy, gpu_test
from tests.support.kernel_cases import ROWS, dev, host, normal, seeded


@gpu_test
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("vocab", [262144, 151936, 152064, 4097, 5])
def test_argmax_first_of_ties(vocab: int, n: int) -> None:
    rng = seeded("argmax", vocab, n)
    logits = normal(rng, n, vocab, scale=5.0)
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
    ws = sample.SampleWorkspace(max_rows=n, vocab=vocab)
    out = cupy.zeros(n, dtype=cupy.int32)
    sample.argmax(dev(logits), out, ws)
    np.testing.assert_array_equal(host(out), reference.argmax(logits))


def _top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.stack([np.lexsort((np.arange(row.shape[0]), -row))[:k] for row in logits])
    return np.take_along_axis(logits, ids, axis=1), ids.astype(np.int32)


@gpu_test
@pytest.mark.parametrize("k", [1, 40, 64])
@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("vocab", [262144, 151936, 152064, 4097, 70])
def test_top_k_matches_numpy_ties_to_the_lower_id(vocab: int, n: int, k: int) -> None:
    rng = np.random.default_rng(zlib.crc32(repr((vocab, n, k)).encode()))
    logits = (rng.standard_normal((n, vocab)) * 4).astype(np.float32)
    for i in range(n):
        if i % 3 == 1:  # a value 20 times over, across slices: the lower ids first
            logits[i, rng.choice(vocab, 20, replace=False)] = np.float32(50.0)
        elif i % 3 == 2:  # a row of -inf but a few: the rest of the k by id
            logits[i] = -np.inf
            logits[i, rng.choice(vocab, 3, replace=False)] = np.float32(1.0)
    ws = sample.SampleWorkspace(max_rows=n, vocab=vocab)
    val = cupy.zeros((n, k), dtype=cupy.float32)
    idx = cupy.zeros((n, k), dtype=cupy.int32)
    sample.top_k(cupy.asarray(logits), k, val, idx, ws)
    want_val, want_idx = _top_k(logits, k)
    np.testing.assert_array_equal(cupy.asnumpy(idx), want_idx)
    np.testing.assert_array_equal(cupy.asnumpy(val), want_val)


@gpu_test
def test_top_k_refuses_what_its_workspace_cannot_hold() -> None:
    ws = sample.SampleWorkspace(max_rows=2, vocab=1000)
    logits = cupy.zeros((2, 1000), dtype=cupy.float32)
    with pytest.raises(KernelError, match="k <= 64"):
        sample.top_k(logits, 65, cupy.zeros((2, 65), cupy.float32), cupy.zeros((2, 65), cupy.int32), ws)


@gpu_test
def test_decode_topk_is_the_top_of_the_decoded_logits(gemma_path: Path) -> None:
    from app.engine.backends.native import NativeBackend

    ids = [2, *np.random.default_rng(1).integers(100, 20000, 29).tolist()]
    with NativeBackend(gemma_path, n_ctx=512, tokenizer=False) as backend:
        assert backend.device_topk_max == 64
        rows = backend.decode(ids, len(ids) - 9).copy()  # the last 9 rows: a verify pass's worth
        backend.rollback(0)
        values, top = backend.decode_topk(ids, len(ids) - 9, 40)
        assert backend.kv_tokens == ids
    want_val, want_idx = _top_k(rows, 40)
    np.testing.assert_array_equal(top, want_idx)
    np.testing.assert_array_equal(values, want_val)

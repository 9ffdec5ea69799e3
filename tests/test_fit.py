"""The memory model against the packaged GGUF files."""

from __future__ import annotations

import pytest

from app.catalog.fit import GIB, ModelShape, PairNeed, margin, read_shape


@pytest.mark.parametrize("fixture", ["gemma_path", "qwen_path"])
def test_weights_match_the_file_size(fixture: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(fixture)
    shape = read_shape(path)
    size = path.stat().st_size
    assert 0.95 * size <= shape.weight_bytes <= size
    assert shape.n_layer > 0
    assert shape.kv_bytes_per_token > 0


def test_qwen_kv_cache_per_token(qwen_path) -> None:
    shape = read_shape(qwen_path)
    # Qwen2.5 1.5B: 28 layers, 2 KV heads of 128, f16 K and V.
    assert shape.kv_bytes_per_token == 28 * 2 * (128 + 128) * 2
    assert shape.kv_bytes(4096) == 4096 * 28 * 2 * 256 * 2


def test_margin_is_clamped() -> None:
    assert margin(1 * GIB) == 2 * GIB
    assert margin(30 * GIB) == 3 * GIB
    assert margin(100 * GIB) == 4 * GIB


def test_pair_need_adds_everything() -> None:
    target = ModelShape(10 * GIB, 40, 8, 128, 128)
    drafter = ModelShape(1 * GIB, 20, 4, 64, 64)
    need = PairNeed(target, drafter, mmproj_bytes=GIB // 2)
    raw = 10 * GIB + target.kv_bytes(8192) + GIB // 2 + 1 * GIB + drafter.kv_bytes(8192)
    assert need.total(8192) == raw + 2 * GIB

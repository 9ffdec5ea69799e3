"""The memory model against the packaged GGUF files."""

from __future__ import annotations

import pytest

from app.catalog.fit import GIB, ModelShape, PairNeed, fit_on, margin, read_shape


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


def test_quantized_kv_cache_shrinks_the_need() -> None:
    target = ModelShape(4 * GIB, 28, 4, 128, 128, context_length=32768)
    f16, q8 = PairNeed(target), PairNeed(target, kv_type="q8_0")
    assert q8.target_bytes(32768) - target.weight_bytes == pytest.approx(
        (f16.target_bytes(32768) - target.weight_bytes) * 34 / 64, rel=1e-6
    )
    with pytest.raises(ValueError, match="unknown KV cache type"):
        PairNeed(target, kv_type="q3")


def test_fit_on_one_device_names_the_largest_context() -> None:
    # 7B-class target (28 layers, 4 KV heads of 128) with a 0.5B drafter (24 layers, 2 KV heads of 64)
    need = PairNeed(
        ModelShape(int(4.4 * GIB), 28, 4, 128, 128, 32768), ModelShape(GIB // 2, 24, 2, 64, 64, 32768)
    )
    card = fit_on(need, "gpu:0 RTX 4060", 8 * GIB, 8192)
    assert card.fits
    assert card.largest_ctx == 16384  # 32k needs 4.9 + 2.0 GiB of KV + margin > 8 GiB
    assert need.total(card.largest_ctx) <= 8 * GIB < need.total(32768)
    small = fit_on(need, "gpu:0 tiny", 4 * GIB, 8192)
    assert not small.fits
    assert small.largest_ctx == 0
    assert "does not fit" in small.summary()
    assert "fits up to 16,384 tokens" in card.summary()

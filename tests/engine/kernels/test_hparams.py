"""ModelConfig read from a real GGUF header as llama.cpp reads it (the defaults where a key is absent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from app.catalog.gguf import read_file
from app.engine.kernels.hparams import ModelConfig


def test_gemma3_config_follows_llama_cpp(gemma_path: Path) -> None:
    c = ModelConfig.from_header(read_file(gemma_path))
    assert (c.architecture, c.n_embd, c.n_layer, c.n_ff) == ("gemma3", 640, 18, 2048)
    assert (c.n_head, c.n_head_kv, c.head_dim, c.n_rot) == (4, 1, 256, 256)
    # load_swa_pattern(ml, 6): every 6th layer is global
    assert [il for il in range(c.n_layer) if not c.swa_layers[il]] == [5, 11, 17]
    assert c.sliding_window == 512
    assert c.rope_for(0) == (10000.0, 1.0)  # sliding layers: rope.freq_base_swa, default 10000
    assert c.rope_for(5) == (1e6, 1.0)
    assert c.attn_scale == 1 / 16  # 1/sqrt(head_dim) below 27B
    assert c.embed_scale == pytest.approx(math.sqrt(640))
    assert (c.tied_output, c.qk_norm, c.post_norms, c.gelu, c.rope_neox) == (True,) * 5
    assert (c.qkv_bias, c.logit_softcap) == (False, 0.0)

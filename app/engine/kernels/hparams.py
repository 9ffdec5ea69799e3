"""ModelConfig: a model's hyperparameters as the forward passes read them from a GGUF header."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from app.catalog.gguf import GGUFHeader

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


@dataclass(frozen=True)
class ModelConfig:
    """What the forward pass reads from a GGUF header, with llama.cpp's defaults where a key is absent."""

    architecture: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    rms_eps: float
    rope_base: float  # global (non-sliding) layers
    rope_base_swa: float  # sliding layers (gemma3: rope.freq_base_swa, default 10000)
    rope_scale: float  # freq_scale = 1 / linear scaling factor, global layers only
    rope_neox: bool
    n_rot: int
    sliding_window: int  # 0: none
    swa_layers: tuple[bool, ...]  # per layer: does it slide
    tied_output: bool  # no output.weight: the head is token_embd
    attn_scale: float  # multiplies q.k
    embed_scale: float  # multiplies the token embeddings (gemma: sqrt(n_embd))
    qkv_bias: bool
    qk_norm: bool  # RMSNorm over each head of q and k before RoPE (gemma3, qwen3)
    post_norms: bool  # RMSNorm of the attention and FFN outputs before each residual add (gemma3)
    gelu: bool  # tanh-GELU gate (gemma) instead of SiLU
    logit_softcap: float  # 0: none; else logits = c * tanh(logits / c)

    def rope_for(self, layer: int) -> tuple[float, float]:
        """(freq_base, freq_scale) of a layer (llama_model::get_rope_freq_base/scale)."""
        if self.swa_layers[layer]:
            return self.rope_base_swa, 1.0
        return self.rope_base, self.rope_scale

    @classmethod
    def from_header(cls, header: GGUFHeader) -> ModelConfig:
        def get(key: str, default: Any = None) -> Any:
            value = header.get(key)
            if value is None:
                if default is None:
                    raise ValueError(f"{arch} model without {key.replace('{arch}', arch)}")
                return default
            return value

        def uniform(key: str, default: Any = None) -> int:
            value = get(key, default)
            if isinstance(value, list):
                if len(set(value)) != 1:
                    raise ValueError(f"per-layer {key.replace('{arch}', arch)} is not supported: {value}")
                value = value[0]
            return int(value)

        arch = header.architecture
        if arch not in ARCHITECTURES:
            raise ValueError(
                f"architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
            )
        gemma = arch == "gemma3"
        tensors = {t.name: t for t in header.tensors}
        n_embd, n_layer = uniform("{arch}.embedding_length"), uniform("{arch}.block_count")
        n_head = uniform("{arch}.attention.head_count")
        head_dim = uniform("{arch}.attention.key_length", n_embd // n_head)
        if uniform("{arch}.attention.value_length", head_dim) != head_dim:
            raise ValueError(f"{arch}: key and value head sizes differ")
        scaling = str(get("{arch}.rope.scaling.type", "linear"))
        if scaling not in ("linear", "none"):
            raise ValueError(f"{arch}: rope scaling {scaling!r} is not supported")
        factor = float(get("{arch}.rope.scaling.factor", get("{arch}.rope.scale_linear", 0.0)))
        window = int(get("{arch}.attention.sliding_window", 0)) if gemma else 0
        if window:
            # llama_model_base::load_swa_pattern(ml, 6): a bool per layer, or n such that every n-th
            # layer (il % n == n - 1) is global; gemma3-270m: layers 5, 11, 17 global, the rest slide
            pattern = get("{arch}.attention.sliding_window_pattern", 6)
            swa = (
                [bool(p) for p in pattern]
                if isinstance(pattern, list)
                else [int(pattern) == 0 or il % int(pattern) < int(pattern) - 1 for il in range(n_layer)]
            )
        else:
            swa = [False] * n_layer
        if gemma and n_layer == 62:  # gemma3-27B: query_pre_attn_scalar = n_embd / n_head
            attn_scale = 1.0 / math.sqrt(n_embd / n_head)
        else:
            attn_scale = 1.0 / math.sqrt(head_dim)
        return cls(
            architecture=arch,
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=uniform("{arch}.attention.head_count_kv", n_head),
            head_dim=head_dim,
            n_ff=uniform("{arch}.feed_forward_length"),
            n_vocab=int(tensors["token_embd.weight"].shape[1]),
            rms_eps=float(get("{arch}.attention.layer_norm_rms_epsilon")),
            rope_base=float(get("{arch}.rope.freq_base", 10000.0)),
            rope_base_swa=float(get("{arch}.rope.freq_base_swa", 10000.0)),
            rope_scale=1.0 if factor == 0.0 or scaling == "none" else 1.0 / factor,
            rope_neox=arch != "llama",
            n_rot=uniform("{arch}.rope.dimension_count", head_dim),
            sliding_window=window,
            swa_layers=tuple(swa),
            tied_output="output.weight" not in tensors,
            attn_scale=attn_scale,
            embed_scale=math.sqrt(n_embd) if gemma else 1.0,
            qkv_bias="blk.0.attn_q.bias" in tensors,
            qk_norm="blk.0.attn_q_norm.weight" in tensors,
            post_norms=gemma,
            gelu=gemma,
            logit_softcap=float(get("{arch}.final_logit_softcapping", 0.0)) if gemma else 0.0,
        )

"""NumPy reference forward pass over GGUF weights: the executable specification of the native kernels.

Float32 throughout. Weights stay in the file (memory-mapped by weights.ModelWeights) and are dequantised
when used, in row chunks: the 1.5B model runs in ~0.4 GB besides the mapped file. Each switch below
follows llama.cpp's graph for the architecture (src/models/{llama,qwen2,qwen3,gemma3}.cpp of the version
llama-cpp-python 0.3.36 vendors); tests/engine/kernels/test_reference.py checks the logits against
llama.cpp's CPU build.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from app.catalog.gguf import GGUFHeader, read_file
from app.engine.kernels.hparams import ModelConfig
from app.engine.kernels.weights import ModelWeights, dequantize

_ROW_CHUNK = 16384  # weight rows dequantised at once: a 262144-row head never exists whole as float32


def matmul(x: np.ndarray, raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> np.ndarray:
    """x [n, in] @ W.T for a GGUF weight W of `shape` (out, in) -> [n, out], dequantised in row chunks."""
    n_out, n_in = shape
    rows = raw.reshape(n_out, -1)
    out = np.empty((x.shape[0], n_out), dtype=np.float32)
    for r in range(0, n_out, _ROW_CHUNK):
        w = dequantize(rows[r : r + _ROW_CHUNK], ggml_type, (min(_ROW_CHUNK, n_out - r), n_in))
        np.matmul(x, w.T, out=out[:, r : r + w.shape[0]])
    return out


# --- ops ------------------------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (ggml_rms_norm then ggml_mul)."""
    mean_sq = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(mean_sq + eps)).astype(np.float32) * weight).astype(np.float32)


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    freq_base: float,
    neox: bool,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: np.ndarray | None = None,
) -> np.ndarray:
    """Rotary embedding of x [n, n_heads, head_dim] as ggml_rope_ext without YaRN (ext_factor 0).

    Pair i < n_rot/2 turns by theta = freq_scale * p * freq_base^(-2i/n_rot) / freq_factors[i]; NeoX
    pairs dims (i, i + n_rot/2), normal rope pairs (2i, 2i+1); dims from n_rot on pass through.
    Angles are computed in float64 here; ggml's CPU cache multiplies theta by base^(-2/n_rot) step by step
    in float32, which differs only by float32 rounding.
    """
    n_rot = x.shape[-1] if n_rot is None else n_rot
    half = n_rot // 2
    inv_freq = float(freq_base) ** (-2.0 * np.arange(half) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors
    theta = freq_scale * np.asarray(positions, dtype=np.float64)[:, None] * inv_freq  # [n, half]
    cos = np.cos(theta).astype(np.float32)[:, None, :]
    sin = np.sin(theta).astype(np.float32)[:, None, :]
    out = np.array(x, dtype=np.float32, copy=True)
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half], out[..., half:n_rot] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2], out[..., 1:n_rot:2] = a * cos - b * sin, a * sin + b * cos
    return out


def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_positions: np.ndarray,
    scale: float,
    window: int = 0,
) -> np.ndarray:
    """softmax(scale * q.k + mask) v for q [n, n_head, hd] over k, v [T, n_head_kv, hd] -> [n, n_head, hd].

    Row j of k/v is position j; it is visible to a query at position p iff j <= p and (window == 0 or
    p - j < window) (llama.cpp's LLAMA_SWA_TYPE_STANDARD). Query head h reads kv head h // (n_head //
    n_head_kv).
    """
    n, n_head, hd = q.shape
    t, n_kv, _ = k.shape
    if n_head % n_kv:
        raise ValueError(f"{n_head} query heads do not share {n_kv} kv heads evenly")
    group = n_head // n_kv
    pos = np.asarray(q_positions)[:, None]
    keys = np.arange(t)[None, :]
    visible = keys <= pos
    if window:
        visible &= pos - keys < window
    if not visible.any(axis=1).all():
        raise ValueError("a query sees no key: positions must lie within the keys given")
    qg = q.reshape(n, n_kv, group, hd).transpose(1, 0, 2, 3).reshape(n_kv, n * group, hd)
    scores = (qg @ k.transpose(1, 2, 0)).reshape(n_kv, n, group, t) * np.float32(scale)
    scores = np.where(visible[None, :, None, :], scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    out = probs.reshape(n_kv, n * group, t) @ v.transpose(1, 0, 2)  # [n_kv, n * group, hd]
    return out.reshape(n_kv, n, group, hd).transpose(1, 0, 2, 3).reshape(n, n_head, hd).astype(np.float32)


def silu_gate(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, silu(x) = x / (1 + exp(-x)) (ggml_silu)."""
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x < -88 gives -0, as in ggml
        return (gate / (1.0 + np.exp(-gate)) * up).astype(np.float32)


def gelu_tanh_gate(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """gelu(gate) * up with the tanh approximation of ggml_gelu (and PyTorch's approximate="tanh")."""
    inner = np.float32(math.sqrt(2.0 / math.pi)) * gate * (1.0 + np.float32(0.044715) * gate * gate)
    return (0.5 * gate * (1.0 + np.tanh(inner)) * up).astype(np.float32)


def argmax(logits: np.ndarray) -> np.ndarray:
    return np.argmax(logits, axis=-1)


# --- model ----------------------------------------------------------------------------------------------
class ReferenceKV:
    """The reference's K/V: float32 keys and values [n_layer, n_ctx, n_head_kv, head_dim] (row j holds
    position j) and how many positions are filled. (The kernels' cache is attention.KVCache: f16, per layer,
    its length kept by the backend.)"""

    def __init__(self, config: ModelConfig, n_ctx: int) -> None:
        shape = (config.n_layer, n_ctx, config.n_head_kv, config.head_dim)
        self.n_ctx = n_ctx
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.length = 0

    def rollback(self, n_keep: int) -> None:
        """Keep the first n_keep positions (no-op when n_keep >= length)."""
        if n_keep < 0:
            raise ValueError(f"rollback to {n_keep}")
        self.length = min(self.length, n_keep)


class ReferenceModel:
    """A GGUF model of a supported architecture, run by the NumPy ops above."""

    def __init__(self, path: str | Path, header: GGUFHeader | None = None) -> None:
        self.path = Path(path)
        header = header or read_file(self.path)
        self.config = ModelConfig.from_header(header)
        self.weights = ModelWeights(self.path, header)
        if "blk.0.ffn_gate_inp.weight" in self.weights:
            raise ValueError(f"{self.config.architecture}: mixture-of-experts models are not supported")
        # norms, biases, rope factors: small, kept dequantised
        self._small = {t.name: self.weight(t.name) for t in header.tensors if len(t.shape) == 1}

    def raw(self, name: str) -> tuple[np.ndarray, int, tuple[int, ...]]:
        """(bytes [rows, bytes per row] or [bytes], ggml_type, shape (rows, row length)) of a tensor."""
        return self.weights.raw(name)

    def weight(self, name: str) -> np.ndarray:
        """A whole tensor dequantised to float32."""
        return self.weights.weight(name)

    def new_cache(self, n_ctx: int) -> ReferenceKV:
        return ReferenceKV(self.config, n_ctx)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        out = matmul(x, *self.raw(f"{name}.weight"))  # type: ignore[arg-type]
        bias = self._small.get(f"{name}.bias")
        return out if bias is None else out + bias

    def _embed(self, tokens: np.ndarray) -> np.ndarray:
        rows, ggml_type, (n_vocab, n_embd) = self.raw("token_embd.weight")
        if tokens.min() < 0 or tokens.max() >= n_vocab:
            raise ValueError(f"token ids must lie in [0, {n_vocab})")
        x = dequantize(rows[tokens], ggml_type, (len(tokens), n_embd))
        return x * np.float32(self.config.embed_scale)

    def forward(self, tokens: list[int] | np.ndarray, cache: ReferenceKV, logits_from: int = 0) -> np.ndarray:
        """Append tokens at positions cache.length.. and return the logits of rows logits_from.. on."""
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        n, start = len(tokens), cache.length
        if n == 0 or not 0 <= logits_from < n:
            raise ValueError(f"forward of {n} tokens with logits from row {logits_from}")
        if start + n > cache.n_ctx:
            raise ValueError(f"{start + n} tokens do not fit the cache of {cache.n_ctx}")
        end = start + n
        positions = np.arange(start, end)
        eps, hd, small = c.rms_eps, c.head_dim, self._small
        factors = small.get("rope_freqs.weight")  # llama 3 rope frequency factors
        x = self._embed(tokens)  # [n, n_embd]
        for il in range(c.n_layer):
            p = f"blk.{il}"
            h = rms_norm(x, small[f"{p}.attn_norm.weight"], eps)
            q = self._linear(h, f"{p}.attn_q").reshape(n, c.n_head, hd)
            k = self._linear(h, f"{p}.attn_k").reshape(n, c.n_head_kv, hd)
            v = self._linear(h, f"{p}.attn_v").reshape(n, c.n_head_kv, hd)
            if c.qk_norm:
                q = rms_norm(q, small[f"{p}.attn_q_norm.weight"], eps)
                k = rms_norm(k, small[f"{p}.attn_k_norm.weight"], eps)
            base, scale = c.rope_for(il)
            q = rope(q, positions, base, c.rope_neox, scale, c.n_rot, factors)
            cache.k[il, start:end] = rope(k, positions, base, c.rope_neox, scale, c.n_rot, factors)
            cache.v[il, start:end] = v
            window = c.sliding_window if c.swa_layers[il] else 0
            a = attention(q, cache.k[il, :end], cache.v[il, :end], positions, c.attn_scale, window)
            o = self._linear(a.reshape(n, c.n_head * hd), f"{p}.attn_output")
            if c.post_norms:
                o = rms_norm(o, small[f"{p}.post_attention_norm.weight"], eps)
            x = x + o
            h = rms_norm(x, small[f"{p}.ffn_norm.weight"], eps)
            gate, up = self._linear(h, f"{p}.ffn_gate"), self._linear(h, f"{p}.ffn_up")
            f = self._linear((gelu_tanh_gate if c.gelu else silu_gate)(gate, up), f"{p}.ffn_down")
            if c.post_norms:
                f = rms_norm(f, small[f"{p}.post_ffw_norm.weight"], eps)
            x = x + f
        cache.length = end
        x = rms_norm(x[logits_from:], small["output_norm.weight"], eps)
        logits = self._linear(x, "token_embd" if c.tied_output else "output")  # [rows, n_vocab]
        if c.logit_softcap:
            logits = np.float32(c.logit_softcap) * np.tanh(logits / np.float32(c.logit_softcap))
        return logits.astype(np.float32, copy=False)

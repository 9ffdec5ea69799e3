"""Host side of norm.cu: RMSNorm of rows and heads, fused with a residual add or a quantisation."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.ops import f32, i32
from app.engine.kernels.runtime import check, launch


def norm_threads(d: int) -> int:
    """Threads of a block that norms one row of d."""
    return 64 if d <= 512 else 256 if d <= 4096 else 512


def rms_norm(x: Any, weight: Any, out: Any, eps: float, q8: Any = None) -> None:
    """out = x / sqrt(mean(x^2) + eps) * weight over rows of x [n, d] (out may be x); q8: out quantised into
    these mmvq.QuantizedRows as well (mmvq.cu's input, in the same launch)."""
    n, d = x.shape
    check("rms_norm.x", x, (n, d), "float32")
    check("rms_norm.weight", weight, (d,), "float32")
    check("rms_norm.out", out, (n, d), "float32")
    args = (x, weight, out, i32(d), f32(eps))
    if q8 is None:
        launch("norm", "rms_norm_f32", (n,), (norm_threads(d),), args)
    else:
        q8_args = q8.output_args("rms_norm", n, d)
        launch("norm", "rms_norm_q8_f32", (n,), (norm_threads(d),), (*args, *q8_args))


def rms_norm_heads(x: Any, weight: Any, out: Any, eps: float) -> None:
    """Gemma3/Qwen3 per-head q/k norm: each [head_dim] row of x [n, heads, head_dim] (out may be x)."""
    n, heads, hd = x.shape
    check("rms_norm_heads.x", x, (n, heads, hd), "float32")
    check("rms_norm_heads.weight", weight, (hd,), "float32")
    check("rms_norm_heads.out", out, (n, heads, hd), "float32")
    launch("norm", "rms_norm_f32", (n * heads,), (norm_threads(hd),), (x, weight, out, i32(hd), f32(eps)))


def add_rms_norm(x: Any, residual: Any, weight: Any, out: Any, eps: float) -> None:
    """residual += x, then out = rms_norm(residual) * weight; all [n, d] (out may be x or residual)."""
    n, d = x.shape
    check("add_rms_norm.x", x, (n, d), "float32")
    check("add_rms_norm.residual", residual, (n, d), "float32")
    check("add_rms_norm.weight", weight, (d,), "float32")
    check("add_rms_norm.out", out, (n, d), "float32")
    launch("norm", "add_rms_norm_f32", (n,), (norm_threads(d),), (x, residual, weight, out, i32(d), f32(eps)))


def rms_norm_add_rms_norm(
    x: Any, w_post: Any, residual: Any, w_next: Any, out: Any, eps: float, q8: Any = None
) -> None:
    """Gemma's sublayer boundary in one launch: residual += rms_norm(x) * w_post, then out =
    rms_norm(residual) * w_next; all [n, d]. Bit for bit rms_norm, add, rms_norm. q8: as rms_norm's."""
    n, d = x.shape
    check("rms_norm_add_rms_norm.x", x, (n, d), "float32")
    check("rms_norm_add_rms_norm.w_post", w_post, (d,), "float32")
    check("rms_norm_add_rms_norm.residual", residual, (n, d), "float32")
    check("rms_norm_add_rms_norm.w_next", w_next, (d,), "float32")
    check("rms_norm_add_rms_norm.out", out, (n, d), "float32")
    args = (x, w_post, residual, w_next, out, i32(d), f32(eps))
    if q8 is None:
        launch("norm", "rms_norm_add_rms_norm_f32", (n,), (norm_threads(d),), args)
    else:
        q8_args = q8.output_args("rms_norm_add_rms_norm", n, d)
        launch("norm", "rms_norm_add_rms_norm_q8_f32", (n,), (norm_threads(d),), (*args, *q8_args))

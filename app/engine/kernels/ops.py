"""Host side of the norm, RoPE, attention, element-wise and argmax kernels: checked, allocation-free launches.

(Over 500 lines: one checked wrapper per kernel entry point of six sources, kept together.)

Every wrapper checks shapes and dtypes (`kernels.check`), then launches on the current stream: outputs and
scratch are passed in, so a whole decode or verify step can be captured once as a CUDA graph and replayed.
Nothing here reads a length or a position on the host: positions live in a device int32 array that the
caller refills before each replay, and attention derives what each query sees from them.
CuPy is imported only where arrays are allocated (`KVCache`, `Workspace`), so this module imports without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError, check, launch, warp_size

# Shared with the kernels through runtime.KERNEL_CONSTANTS (their -D defines).
ATTN_THREADS = KERNEL_CONSTANTS["FS_ATTN_THREADS"]
ATTN_MAX_SPLITS = KERNEL_CONSTANTS["FS_ATTN_MAX_SPLITS"]
ATTN_COMBINE_THREADS = KERNEL_CONSTANTS["FS_ATTN_COMBINE_THREADS"]
ATTN_TILE_FLOATS = KERNEL_CONSTANTS["FS_ATTN_TILE_FLOATS"]  # query vectors per block: this / head_dim
ARGMAX_THREADS = KERNEL_CONSTANTS["FS_ARGMAX_THREADS"]
# The final top-k pass holds a row's parts x k candidates in one block: at most TOPK_SLICE of them.
TOPK_SLICE = ARGMAX_THREADS * KERNEL_CONSTANTS["FS_TOPK_PER_THREAD"]

ATTN_HEAD_DIMS = (64, 128, 256)  # the attention_split_hd<HD> entry points
# Attention blocks per streaming multiprocessor to aim for when splitting the context, and the default cap
# on splits (their partials are [splits, rows, heads, head_dim] floats of workspace).
ATTN_BLOCKS_PER_SM = 4
ATTN_DEFAULT_MAX_SPLITS = 128
# A slice of 4096 logits per argmax block: 64 blocks per row of gemma's 262144-token vocabulary, 38 of
# Qwen's 151936.
ARGMAX_PER_BLOCK = 4096
ELEMENT_THREADS = 256
TOPK_MAX = 64
# Blocks per token of qk_norm_rope_store (native/qkv.cu): each takes every QKV_HEAD_BLOCKS-th head and forms
# the rotation angles once for them.
QKV_HEAD_BLOCKS = 8


def _cupy() -> Any:
    import cupy

    return cupy


def _i32(value: int) -> np.int32:
    return np.int32(value)


def _f32(value: float) -> np.float32:
    return np.float32(value)


def _blocks(count: int, per_block: int) -> int:
    return (count + per_block - 1) // per_block


def _norm_threads(d: int) -> int:
    return 64 if d <= 512 else 256 if d <= 4096 else 512


def _attention_groups(n: int, n_head: int, n_kv: int, head_dim: int) -> int:
    return _blocks(n * (n_head // n_kv), ATTN_TILE_FLOATS // head_dim)


def _q8_args(name: str, q8: Any, n: int, d: int) -> tuple:
    """The quantised-output arguments of a _q8 entry point (q8: an mmvq.QuantizedRows of width d), which
    then holds n rows."""
    if q8.n_in != d or not 1 <= n <= q8.rows:
        raise KernelError(f"{name}: {n} rows of {d} into quantised rows of {q8.n_in} (at most {q8.rows})")
    q8.n = n
    return (q8.xq, q8.xd, q8.xs)


class KVCache:
    """Per-layer K and V caches, f16 (llama.cpp's default cache type), each [n_ctx, n_head_kv, head_dim].

    Row `pos` holds the token at position `pos`; rolling back is just storing over it later, since attention
    never looks past a query's own position.
    """

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> None:
        cupy = _cupy()
        shape = (n_ctx, n_head_kv, head_dim)
        self.n_ctx = n_ctx
        self.k = [cupy.zeros(shape, dtype=cupy.float16) for _ in range(n_layer)]
        self.v = [cupy.zeros(shape, dtype=cupy.float16) for _ in range(n_layer)]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (*self.k, *self.v))


class Workspace:
    """Scratch of the two-pass kernels of one model, allocated once: attention and argmax partials.

    Attention partials: o [max_splits, max_rows, n_head, head_dim] and (max, sum) pairs [max_splits,
    max_rows, n_head, 2]; a launch with n rows and s splits uses the first s * n rows' worth. The split count
    depends only on the launch shape and the GPU, never on the context length, so it is fixed in a graph.
    """

    def __init__(
        self,
        *,
        max_rows: int,
        n_head: int,
        head_dim: int,
        vocab: int,
        max_splits: int = ATTN_DEFAULT_MAX_SPLITS,
    ) -> None:
        if not 1 <= max_splits <= ATTN_MAX_SPLITS:
            raise KernelError(f"attention splits {max_splits} outside 1..{ATTN_MAX_SPLITS}")
        cupy = _cupy()
        self.max_rows = max_rows
        self.n_head = n_head
        self.head_dim = head_dim
        self.vocab = vocab
        self.max_splits = max_splits
        self.sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self.attn_o = cupy.empty(max_splits * max_rows * n_head * head_dim, dtype=cupy.float32)
        self.attn_ml = cupy.empty(max_splits * max_rows * n_head * 2, dtype=cupy.float32)
        self.attn_active = cupy.zeros(1, dtype=cupy.int32)  # leading splits that got keys, for the combine
        self.argmax_parts = _blocks(vocab, ARGMAX_PER_BLOCK)
        self.argmax_val = cupy.empty(max_rows * self.argmax_parts, dtype=cupy.float32)
        self.argmax_idx = cupy.empty(max_rows * self.argmax_parts, dtype=cupy.int32)
        self.topk_parts = _blocks(vocab, TOPK_SLICE)
        self.topk_max = min(TOPK_MAX, TOPK_SLICE // self.topk_parts, vocab)
        self.topk_val = cupy.empty(max_rows * self.topk_parts * self.topk_max, dtype=cupy.float32)
        self.topk_idx = cupy.empty(max_rows * self.topk_parts * self.topk_max, dtype=cupy.int32)

    def attention_splits(self, n_kv: int, groups: int) -> int:
        """Context splits of one attention launch: enough blocks to fill the GPU, within max_splits."""
        return max(1, min(self.max_splits, _blocks(ATTN_BLOCKS_PER_SM * self.sm_count, n_kv * groups)))


# --- norms -------------------------------------------------------------------------------------------------


def rms_norm(x: Any, weight: Any, out: Any, eps: float, q8: Any = None) -> None:
    """out = x / sqrt(mean(x^2) + eps) * weight over rows of x [n, d] (out may be x); q8: out quantised into
    these QuantizedRows as well (mmvq.cu's input, in the same launch)."""
    n, d = x.shape
    check("rms_norm.x", x, (n, d), "float32")
    check("rms_norm.weight", weight, (d,), "float32")
    check("rms_norm.out", out, (n, d), "float32")
    args = (x, weight, out, _i32(d), _f32(eps))
    if q8 is None:
        launch("norm", "rms_norm_f32", (n,), (_norm_threads(d),), args)
    else:
        launch("norm", "rms_norm_q8_f32", (n,), (_norm_threads(d),), (*args, *_q8_args("rms_norm", q8, n, d)))


def rms_norm_heads(x: Any, weight: Any, out: Any, eps: float) -> None:
    """Gemma3/Qwen3 per-head q/k norm: each [head_dim] row of x [n, heads, head_dim] (out may be x)."""
    n, heads, hd = x.shape
    check("rms_norm_heads.x", x, (n, heads, hd), "float32")
    check("rms_norm_heads.weight", weight, (hd,), "float32")
    check("rms_norm_heads.out", out, (n, heads, hd), "float32")
    launch("norm", "rms_norm_f32", (n * heads,), (_norm_threads(hd),), (x, weight, out, _i32(hd), _f32(eps)))


def add_rms_norm(x: Any, residual: Any, weight: Any, out: Any, eps: float) -> None:
    """residual += x, then out = rms_norm(residual) * weight; all [n, d] (out may be x or residual)."""
    n, d = x.shape
    check("add_rms_norm.x", x, (n, d), "float32")
    check("add_rms_norm.residual", residual, (n, d), "float32")
    check("add_rms_norm.weight", weight, (d,), "float32")
    check("add_rms_norm.out", out, (n, d), "float32")
    launch(
        "norm", "add_rms_norm_f32", (n,), (_norm_threads(d),), (x, residual, weight, out, _i32(d), _f32(eps))
    )


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
    args = (x, w_post, residual, w_next, out, _i32(d), _f32(eps))
    if q8 is None:
        launch("norm", "rms_norm_add_rms_norm_f32", (n,), (_norm_threads(d),), args)
    else:
        q8_args = _q8_args("rms_norm_add_rms_norm", q8, n, d)
        launch("norm", "rms_norm_add_rms_norm_q8_f32", (n,), (_norm_threads(d),), (*args, *q8_args))


# --- rope --------------------------------------------------------------------------------------------------


def _rope_launch(
    q: Any,
    k: Any,
    hk: int,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float,
    n_rot: int | None,
    freq_factors: Any,
) -> None:
    n, hq, hd = q.shape
    n_rot = hd if n_rot is None else n_rot
    if n_rot % 2 or not 0 < n_rot <= hd:
        raise KernelError(f"rope: n_rot {n_rot} must be even and within head_dim {hd}")
    half = n_rot // 2
    if freq_factors is not None:
        check("rope.freq_factors", freq_factors, (half,), "float32")
    args = (
        q,
        k,
        positions,
        freq_factors,
        _i32(hq),
        _i32(hk),
        _i32(hd),
        _i32(n_rot),
        _i32(hq * hd),
        _i32(hk * hd),
        np.float64(freq_base),
        np.float64(freq_scale),
        _i32(1 if neox else 0),
    )
    launch("rope", "rope_f32", (n,), (half, max(1, 256 // half)), args)


def rope(
    x: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """Rotate x [n, heads, head_dim] in place, as reference.rope; positions: device int32 [n]."""
    n, heads, hd = x.shape
    check("rope.x", x, (n, heads, hd), "float32")
    check("rope.positions", positions, (n,), "int32")
    _rope_launch(x, x, 0, positions, freq_base, neox, freq_scale, n_rot, freq_factors)


def rope_qk(
    q: Any,
    k: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """Rotate q [n, n_head, hd] and k [n, n_head_kv, hd] in place in one launch."""
    n, hq, hd = q.shape
    hk = k.shape[1]
    check("rope_qk.q", q, (n, hq, hd), "float32")
    check("rope_qk.k", k, (n, hk, hd), "float32")
    check("rope_qk.positions", positions, (n,), "int32")
    _rope_launch(q, k, hk, positions, freq_base, neox, freq_scale, n_rot, freq_factors)


# --- KV cache and attention --------------------------------------------------------------------------------


def kv_store(k: Any, v: Any, positions: Any, cache_k: Any, cache_v: Any) -> None:
    """Store k, v [n, n_head_kv, hd] (float32) as f16 at cache rows positions[i] (device int32 [n])."""
    n, hkv, hd = k.shape
    n_ctx = cache_k.shape[0]
    check("kv_store.k", k, (n, hkv, hd), "float32")
    check("kv_store.v", v, (n, hkv, hd), "float32")
    check("kv_store.positions", positions, (n,), "int32")
    check("kv_store.cache_k", cache_k, (n_ctx, hkv, hd), "float16")
    check("kv_store.cache_v", cache_v, (n_ctx, hkv, hd), "float16")
    launch(
        "attention",
        "kv_store_f16",
        (n,),
        (ELEMENT_THREADS,),
        (k, v, positions, cache_k, cache_v, _i32(hkv * hd), _i32(n_ctx)),
    )


def _row_view(name: str, a: Any, n: int, width: int) -> int:
    """Row stride (elements) of a float32 [n, width] device array whose rows are contiguous, such as a
    column slice of a fused projection's output."""
    check(name, a, (n, width), "float32", rows=True)
    return a.strides[0] // 4


def qk_norm_rope_store(
    q_in: Any,
    k_in: Any,
    v_in: Any,
    positions: Any,
    freq_base: float,
    neox: bool,
    q_out: Any,
    cache_k: Any,
    cache_v: Any,
    *,
    q_norm: Any = None,
    k_norm: Any = None,
    eps: float = 0.0,
    freq_scale: float = 1.0,
    n_rot: int | None = None,
    freq_factors: Any = None,
) -> None:
    """In one launch: optional per-head RMSNorm of q and k (q_norm, k_norm [hd]), RoPE, q into q_out
    [n, n_head, hd], and k, v stored as f16 at cache rows positions[i], as rms_norm_heads, rope_qk and
    kv_store do. q_in [n, n_head * hd], k_in and v_in [n, n_head_kv * hd]: rows of contiguous elements,
    which may be column slices of one fused q|k|v projection."""
    n, hq, hd = q_out.shape
    n_ctx, hk = cache_k.shape[:2]
    check("qk_norm_rope_store.q_out", q_out, (n, hq, hd), "float32")
    check("qk_norm_rope_store.cache_k", cache_k, (n_ctx, hk, hd), "float16")
    check("qk_norm_rope_store.cache_v", cache_v, (n_ctx, hk, hd), "float16")
    check("qk_norm_rope_store.positions", positions, (n,), "int32")
    strides = [
        _row_view(f"qk_norm_rope_store.{name}", a, n, heads * hd)
        for name, a, heads in (("q_in", q_in, hq), ("k_in", k_in, hk), ("v_in", v_in, hk))
    ]
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None:
            check(f"qk_norm_rope_store.{name}", w, (hd,), "float32")
    n_rot = hd if n_rot is None else n_rot
    if n_rot % 2 or not 0 < n_rot <= hd or hd % 2:
        raise KernelError(f"qk_norm_rope_store: n_rot {n_rot} must be even and within head_dim {hd}")
    if freq_factors is not None:
        check("qk_norm_rope_store.freq_factors", freq_factors, (n_rot // 2,), "float32")
    null = np.uint64(0)
    args = (
        np.uint64(q_in.data.ptr),
        np.uint64(k_in.data.ptr),
        np.uint64(v_in.data.ptr),
        *(_i32(s) for s in strides),
        null if q_norm is None else q_norm,
        null if k_norm is None else k_norm,
        _f32(eps),
        positions,
        null if freq_factors is None else freq_factors,
        q_out,
        cache_k,
        cache_v,
        _i32(hq),
        _i32(hk),
        _i32(hd),
        _i32(n_rot),
        _i32(n_ctx),
        np.float64(freq_base),
        np.float64(freq_scale),
        _i32(1 if neox else 0),
    )
    warp = warp_size()
    threads = -(-(hd // 2) // warp) * warp  # whole warps, for the block sum
    launch("qkv", "qk_norm_rope_store_f32", (n, min(hq + hk, QKV_HEAD_BLOCKS)), (threads,), args)


def attention(
    q: Any,
    cache_k: Any,
    cache_v: Any,
    positions: Any,
    scale: float,
    out: Any,
    workspace: Workspace,
    window: int = 0,
    n_splits: int | None = None,
) -> None:
    """Causal attention of q [n, n_head, hd] (query i at positions[i]) over the f16 cache, into out.

    Query i sees cache rows j <= positions[i], and only p - j < window when window > 0; head h reads kv head
    h // (n_head // n_head_kv). The kernels split the keys that the positions call for over n_splits blocks
    per kv head (default: workspace.attention_splits), so the launch does not depend on the current length
    and replays from a graph with new positions. Positions must lie in [0, n_ctx).
    """
    n, n_head, hd = q.shape
    n_ctx, n_kv = cache_k.shape[:2]
    check("attention.q", q, (n, n_head, hd), "float32")
    check("attention.cache_k", cache_k, (n_ctx, n_kv, hd), "float16")
    check("attention.cache_v", cache_v, (n_ctx, n_kv, hd), "float16")
    check("attention.positions", positions, (n,), "int32")
    check("attention.out", out, (n, n_head, hd), "float32")
    if hd not in ATTN_HEAD_DIMS:
        raise KernelError(f"attention: head_dim {hd} not in {ATTN_HEAD_DIMS}")
    if n_kv == 0 or n_head % n_kv:
        raise KernelError(f"attention: {n_head} heads do not share {n_kv} kv heads evenly")
    groups = _attention_groups(n, n_head, n_kv, hd)
    splits = workspace.attention_splits(n_kv, groups) if n_splits is None else n_splits
    if not 1 <= splits <= workspace.max_splits or workspace.attn_o.size < splits * n * n_head * hd:
        raise KernelError(
            f"attention: workspace for {workspace.max_splits} splits x {workspace.max_rows} rows x "
            f"{workspace.n_head} heads x {workspace.head_dim}, asked for {splits} x {n} x {n_head} x {hd}"
        )
    launch(
        "attention",
        f"attention_split_hd{hd}",
        (splits, n_kv, groups),
        (ATTN_THREADS,),
        (
            q,
            cache_k,
            cache_v,
            positions,
            workspace.attn_o,
            workspace.attn_ml,
            workspace.attn_active,
            _i32(n),
            _i32(n_head),
            _i32(n_kv),
            _i32(n_ctx),
            _i32(window),
            _f32(scale),
        ),
    )
    launch(
        "attention",
        "attention_combine",
        (n * n_head,),
        (ATTN_COMBINE_THREADS,),
        (
            workspace.attn_o,
            workspace.attn_ml,
            workspace.attn_active,
            out,
            _i32(splits),
            _i32(n * n_head),
            _i32(hd),
        ),
    )


# --- element-wise ------------------------------------------------------------------------------------------


def _gate(name: str, kernel: str, gate: Any, up: Any, out: Any, q8: Any = None) -> None:
    n, ff = out.shape
    check(f"{name}.out", out, (n, ff), "float32")
    stride = _row_view(f"{name}.gate", gate, n, ff)
    if _row_view(f"{name}.up", up, n, ff) != stride:
        raise KernelError(f"{name}: gate and up rows lie {stride} and {up.strides[0] // 4} apart, not alike")
    args = (np.uint64(gate.data.ptr), np.uint64(up.data.ptr), out, _i32(ff), _i32(stride))
    if q8 is not None:
        kernel, args = kernel.replace("_f32", "_q8_f32"), (*args, *_q8_args(name, q8, n, ff))
    launch("activation", kernel, (_blocks(ff, ELEMENT_THREADS), n), (ELEMENT_THREADS,), args)


def _packed_halves(name: str, gate_up: Any) -> tuple[Any, Any]:
    n, ff2 = gate_up.shape
    check(f"{name}.gate_up", gate_up, (n, ff2), "float32")
    if ff2 % 2:
        raise KernelError(f"{name}: gate_up width {ff2} is odd")
    return gate_up[:, : ff2 // 2], gate_up[:, ff2 // 2 :]


def silu_gate(gate: Any, up: Any, out: Any, q8: Any = None) -> None:
    """out = silu(gate) * up; all [n, ff] (out may be gate or up). gate and up may be column slices (rows
    of contiguous elements) with one row stride, such as the halves of a fused gate/up projection. q8: out
    quantised into these QuantizedRows as well (the down projection's input for mmvq.cu)."""
    _gate("silu_gate", "silu_gate_f32", gate, up, out, q8)


def gelu_tanh_gate(gate: Any, up: Any, out: Any, q8: Any = None) -> None:
    """out = gelu_tanh(gate) * up; as silu_gate."""
    _gate("gelu_tanh_gate", "gelu_tanh_gate_f32", gate, up, out, q8)


def silu_gate_packed(gate_up: Any, out: Any) -> None:
    """out [n, ff] = silu(gate_up[:, :ff]) * gate_up[:, ff:], for a fused gate/up projection."""
    silu_gate(*_packed_halves("silu_gate_packed", gate_up), out)


def gelu_tanh_gate_packed(gate_up: Any, out: Any) -> None:
    """out [n, ff] = gelu_tanh(gate_up[:, :ff]) * gate_up[:, ff:], for a fused gate/up projection."""
    gelu_tanh_gate(*_packed_halves("gelu_tanh_gate_packed", gate_up), out)


def add(a: Any, b: Any, out: Any) -> None:
    """out = a + b, element-wise over same-shaped float32 arrays (out may be a or b)."""
    check("add.a", a, a.shape, "float32")
    check("add.b", b, a.shape, "float32")
    check("add.out", out, a.shape, "float32")
    launch(
        "activation",
        "add_f32",
        (_blocks(a.size, ELEMENT_THREADS),),
        (ELEMENT_THREADS,),
        (a, b, out, _i32(a.size)),
    )


def scale(x: Any, s: float, out: Any) -> None:
    """out = x * s (out may be x)."""
    check("scale.x", x, x.shape, "float32")
    check("scale.out", out, x.shape, "float32")
    launch(
        "activation",
        "scale_f32",
        (_blocks(x.size, ELEMENT_THREADS),),
        (ELEMENT_THREADS,),
        (x, out, _f32(s), _i32(x.size)),
    )


# --- sampling ----------------------------------------------------------------------------------------------


def argmax(logits: Any, out: Any, workspace: Workspace) -> None:
    """out[i] = numpy.argmax(logits[i]) for logits [n, vocab] float32, out [n] int32 (first of ties)."""
    n, vocab = logits.shape
    check("argmax.logits", logits, (n, vocab), "float32")
    check("argmax.out", out, (n,), "int32")
    parts = _blocks(vocab, ARGMAX_PER_BLOCK)
    if workspace.argmax_val.size < n * parts:
        raise KernelError(
            f"argmax: workspace for {workspace.max_rows} rows of {workspace.vocab}, asked for {n} of {vocab}"
        )
    launch(
        "sample",
        "argmax_partial_f32",
        (parts, n),
        (ARGMAX_THREADS,),
        (logits, workspace.argmax_val, workspace.argmax_idx, _i32(vocab), _i32(ARGMAX_PER_BLOCK)),
    )
    launch(
        "sample",
        "argmax_final_f32",
        (n,),
        (ARGMAX_THREADS,),
        (workspace.argmax_val, workspace.argmax_idx, out, _i32(parts)),
    )


def top_k(logits: Any, k: int, out_val: Any, out_idx: Any, workspace: Workspace) -> None:
    """The k best logits of each row (values and ids, best first; ties to the lower id, as argmax
    repeated) of logits [n, vocab] into out_val [n, k] float32 and out_idx [n, k] int32."""
    n, vocab = logits.shape
    check("top_k.logits", logits, (n, vocab), "float32")
    check("top_k.out_val", out_val, (n, k), "float32")
    check("top_k.out_idx", out_idx, (n, k), "int32")
    if not 1 <= k <= workspace.topk_max or vocab != workspace.vocab or n > workspace.max_rows:
        raise KernelError(
            f"top_k: k={k} of {n} rows of {vocab}; the workspace takes k <= {workspace.topk_max} of "
            f"{workspace.max_rows} rows of {workspace.vocab}"
        )
    parts = workspace.topk_parts
    launch(
        "sample",
        "topk_partial_f32",
        (parts, n),
        (ARGMAX_THREADS,),
        (logits, workspace.topk_val, workspace.topk_idx, _i32(vocab), _i32(k)),
    )
    launch(
        "sample",
        "topk_final_f32",
        (n,),
        (ARGMAX_THREADS,),
        (workspace.topk_val, workspace.topk_idx, out_val, out_idx, _i32(parts), _i32(k)),
    )

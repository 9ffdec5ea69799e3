"""Host side of attention.cu: the f16 KV cache, its store, and attention split over the context.

Nothing here reads a length or a position on the host: positions live in a device int32 array that the
caller refills before each replay of a captured graph, and the kernels derive what each query sees from
them.
"""

from __future__ import annotations

from typing import Any

from app.engine.kernels.ops import ELEMENT_THREADS, blocks, cupy_module, f32, i32
from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError, check, launch

# Shared with the kernels through runtime.KERNEL_CONSTANTS (their -D defines).
ATTN_THREADS = KERNEL_CONSTANTS["FS_ATTN_THREADS"]
ATTN_MAX_SPLITS = KERNEL_CONSTANTS["FS_ATTN_MAX_SPLITS"]
ATTN_COMBINE_THREADS = KERNEL_CONSTANTS["FS_ATTN_COMBINE_THREADS"]
ATTN_TILE_FLOATS = KERNEL_CONSTANTS["FS_ATTN_TILE_FLOATS"]  # query vectors per block: this / head_dim

ATTN_HEAD_DIMS = (64, 128, 256)  # the attention_split_hd<HD> entry points
# Attention blocks per streaming multiprocessor to aim for when splitting the context, and the default cap
# on splits (their partials are [splits, rows, heads, head_dim] floats of workspace).
ATTN_BLOCKS_PER_SM = 4
ATTN_DEFAULT_MAX_SPLITS = 128


class KVCache:
    """Per-layer K and V caches on the device, f16 (llama.cpp's default cache type), each [n_ctx, n_head_kv,
    head_dim].

    Row `pos` holds the token at position `pos`; rolling back is just storing over it later, since attention
    never looks past a query's own position (the caller keeps the length).
    """

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> None:
        cupy = cupy_module()
        shape = (n_ctx, n_head_kv, head_dim)
        self.n_ctx = n_ctx
        self.k = [cupy.zeros(shape, dtype=cupy.float16) for _ in range(n_layer)]
        self.v = [cupy.zeros(shape, dtype=cupy.float16) for _ in range(n_layer)]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (*self.k, *self.v))


class AttentionWorkspace:
    """Scratch of the two-pass attention of one model, allocated once: o [max_splits, max_rows, n_head,
    head_dim] and (max, sum) pairs [max_splits, max_rows, n_head, 2].

    A launch with n rows and s splits uses the first s * n rows' worth. The split count depends only on the
    launch shape and the GPU, never on the context length, so it is fixed in a graph.
    """

    def __init__(
        self, *, max_rows: int, n_head: int, head_dim: int, max_splits: int = ATTN_DEFAULT_MAX_SPLITS
    ) -> None:
        if not 1 <= max_splits <= ATTN_MAX_SPLITS:
            raise KernelError(f"attention splits {max_splits} outside 1..{ATTN_MAX_SPLITS}")
        cupy = cupy_module()
        self.max_rows = max_rows
        self.n_head = n_head
        self.head_dim = head_dim
        self.max_splits = max_splits
        self.sm_count = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
        self.attn_o = cupy.empty(max_splits * max_rows * n_head * head_dim, dtype=cupy.float32)
        self.attn_ml = cupy.empty(max_splits * max_rows * n_head * 2, dtype=cupy.float32)
        self.attn_active = cupy.zeros(1, dtype=cupy.int32)  # leading splits that got keys, for the combine

    def attention_splits(self, n_kv: int, groups: int) -> int:
        """Context splits of one attention launch: enough blocks to fill the GPU, within max_splits."""
        return max(1, min(self.max_splits, blocks(ATTN_BLOCKS_PER_SM * self.sm_count, n_kv * groups)))


def _attention_groups(n: int, n_head: int, n_kv: int, head_dim: int) -> int:
    return blocks(n * (n_head // n_kv), ATTN_TILE_FLOATS // head_dim)


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
        (k, v, positions, cache_k, cache_v, i32(hkv * hd), i32(n_ctx)),
    )


def attention(
    q: Any,
    cache_k: Any,
    cache_v: Any,
    positions: Any,
    scale: float,
    out: Any,
    workspace: AttentionWorkspace,
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
            i32(n),
            i32(n_head),
            i32(n_kv),
            i32(n_ctx),
            i32(window),
            f32(scale),
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
            i32(splits),
            i32(n * n_head),
            i32(hd),
        ),
    )

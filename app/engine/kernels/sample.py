"""Host side of sample.cu: argmax and top-k of rows of logits, in two passes over vocabulary slices."""

from __future__ import annotations

from typing import Any

from app.engine.kernels.ops import blocks, cupy_module, i32
from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError, check, launch

# Shared with the kernels through runtime.KERNEL_CONSTANTS (their -D defines).
ARGMAX_THREADS = KERNEL_CONSTANTS["FS_ARGMAX_THREADS"]
# The final top-k pass holds a row's parts x k candidates in one block: at most TOPK_SLICE of them.
TOPK_SLICE = ARGMAX_THREADS * KERNEL_CONSTANTS["FS_TOPK_PER_THREAD"]

# A slice of 4096 logits per argmax block: 64 blocks per row of gemma's 262144-token vocabulary, 38 of
# Qwen's 151936.
ARGMAX_PER_BLOCK = 4096
TOPK_MAX = 64


class SampleWorkspace:
    """Scratch of the two-pass argmax and top-k over up to max_rows rows of vocab logits, allocated once:
    each slice's best (argmax) or best k (top-k) values and ids."""

    def __init__(self, *, max_rows: int, vocab: int) -> None:
        cupy = cupy_module()
        self.max_rows = max_rows
        self.vocab = vocab
        self.argmax_parts = blocks(vocab, ARGMAX_PER_BLOCK)
        self.argmax_val = cupy.empty(max_rows * self.argmax_parts, dtype=cupy.float32)
        self.argmax_idx = cupy.empty(max_rows * self.argmax_parts, dtype=cupy.int32)
        self.topk_parts = blocks(vocab, TOPK_SLICE)
        self.topk_max = min(TOPK_MAX, TOPK_SLICE // self.topk_parts, vocab)
        self.topk_val = cupy.empty(max_rows * self.topk_parts * self.topk_max, dtype=cupy.float32)
        self.topk_idx = cupy.empty(max_rows * self.topk_parts * self.topk_max, dtype=cupy.int32)


def argmax(logits: Any, out: Any, workspace: SampleWorkspace) -> None:
    """out[i] = numpy.argmax(logits[i]) for logits [n, vocab] float32, out [n] int32 (first of ties)."""
    n, vocab = logits.shape
    check("argmax.logits", logits, (n, vocab), "float32")
    check("argmax.out", out, (n,), "int32")
    parts = blocks(vocab, ARGMAX_PER_BLOCK)
    if workspace.argmax_val.size < n * parts:
        raise KernelError(
            f"argmax: workspace for {workspace.max_rows} rows of {workspace.vocab}, asked for {n} of {vocab}"
        )
    launch(
        "sample",
        "argmax_partial_f32",
        (parts, n),
        (ARGMAX_THREADS,),
        (logits, workspace.argmax_val, workspace.argmax_idx, i32(vocab), i32(ARGMAX_PER_BLOCK)),
    )
    launch(
        "sample",
        "argmax_final_f32",
        (n,),
        (ARGMAX_THREADS,),
        (workspace.argmax_val, workspace.argmax_idx, out, i32(parts)),
    )


def top_k(logits: Any, k: int, out_val: Any, out_idx: Any, workspace: SampleWorkspace) -> None:
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
        (logits, workspace.topk_val, workspace.topk_idx, i32(vocab), i32(k)),
    )
    launch(
        "sample",
        "topk_final_f32",
        (n,),
        (ARGMAX_THREADS,),
        (workspace.topk_val, workspace.topk_idx, out_val, out_idx, i32(parts), i32(k)),
    )

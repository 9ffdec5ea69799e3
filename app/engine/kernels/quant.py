"""The GGUF block layouts the kernels decode (quant.cuh), and the check that a weight is one."""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError


@dataclass(frozen=True)
class QuantType:
    name: str
    kernel: str  # suffix of the kernel names in gemv.cu and mmvq.cu
    block: int  # weights per GGUF block
    type_size: int  # bytes per GGUF block


# ggml_type id -> layout (ggml-common.h); the types quant.cuh decodes.
TYPES: dict[int, QuantType] = {
    0: QuantType("F32", "f32", 1, 4),
    1: QuantType("F16", "f16", 1, 2),
    2: QuantType("Q4_0", "q4_0", 32, 18),
    6: QuantType("Q5_0", "q5_0", 32, 22),
    8: QuantType("Q8_0", "q8_0", 32, 34),
    12: QuantType("Q4_K", "q4_k", 256, 144),
    13: QuantType("Q5_K", "q5_k", 256, 176),
    14: QuantType("Q6_K", "q6_k", 256, 210),
    30: QuantType("BF16", "bf16", 1, 2),
}

# Shared with the kernels through runtime.KERNEL_CONSTANTS (their -D defines).
PIECE = KERNEL_CONSTANTS["FS_PIECE"]  # a row is decoded PIECE weights at a time: `in` must be a multiple
# Slack after the blocks: the kernels read 2-byte-aligned fields as aligned words, up to 2 bytes past a
# field, and round staged copies to 16 bytes.
PAD_BYTES = 16


def type_name(ggml_type: int) -> str:
    t = TYPES.get(ggml_type)
    if t is not None:
        return t.name
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(ggml_type).name
    except (ImportError, ValueError):
        return f"type {ggml_type}"


def check_layout(name: str, ggml_type: int, shape: tuple[int, ...], nbytes: int | None = None) -> QuantType:
    """The layout of a weight the kernels can read, or KernelError saying why this one cannot be."""
    t = TYPES.get(ggml_type)
    if t is None:
        supported = ", ".join(q.name for q in TYPES.values())
        raise KernelError(f"{name}: {type_name(ggml_type)} has no native kernel (supported: {supported})")
    if len(shape) != 2 or min(shape) <= 0:
        raise KernelError(f"{name}: shape {tuple(shape)}, expected a matrix (out, in)")
    n_out, n_in = shape
    if n_in % t.block or n_in % PIECE:
        raise KernelError(
            f"{name}: row length {n_in} is not a multiple of {max(t.block, PIECE)} ({t.name} needs it)"
        )
    want = n_out * (n_in // t.block) * t.type_size
    if nbytes is not None and nbytes != want:
        raise KernelError(f"{name}: {nbytes} bytes, a {t.name} matrix of shape {shape} has {want}")
    return t

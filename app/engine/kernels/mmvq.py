"""Host side of mmvq.cu and mmvq_tc.cu: the int8-activation GEMVs, their packed weights and inputs.

`PackedWeight` uploads a tensor as mmvq.cu reads it (Q4_K/Q5_K as stored; Q6_K, Q8_0, Q4_0, Q5_0 as one
plane per block field, so every wide load is aligned); `QuantizedRows` holds rows of x as int8 codes with
their scales; `quantize` fills it and `matmul` multiplies, both checked and allocation-free (capturable in
a CUDA graph). Which kernel, which entry point and how many warps split a row are decided here, per weight
shape and rows of x (`plan`): mmvq.cu's dp4a kernel, or from TC_MIN_ROWS rows of x on a GPU with int8 tensor
cores, mmvq_tc.cu's mma kernel for the types it reads. CuPy is imported only where device memory is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.kernels.ops import check_device, cupy_module
from app.engine.kernels.quant import PAD_BYTES, TYPES, check_layout
from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError, check, launch, warp_size

LANES = KERNEL_CONSTANTS["FS_MMVQ_LANES"]  # lanes that share an output row
MAX_WARPS = KERNEL_CONSTANTS["FS_MMVQ_MAX_WARPS"]
QUANT_THREADS = KERNEL_CONSTANTS["FS_QUANT_THREADS"]
X_BLOCK = 32  # activations per int8 scale
CHUNK = 32  # weights per chunk: a lane's unit of work

# ggml_type -> the fields of its block as planes (offset in the block, bytes), in the order mmvq.cu's
# FsQdot<T>::locate lays them out; None: read as stored (blocks already 16-byte aligned).
PLANES: dict[int, tuple[tuple[int, int], ...] | None] = {
    12: None,  # Q4_K, 144-byte blocks
    13: None,  # Q5_K, 176-byte blocks
    14: ((0, 128), (128, 64), (192, 16), (208, 2)),  # Q6_K: ql, qh, scales, d
    8: ((0, 0), (2, 32), (0, 2)),  # Q8_0: (no qh), qs, d
    2: ((0, 0), (2, 16), (0, 2)),  # Q4_0: (no qh), qs, d
    6: ((2, 4), (6, 16), (0, 2)),  # Q5_0: qh, qs, d
}

# (rows of x a launch takes at most, rows per lane group) of every entry point of mmvq.cu, FS_MMVQ_TYPE.
INSTANCES: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 2), (2, 1), (2, 2), (4, 2), (8, 2), (8, 4), (12, 2), (12, 4), (17, 2), (17, 4),
)  # fmt: skip
MAX_BATCH = max(b for b, _ in INSTANCES)
# Outputs from which a launch gives each lane group two rows (fewer blocks, activations read half as often).
WIDE_OUT = 8192

# mmvq_tc.cu: the types it reads, its tiles of 8 rows of x (entry points _n1 .. _n3), most warps of a block,
# and the rows of x from which a launch takes it (fewer stay on dp4a: the same bits as decoding, and bound
# by the weights' bytes, not by the dot products).
TC_TYPES = frozenset({12, 14})  # Q4_K, Q6_K
TC_TILES = (1, 2, 3)
TC_MAX_WARPS = KERNEL_CONSTANTS["FS_TC_MAX_WARPS"]
TC_MIN_ROWS = 9
TC_STEP = 64  # elements of a row per warp step
# Warps the GPU should hold at once (16 per SM on a 132-SM H200): a tile's row is split until that many.
TC_WARPS_IN_FLIGHT = 2048


def supported(ggml_type: int) -> bool:
    return ggml_type in PLANES


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def plane_offsets(ggml_type: int, n_out: int, n_in: int) -> list[int]:
    """Byte offset of each plane of a packed weight (mmvq.cu computes the same from n_out and n_in)."""
    fields = PLANES[ggml_type]
    if fields is None:
        return [0]
    blocks = n_out * (n_in // TYPES[ggml_type].block)
    offsets, at = [], 0
    for _, size in fields:
        offsets.append(at)
        at += _align16(blocks * size)
    return offsets


def packed_size(ggml_type: int, n_out: int, n_in: int) -> int:
    """Bytes of the packed weight before the slack (PAD_BYTES) the allocation adds."""
    t = TYPES[ggml_type]
    fields = PLANES[ggml_type]
    blocks = n_out * (n_in // t.block)
    if fields is None:
        return blocks * t.type_size
    return plane_offsets(ggml_type, n_out, n_in)[-1] + _align16(blocks * fields[-1][1])


def pack_planes(raw: np.ndarray, ggml_type: int, shape: tuple[int, int]) -> np.ndarray:
    """GGUF blocks [out, bytes per row] -> the bytes mmvq.cu reads (uint8, PAD_BYTES of zeros at the end)."""
    t = check_layout("weight", ggml_type, shape, int(np.asarray(raw).size))
    if not supported(ggml_type):
        raise KernelError(f"{t.name} has no int8-activation kernel")
    blocks = np.ascontiguousarray(raw).reshape(-1, t.type_size)
    out = np.zeros(packed_size(ggml_type, *shape) + PAD_BYTES, dtype=np.uint8)
    fields = PLANES[ggml_type]
    if fields is None:
        out[: blocks.size] = blocks.reshape(-1)
        return out
    for (offset, size), at in zip(fields, plane_offsets(ggml_type, *shape), strict=True):
        if size:
            out[at : at + blocks.shape[0] * size] = blocks[:, offset : offset + size].reshape(-1)
    return out


def split_warps(n_out: int, n_in: int, warp: int = 32) -> int:
    """Warps that split a row's chunks (1, 2 or 4). From the shape alone, so the order of a row's sums,
    and with it every bit of y, is the same for any rows of x: about 6 chunks per lane or more, and more
    warps where there are few rows to spread over the GPU."""
    chunks = n_in // CHUNK
    per_lane = 6 if n_out // (warp // LANES) >= 256 else 2
    nw = 1
    while nw < MAX_WARPS and chunks >= 2 * nw * LANES * per_lane:
        nw *= 2
    return nw


def instance(n_b: int, n_out: int) -> tuple[int, int]:
    """The (B, R) entry point for a launch over n_b <= MAX_BATCH rows of x: the fewest rows of x that cover
    n_b, two rows per lane group for wide outputs (and always from 4 rows of x on)."""
    if not 1 <= n_b <= MAX_BATCH:
        raise KernelError(f"rows of x {n_b} outside 1..{MAX_BATCH}")
    b = min(b for b, _ in INSTANCES if b >= n_b)
    r = 2 if n_out >= WIDE_OUT or b >= 4 else 1
    return b, r


def kernel_name(ggml_type: int, b: int, r: int) -> str:
    if (b, r) not in INSTANCES:
        raise KernelError(f"mmvq.cu has no entry point for {b} rows of x and {r} rows per group")
    return f"fs_mmvq_{TYPES[ggml_type].kernel}_b{b}_r{r}"


def tc_warps(n_out: int, n_in: int) -> int:
    """Warps that split a 16-row tile's row in mmvq_tc.cu: enough tiles x warps in flight, at least 4 steps
    each, from the shape alone (the order of a row's sums depends on it)."""
    tiles, steps = -(-n_out // 16), n_in // TC_STEP
    nw = 1
    while nw < TC_MAX_WARPS and tiles * nw < TC_WARPS_IN_FLIGHT and steps >= 8 * nw:
        nw *= 2
    return nw


@dataclass(frozen=True)
class Launch:
    """One launch of a matmul: its source and entry point, its shape, over rows first .. first + rows of x."""

    source: str
    kernel: str
    grid: tuple[int]
    block: tuple[int]
    first: int
    rows: int


def plan(
    ggml_type: int,
    shape: tuple[int, int],
    n_b: int,
    warps: int,
    warp: int,
    rows_per_group: int | None = None,
    tensor_cores: bool = False,
    tc_split: int = 1,
) -> list[Launch]:
    """The launches of a matmul over n_b rows of x: MAX_BATCH rows of x to a launch; with tensor_cores
    (the GPU has int8 mma), launches of TC_MIN_ROWS rows or more of a TC_TYPES weight go to mmvq_tc.cu with
    tc_split warps, the others to mmvq.cu with `warps`."""
    out = []
    for first in range(0, n_b, MAX_BATCH):
        rows = min(MAX_BATCH, n_b - first)
        if tensor_cores and ggml_type in TC_TYPES and rows >= TC_MIN_ROWS:
            name = f"fs_mmvq_tc_{TYPES[ggml_type].kernel}_n{-(-rows // 8)}"
            out.append(Launch("mmvq_tc", name, (-(-shape[0] // 16),), (tc_split * 32,), first, rows))
            continue
        b, r = instance(rows, shape[0])
        r = r if rows_per_group is None else rows_per_group
        grid = (-(-shape[0] // (warp // LANES * r)),)
        out.append(Launch("mmvq", kernel_name(ggml_type, b, r), grid, (warps * warp,), first, rows))
    return out


_tensor_cores: dict[int, bool] = {}


def tensor_cores() -> bool:
    """Whether the current GPU runs mmvq_tc.cu's int8 mma: NVIDIA from compute capability 8.0 (Ampere)."""
    cupy = cupy_module()
    device = int(cupy.cuda.Device().id)
    found = _tensor_cores.get(device)
    if found is None:
        hip = bool(getattr(cupy.cuda.runtime, "is_hip", False))
        found = _tensor_cores[device] = not hip and int(cupy.cuda.Device(device).compute_capability) >= 80
    return found


def quantize_grid(n: int, n_in: int) -> tuple[int]:
    """Blocks of fs_quantize_q8 over n rows of n_in: a thread per element."""
    return (-(-n * n_in // QUANT_THREADS),)


class PackedWeight:
    """A GGUF tensor on the device as mmvq.cu reads it, with its type, shape (out, in) and split."""

    def __init__(self, raw: Any, ggml_type: int, shape: tuple[int, int], name: str = "weight") -> None:
        self.name = name
        self.ggml_type = int(ggml_type)
        self.shape = (int(shape[0]), int(shape[1]))
        self.qtype = check_layout(name, self.ggml_type, self.shape, int(np.asarray(raw).size))
        if not supported(self.ggml_type):
            raise KernelError(f"{name}: {self.qtype.name} has no int8-activation kernel")
        if self.shape[1] % CHUNK:
            raise KernelError(f"{name}: row length {self.shape[1]} is not a multiple of {CHUNK}")
        self.nbytes = int(np.asarray(raw).size)  # the GGUF bytes: what a pass reads, planes or not
        host = pack_planes(raw, self.ggml_type, self.shape)
        self.data = cupy_module().asarray(host)
        self.warps = split_warps(*self.shape, warp_size())
        self.tc_split = tc_warps(*self.shape)

    @classmethod
    def from_device(
        cls, data: Any, ggml_type: int, shape: tuple[int, int], name: str = "weight"
    ) -> PackedWeight:
        """Wrap bytes already packed on the device: a uint8 array of packed_size + PAD_BYTES or more."""
        self = cls.__new__(cls)
        self.name = name
        self.ggml_type = int(ggml_type)
        self.shape = (int(shape[0]), int(shape[1]))
        self.qtype = check_layout(name, self.ggml_type, self.shape)
        if not supported(self.ggml_type):
            raise KernelError(f"{name}: {self.qtype.name} has no int8-activation kernel")
        self.nbytes = self.shape[0] * (self.shape[1] // self.qtype.block) * self.qtype.type_size
        check(name, data, (None,), "uint8")
        need = packed_size(self.ggml_type, *self.shape) + PAD_BYTES
        if data.size < need:
            raise KernelError(f"{name}: {data.size} bytes on the device, the packed weight needs {need}")
        self.data = data
        self.warps = split_warps(*self.shape, warp_size())
        self.tc_split = tc_warps(*self.shape)
        return self

    @property
    def n_out(self) -> int:
        return self.shape[0]

    @property
    def n_in(self) -> int:
        return self.shape[1]

    @property
    def alloc_bytes(self) -> int:
        return int(self.data.size)

    def __repr__(self) -> str:
        return f"PackedWeight({self.name!r}, {self.qtype.name}, {self.shape}, warps={self.warps})"


class QuantizedRows:
    """Up to `rows` rows of activations of length n_in as int8 codes (xq) with a scale per 32 (xd) and the
    scaled sum of each 16 codes (xs); `n` rows hold the last `quantize`'s."""

    def __init__(self, rows: int, n_in: int) -> None:
        if n_in % X_BLOCK:
            raise KernelError(f"activations of length {n_in}: not a multiple of {X_BLOCK}")
        cupy = cupy_module()
        self.rows, self.n_in, self.n = int(rows), int(n_in), 0
        self.xq = cupy.zeros((rows, n_in), dtype=cupy.int8)
        self.xd = cupy.zeros((rows, n_in // X_BLOCK), dtype=cupy.float32)
        self.xs = cupy.zeros((rows, n_in // 16), dtype=cupy.float32)

    def output_args(self, name: str, n: int, d: int) -> tuple[Any, Any, Any]:
        """The quantised-output arguments of a kernel's _q8 entry point (norm.cu, activation.cu) that
        writes n rows of width d: these rows, which then hold n."""
        if self.n_in != d or not 1 <= n <= self.rows:
            raise KernelError(
                f"{name}: {n} rows of {d} into quantised rows of {self.n_in} (at most {self.rows})"
            )
        self.n = n
        return (self.xq, self.xd, self.xs)


def quantize(x: Any, qx: QuantizedRows) -> None:
    """qx's first x.shape[0] rows = x [n, n_in] quantised (fs_quantize_q8)."""
    check("x", x, (None, qx.n_in), "float32")
    check_device("x", x)
    n = int(x.shape[0])
    if not 1 <= n <= qx.rows:
        raise KernelError(f"x: {n} rows, the buffer holds 1..{qx.rows}")
    launch(
        "mmvq",
        "fs_quantize_q8",
        quantize_grid(n, qx.n_in),
        (QUANT_THREADS,),
        (x, np.int32(n), np.int32(qx.n_in), qx.xq, qx.xd, qx.xs),
    )
    qx.n = n


def matmul(
    qx: QuantizedRows,
    weight: PackedWeight,
    out: Any,
    bias: Any = None,
    accumulate: bool = False,
    rows_per_group: int | None = None,
    tensor_cores_ok: bool = True,
) -> None:
    """out[b, o] = x^[b, :] . W[o, :] (+ bias[o]) for the qx.n rows last quantised; with `accumulate`,
    out += that (a fused residual add). out: float32 [qx.n, out]. Rows of x go 17 to a launch, each weight
    read once per launch; a row of out is the same whatever the rows of x up to TC_MIN_ROWS (the mma
    kernel rounds its sums in another order). rows_per_group, tensor_cores_ok=False: entry points other
    than the table's (benchmarks, tests)."""
    if qx.n_in != weight.n_in:
        raise KernelError(f"x: rows of {qx.n_in}, the weight takes {weight.n_in}")
    n_b = qx.n
    if n_b == 0:
        raise KernelError("x: no rows quantised")
    check("out", out, (n_b, weight.n_out), "float32")
    check_device("out", out)
    bias_arg: Any = np.uint64(0)
    if bias is not None:
        check("bias", bias, (weight.n_out,), "float32")
        check_device("bias", bias)
        bias_arg = bias
    tc = tensor_cores_ok and tensor_cores()
    steps = plan(
        weight.ggml_type, weight.shape, n_b, weight.warps, warp_size(), rows_per_group, tc, weight.tc_split
    )
    for step in steps:
        rows = slice(step.first, step.first + step.rows)
        launch(
            step.source,
            step.kernel,
            step.grid,
            step.block,
            (
                weight.data,
                qx.xq[rows],
                qx.xd[rows],
                qx.xs[rows],
                out[rows],
                bias_arg,
                np.int32(weight.n_out),
                np.int32(weight.n_in),
                np.int32(step.rows),
                np.int32(1 if accumulate else 0),
            ),
        )

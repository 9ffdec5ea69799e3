"""Host side of gemv.cu: weights as raw GGUF blocks, the float GEMV and the embedding lookup.

`DeviceWeight` uploads a tensor's bytes once (the layouts: kernels.quant); `matmul` and `get_rows` check
shapes and dtypes and launch on the current stream without allocating, so they can be captured in a CUDA
graph. CuPy is imported only where a weight is uploaded, so this module imports without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.ops import check_device, cupy_module
from app.engine.kernels.quant import PAD_BYTES, PIECE, check_layout
from app.engine.kernels.runtime import KERNEL_CONSTANTS, KernelError, check, launch, warp_size

# Shared with the kernels through runtime.KERNEL_CONSTANTS (their -D defines).
GEMV_THREADS = KERNEL_CONSTANTS["FS_GEMV_THREADS"]
GEMV_RPW = KERNEL_CONSTANTS["FS_GEMV_RPW"]  # output rows per warp
MAX_BATCH = KERNEL_CONSTANTS["FS_GEMV_MAX_BATCH"]  # rows of x per launch; more run as several launches
GET_ROWS_THREADS = KERNEL_CONSTANTS["FS_GET_ROWS_THREADS"]
# Shared memory for the staged rows of x: b * xt * 4 bytes, beside the weights' staging buffers (up to
# 27 KiB: FS_GEMV_PF steps of 4 warps x 4 rows), within the 48 KiB a kernel gets without an opt-in. On
# wave64 a tile is at least one step of 1024 elements, up to 32 KiB for 8 rows of x: beside the staging
# of 2 warps (26 KiB) that fits the 64 KiB of an AMD workgroup.
X_TILE_BYTES = 16384


def rows_per_block(warp: int = 32) -> int:
    """Output rows of one GEMV block: its warps (GEMV_THREADS / warp) times GEMV_RPW."""
    return GEMV_THREADS // warp * GEMV_RPW


def x_tile(rows: int, n_in: int, warp: int = 32) -> int:
    """Elements of x staged per tile for a launch over `rows` rows of x: a multiple of the warp's step."""
    step = warp * PIECE
    tile = max(step, X_TILE_BYTES // (4 * rows) // step * step)
    return min(tile, -(-n_in // step) * step)


class DeviceWeight:
    """A GGUF tensor's blocks in device memory (uint8, padded), with its type and logical shape (out, in)."""

    def __init__(self, raw: Any, ggml_type: int, shape: tuple[int, int], name: str = "weight") -> None:
        host = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        self.name = name
        self.ggml_type = int(ggml_type)
        self.shape = (int(shape[0]), int(shape[1]))
        self.qtype = check_layout(name, self.ggml_type, self.shape, host.size)
        self.nbytes = int(host.size)
        cupy = cupy_module()
        alloc = -(-self.nbytes // 16) * 16 + PAD_BYTES
        self.data = cupy.zeros(alloc, dtype=cupy.uint8)
        self.data[: self.nbytes].set(host)

    @classmethod
    def from_device(
        cls, data: Any, ggml_type: int, shape: tuple[int, int], name: str = "weight"
    ) -> DeviceWeight:
        """Wrap blocks already on the device: a uint8 array of the blocks followed by PAD_BYTES or more."""
        self = cls.__new__(cls)
        self.name = name
        self.ggml_type = int(ggml_type)
        self.shape = (int(shape[0]), int(shape[1]))
        self.qtype = check_layout(name, self.ggml_type, self.shape)
        t = self.qtype
        self.nbytes = self.shape[0] * (self.shape[1] // t.block) * t.type_size
        check(name, data, (None,), "uint8")
        if data.size < self.nbytes + PAD_BYTES:
            raise KernelError(
                f"{name}: {data.size} bytes on the device, need {self.nbytes} + {PAD_BYTES} of slack"
            )
        self.data = data
        return self

    @classmethod
    def from_reader_tensor(cls, tensor: Any) -> DeviceWeight:
        """From a `gguf.ReaderTensor` (its shape lists the row length first, as GGUF stores it)."""
        shape = tuple(int(d) for d in reversed(tensor.shape))
        if len(shape) != 2:
            raise KernelError(f"{tensor.name}: shape {shape}, expected a matrix (out, in)")
        return cls(tensor.data, int(tensor.tensor_type), (shape[0], shape[1]), name=tensor.name)

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
        return f"DeviceWeight({self.name!r}, {self.qtype.name}, {self.shape})"


def matmul(x: Any, weight: DeviceWeight, out: Any, bias: Any = None, accumulate: bool = False) -> None:
    """out[b, o] = x[b, :] . W[o, :] (+ bias[o]); with `accumulate`, out += that (a fused residual add).

    x: float32 [b, in]; out: float32 [b, out]; bias: float32 [out] or None. Row i of out does not depend on
    b (same operations in the same order), so a verify pass over k + 1 rows matches decoding row by row.
    """
    check("x", x, (None, weight.n_in), "float32")
    check_device("x", x)
    n_b = int(x.shape[0])
    if n_b == 0:
        raise KernelError("x: no rows")
    check("out", out, (n_b, weight.n_out), "float32")
    check_device("out", out)
    bias_arg: Any = np.uint64(0)
    if bias is not None:
        check("bias", bias, (weight.n_out,), "float32")
        check_device("bias", bias)
        bias_arg = bias
    warp = warp_size()
    grid = (-(-weight.n_out // rows_per_block(warp)),)
    block = (GEMV_THREADS,)
    for c0 in range(0, n_b, MAX_BATCH):
        rows = min(MAX_BATCH, n_b - c0)
        xt = x_tile(rows, weight.n_in, warp)
        x_part = x if rows == n_b else x[c0 : c0 + rows]
        out_part = out if rows == n_b else out[c0 : c0 + rows]
        launch(
            "gemv",
            f"fs_gemv_{weight.qtype.kernel}_b{rows}",
            grid,
            block,
            (
                weight.data,
                np.int64(weight.alloc_bytes),
                x_part,
                out_part,
                bias_arg,
                np.int32(weight.n_out),
                np.int32(weight.n_in),
                np.int32(rows),
                np.int32(xt),
                np.int32(1 if accumulate else 0),
            ),
            shared_mem=rows * xt * 4,
        )


def get_rows(weight: DeviceWeight, ids: Any, out: Any) -> None:
    """out[i, :] = row ids[i] of the weight, dequantised (the token embedding lookup).

    ids: int32 [n] on the device; out: float32 [n, in]. An id outside [0, out) gives a row of NaN.
    """
    check("ids", ids, (None,), "int32")
    check_device("ids", ids)
    n = int(ids.shape[0])
    check("out", out, (n, weight.n_in), "float32")
    check_device("out", out)
    if n == 0:
        return
    launch(
        "gemv",
        f"fs_get_rows_{weight.qtype.kernel}",
        (n,),
        (GET_ROWS_THREADS,),
        (weight.data, ids, out, np.int32(weight.n_out), np.int32(weight.n_in)),
    )

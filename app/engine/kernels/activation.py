"""Host side of activation.cu: the FFN's gated activations, add and scale."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.kernels.ops import ELEMENT_THREADS, blocks, f32, i32, row_stride
from app.engine.kernels.runtime import KernelError, check, launch


def _gate(name: str, kernel: str, gate: Any, up: Any, out: Any, q8: Any = None) -> None:
    n, ff = out.shape
    check(f"{name}.out", out, (n, ff), "float32")
    stride = row_stride(f"{name}.gate", gate, n, ff)
    if row_stride(f"{name}.up", up, n, ff) != stride:
        raise KernelError(f"{name}: gate and up rows lie {stride} and {up.strides[0] // 4} apart, not alike")
    args = (np.uint64(gate.data.ptr), np.uint64(up.data.ptr), out, i32(ff), i32(stride))
    if q8 is not None:
        kernel, args = kernel.replace("_f32", "_q8_f32"), (*args, *q8.output_args(name, n, ff))
    launch("activation", kernel, (blocks(ff, ELEMENT_THREADS), n), (ELEMENT_THREADS,), args)


def _packed_halves(name: str, gate_up: Any) -> tuple[Any, Any]:
    n, ff2 = gate_up.shape
    check(f"{name}.gate_up", gate_up, (n, ff2), "float32")
    if ff2 % 2:
        raise KernelError(f"{name}: gate_up width {ff2} is odd")
    return gate_up[:, : ff2 // 2], gate_up[:, ff2 // 2 :]


def silu_gate(gate: Any, up: Any, out: Any, q8: Any = None) -> None:
    """out = silu(gate) * up; all [n, ff] (out may be gate or up). gate and up may be column slices (rows
    of contiguous elements) with one row stride, such as the halves of a fused gate/up projection. q8: out
    quantised into these mmvq.QuantizedRows as well (the down projection's input for mmvq.cu)."""
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
        (blocks(a.size, ELEMENT_THREADS),),
        (ELEMENT_THREADS,),
        (a, b, out, i32(a.size)),
    )


def scale(x: Any, s: float, out: Any) -> None:
    """out = x * s (out may be x)."""
    check("scale.x", x, x.shape, "float32")
    check("scale.out", out, x.shape, "float32")
    launch(
        "activation",
        "scale_f32",
        (blocks(x.size, ELEMENT_THREADS),),
        (ELEMENT_THREADS,),
        (x, out, f32(s), i32(x.size)),
    )

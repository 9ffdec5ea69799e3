"""Time the native GEMVs per weight type, shape and batch on a GPU: gemv.cu (reference) and mmvq.cu (fast).

Each measurement is one CUDA graph of many matmul calls (so CuPy's ~9 us of host time per launch is not
what gets measured), cycling through enough copies of the weight to overflow the L2 cache (weights come
from device memory, as in a real step); the median over repeats is reported, in us per call and as the
weight bytes read per second against the memory bandwidth (the device's own, or --peak). The fast
kernels' rows of x are quantised once before the graph: their launch (fs_quantize_q8, one per input of a
layer's projections) is timed on its own and reported as its own row.

    python scripts/kernel-bench.py                       # Qwen2.5-7B and gemma-3-270m shapes
    python scripts/kernel-bench.py --models issue23 --types q4_k,q5_k,q6_k,q8_0 --kernels reference,fast
    python scripts/kernel-bench.py --kernels fast --rows-per-group 1,2,4 --json > gemv.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.backend_bench import bound
from app.engine.kernels import gemv, mmvq, quant, runtime

SHAPES = {  # (out, in) of each matrix; the types a Q4_K_M file gives it
    "qwen2.5-7b": [
        ("attn_q/o", 3584, 3584, ("q4_k",)),
        ("attn_k/v", 512, 3584, ("q4_k", "q6_k")),
        ("ffn_gate/up", 18944, 3584, ("q4_k",)),
        ("ffn_down", 3584, 18944, ("q4_k", "q6_k")),
        ("output", 152064, 3584, ("q6_k",)),
    ],
    # the matrices of issue 23 as the native backend launches them at the 7B shape (q/k/v and gate/up fused)
    "issue23": [
        ("attn_qkv", 4608, 3584, ("q4_k",)),
        ("attn_output", 3584, 3584, ("q4_k",)),
        ("ffn_gate+up", 37888, 3584, ("q4_k",)),
        ("ffn_down", 3584, 18944, ("q4_k", "q6_k")),
    ],
    "gemma-3-270m": [
        ("attn_q", 1024, 640, ("q5_0",)),
        ("attn_k/v", 256, 640, ("q5_0", "q8_0")),
        ("attn_output", 640, 1024, ("q4_k",)),
        ("ffn_gate/up", 2048, 640, ("q5_0",)),
        ("ffn_down", 640, 2048, ("q6_k", "q4_k")),
        ("output", 262144, 640, ("q8_0",)),
    ],
}
KERNEL_TYPES = {t.kernel: ggml_type for ggml_type, t in quant.TYPES.items()}
KERNEL_SETS = ("reference", "fast")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen2.5-7b,gemma-3-270m", help=f"shape sets: {', '.join(SHAPES)}")
    ap.add_argument(
        "--types",
        default="file",
        help="'file' (the types a Q4_K_M file uses per matrix), 'all', or a list such as q4_k,q6_k,q8_0",
    )
    ap.add_argument("--batches", default="1,2,4,8,16", help="rows of x per call")
    ap.add_argument(
        "--kernels", default="reference,fast", help="kernel sets: reference (gemv.cu), fast (mmvq.cu)"
    )
    ap.add_argument(
        "--rows-per-group",
        default="",
        help="fast kernels: time these rows per lane group (entry points that exist) besides the table's",
    )
    ap.add_argument(
        "--warps", default="", help="fast kernels: time these warps per block (split-K) besides the table's"
    )
    ap.add_argument("--calls", type=int, default=50, help="matmul calls per timed graph")
    ap.add_argument("--repeats", type=int, default=15, help="timed graph launches; the median is reported")
    ap.add_argument(
        "--cold-bytes", type=float, default=256, help="MiB of weight copies cycled through (>> L2)"
    )
    ap.add_argument(
        "--peak", type=float, default=None, help="memory bandwidth in GB/s to compare with (default: its own)"
    )
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return ap.parse_args(argv)


def _types_for(spec: str, file_types: tuple[str, ...], n_in: int) -> list[str]:
    if spec == "file":
        names = list(file_types)
    elif spec == "all":
        names = list(KERNEL_TYPES)
    else:
        names = [t.strip().lower() for t in spec.split(",") if t.strip()]
    out = []
    for name in names:
        if name not in KERNEL_TYPES:
            raise SystemExit(f"unknown type {name!r}; known: {', '.join(KERNEL_TYPES)}")
        if n_in % max(quant.TYPES[KERNEL_TYPES[name]].block, quant.PIECE) == 0:
            out.append(name)
    return out


# Byte offsets of the f16 scales in each block type (d, and dmin for the K-quants with a min).
SCALE_OFFSETS = {2: (0,), 6: (0,), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def _weights(cupy, ggml_type: int, shape: tuple[int, int], cold_bytes: float, fast: bool) -> list:
    """Copies of a random weight, enough to overflow the L2 cache (the timing does not depend on values;
    the scales are kept small and finite all the same)."""
    t = quant.TYPES[ggml_type]
    nbytes = shape[0] * (shape[1] // t.block) * t.type_size
    copies = max(1, min(64, int(cold_bytes * 2**20 // nbytes) + 1))
    weights = []
    for _ in range(copies):
        data = cupy.random.randint(0, 256, size=nbytes + quant.PAD_BYTES, dtype=cupy.uint8)
        blocks = data[:nbytes].reshape(-1, t.type_size)
        for off in SCALE_OFFSETS.get(ggml_type, ()):  # small finite scales: exponent 8 of 31
            blocks[:, off + 1] = (blocks[:, off + 1] & 0x83) | 0x20
        if not fast:
            weights.append(gemv.DeviceWeight.from_device(data, ggml_type, shape, name="bench"))
            continue
        packed = cupy.asarray(mmvq.pack_planes(cupy.asnumpy(data[:nbytes]), ggml_type, shape))
        del data, blocks
        weights.append(mmvq.PackedWeight.from_device(packed, ggml_type, shape, name="bench"))
    return weights


def _graph_us(cupy, call, calls: int, repeats: int) -> float:
    """Median microseconds per call of `call(i)` over graphs of `calls` calls (eager on HIP)."""
    call(0)
    call(1)  # compile, warm up
    cupy.cuda.get_current_stream().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    graph = None
    with stream:
        if not runtime.is_hip():
            stream.begin_capture()
            for i in range(calls):
                call(i)
            graph = stream.end_capture()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        samples = []
        for _ in range(repeats + 2):
            start.record(stream)
            if graph is not None:
                graph.launch(stream)
            else:
                for i in range(calls):
                    call(i)
            end.record(stream)
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / calls)
    return statistics.median(samples[2:])


def time_matmul(cupy, weights, b: int, calls: int, repeats: int, variant: tuple = (None, None)) -> float:
    """Median microseconds per matmul call (the fast kernels' x quantised once, before the graph); variant:
    the fast kernels' (rows per group, warps), None for the table's."""
    n_out, n_in = weights[0].shape
    x = cupy.random.standard_normal((b, n_in), dtype=cupy.float32)
    out = cupy.empty((b, n_out), dtype=cupy.float32)
    if isinstance(weights[0], mmvq.PackedWeight):
        rows_per_group, warps = variant
        table = weights[0].warps
        for w in weights:
            w.warps = warps or table
        qx = mmvq.QuantizedRows(b, n_in)
        mmvq.quantize(x, qx)
        try:
            return _graph_us(
                cupy,
                lambda i: mmvq.matmul(qx, weights[i % len(weights)], out, rows_per_group=rows_per_group),
                calls,
                repeats,
            )
        finally:
            for w in weights:
                w.warps = table
    return _graph_us(cupy, lambda i: gemv.matmul(x, weights[i % len(weights)], out), calls, repeats)


def time_quantize(cupy, b: int, n_in: int, calls: int, repeats: int) -> float:
    x = cupy.random.standard_normal((b, n_in), dtype=cupy.float32)
    qx = mmvq.QuantizedRows(b, n_in)
    return _graph_us(cupy, lambda i: mmvq.quantize(x, qx), calls, repeats)


def _variants(kernels: str, b: int, weight, extra_r: list[int], extra_w: list[int]) -> list[tuple]:
    """(rows per group, warps) to time for one measurement: (None, None), the table's choice, then each
    extra one that exists with the table's other half."""
    if kernels == "reference":
        return [(None, None)]
    table_b, table_r = mmvq.instance(min(b, mmvq.MAX_BATCH), weight.n_out)
    rows = [(r, None) for r in extra_r if r != table_r and (table_b, r) in mmvq.INSTANCES]
    warps = [(None, w) for w in extra_w if w != weight.warps and 1 <= w <= mmvq.MAX_WARPS]
    return [(None, None), *rows, *warps]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import cupy

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    kernel_sets = [k.strip() for k in args.kernels.split(",") if k.strip()]
    if any(k not in KERNEL_SETS for k in kernel_sets):
        raise SystemExit(f"--kernels: {', '.join(KERNEL_SETS)}, got {args.kernels!r}")
    extra_r = [int(r) for r in args.rows_per_group.split(",") if r.strip()]
    extra_w = [int(w) for w in args.warps.split(",") if w.strip()]
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    limit = bound(args.peak, cupy.cuda.Device().id)
    peak = limit.gb_s or float("nan")  # no bound known: the share prints as nan
    rows = []

    def report(row: dict) -> None:
        rows.append(row)
        if not args.json:
            variant = (
                f"r{row['rows_per_group'] or '-'} w{row['warps'] or '-'}" if row["kernels"] == "fast" else ""
            )
            print(
                f"{row['model']:13} {row['matrix']:12} {row['out']:>6}x{row['in']:<6} {row['type']:5}"
                f" {row['kernels']:9} {variant:5} b={row['b']:<3} {row['us']:9.2f} us"
                f" {row['gb_s']:8.1f} GB/s {100 * row['of_peak']:5.1f}%",
                flush=True,
            )

    quantize_timed: set[tuple[int, int]] = set()
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        if model not in SHAPES:
            raise SystemExit(f"unknown shape set {model!r}; known: {', '.join(SHAPES)}")
        for label, n_out, n_in, file_types in SHAPES[model]:
            for name in _types_for(args.types, file_types, n_in):
                ggml_type = KERNEL_TYPES[name]
                for kernels in kernel_sets:
                    fast = kernels == "fast"
                    if fast and not mmvq.supported(ggml_type):
                        continue
                    weights = _weights(cupy, ggml_type, (n_out, n_in), args.cold_bytes, fast)
                    for b in batches:
                        for variant in _variants(kernels, b, weights[0], extra_r, extra_w):
                            us = time_matmul(cupy, weights, b, args.calls, args.repeats, variant)
                            gbs = weights[0].nbytes / (us * 1e-6) / 1e9
                            table_r = mmvq.instance(min(b, mmvq.MAX_BATCH), n_out)[1] if fast else None
                            report({
                                "model": model, "matrix": label, "out": n_out, "in": n_in,
                                "type": quant.TYPES[ggml_type].name, "kernels": kernels, "b": b,
                                "rows_per_group": variant[0] or table_r,
                                "warps": variant[1] or getattr(weights[0], "warps", None),
                                "table": variant == (None, None),
                                "us": round(us, 2), "weight_bytes": weights[0].nbytes, "gb_s": round(gbs, 1),
                                "of_peak": round(gbs / peak, 3),
                            })  # fmt: skip
                        if fast and (b, n_in) not in quantize_timed:
                            quantize_timed.add((b, n_in))
                            us = time_quantize(cupy, b, n_in, args.calls, args.repeats)
                            moved = b * n_in * (4 + 1) + b * n_in // 32 * 12  # x in, codes and scales out
                            report({
                                "model": model, "matrix": "quantize x", "out": 0, "in": n_in, "type": "f32",
                                "kernels": "quantize", "b": b, "rows_per_group": None, "warps": None,
                                "table": True,
                                "us": round(us, 2), "weight_bytes": moved, "gb_s": round(moved / us / 1e3, 1),
                                "of_peak": round(moved / us / 1e3 / peak, 3),
                            })  # fmt: skip
                    del weights
                    cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        doc = {"device": device, "peak_gb_s": limit.gb_s, "peak_source": limit.source, "results": rows}
        print(json.dumps(doc, indent=1))
    else:
        print(f"device: {device}; peak {peak:.0f} GB/s ({limit.source})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time the native GEMV (app.engine.kernels.qmatmul.matmul) per weight type and batch on a GPU.

Each measurement is one CUDA graph of many matmul calls (so CuPy's ~9 us of host time per launch is not
what gets measured), cycling through enough copies of the weight to overflow the L2 cache (weights come
from device memory, as in a real step); the median over repeats is reported, in us per call and as the
weight bytes read per second against the memory bandwidth (the device's own, or --peak).

    python scripts/kernel-bench.py                       # Qwen2.5-7B and gemma-3-270m shapes
    python scripts/kernel-bench.py --types q4_k,q6_k --batches 1,8 --json > gemv.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.backend_bench import bound
from app.engine.kernels import qmatmul, runtime

SHAPES = {  # (out, in) of each matrix; the types a Q4_K_M file gives it
    "qwen2.5-7b": [
        ("attn_q/o", 3584, 3584, ("q4_k",)),
        ("attn_k/v", 512, 3584, ("q4_k", "q6_k")),
        ("ffn_gate/up", 18944, 3584, ("q4_k",)),
        ("ffn_down", 3584, 18944, ("q4_k", "q6_k")),
        ("output", 152064, 3584, ("q6_k",)),
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
KERNEL_TYPES = {t.kernel: ggml_type for ggml_type, t in qmatmul.TYPES.items()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(SHAPES), help=f"shape sets: {', '.join(SHAPES)}")
    ap.add_argument(
        "--types",
        default="file",
        help="'file' (the types a Q4_K_M file uses per matrix), 'all', or a list such as q4_k,q6_k,q8_0",
    )
    ap.add_argument("--batches", default="1,2,4,8,16", help="rows of x per call")
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
        if n_in % max(qmatmul.TYPES[KERNEL_TYPES[name]].block, qmatmul.PIECE) == 0:
            out.append(name)
    return out


# Byte offsets of the f16 scales in each block type (d, and dmin for the K-quants with a min).
SCALE_OFFSETS = {2: (0,), 6: (0,), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def _weights(cupy, ggml_type: int, shape: tuple[int, int], cold_bytes: float) -> list[qmatmul.DeviceWeight]:
    """Copies of a random weight, enough to overflow the L2 cache (the timing does not depend on values)."""
    t = qmatmul.TYPES[ggml_type]
    nbytes = shape[0] * (shape[1] // t.block) * t.type_size
    copies = max(1, min(64, int(cold_bytes * 2**20 // nbytes) + 1))
    weights = []
    for _ in range(copies):
        data = cupy.random.randint(0, 256, size=nbytes + qmatmul.PAD_BYTES, dtype=cupy.uint8)
        blocks = data[:nbytes].reshape(-1, t.type_size)
        for off in SCALE_OFFSETS.get(ggml_type, ()):  # small finite scales: exponent 8 of 31
            blocks[:, off + 1] = (blocks[:, off + 1] & 0x83) | 0x20
        weights.append(qmatmul.DeviceWeight.from_device(data, ggml_type, shape, name="bench"))
    return weights


def time_matmul(cupy, weights, b: int, calls: int, repeats: int) -> float:
    """Median microseconds per matmul call."""
    n_out, n_in = weights[0].shape
    x = cupy.random.standard_normal((b, n_in), dtype=cupy.float32)
    out = cupy.empty((b, n_out), dtype=cupy.float32)
    for w in weights[:2]:  # compile, warm up
        qmatmul.matmul(x, w, out)
    cupy.cuda.get_current_stream().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    graph = None
    with stream:
        if not runtime.is_hip():
            stream.begin_capture()
            for i in range(calls):
                qmatmul.matmul(x, weights[i % len(weights)], out)
            graph = stream.end_capture()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        samples = []
        for _ in range(repeats + 2):
            start.record(stream)
            if graph is not None:
                graph.launch(stream)
            else:
                for i in range(calls):
                    qmatmul.matmul(x, weights[i % len(weights)], out)
            end.record(stream)
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / calls)
    return statistics.median(samples[2:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import cupy

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    limit = bound(args.peak, cupy.cuda.Device().id)
    peak = limit.gb_s or float("nan")  # no bound known: the share prints as nan
    rows = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        if model not in SHAPES:
            raise SystemExit(f"unknown shape set {model!r}; known: {', '.join(SHAPES)}")
        for label, n_out, n_in, file_types in SHAPES[model]:
            for name in _types_for(args.types, file_types, n_in):
                ggml_type = KERNEL_TYPES[name]
                weights = _weights(cupy, ggml_type, (n_out, n_in), args.cold_bytes)
                for b in batches:
                    us = time_matmul(cupy, weights, b, args.calls, args.repeats)
                    gbs = weights[0].nbytes / (us * 1e-6) / 1e9
                    row = {
                        "model": model,
                        "matrix": label,
                        "out": n_out,
                        "in": n_in,
                        "type": qmatmul.TYPES[ggml_type].name,
                        "b": b,
                        "us": round(us, 2),
                        "weight_bytes": weights[0].nbytes,
                        "gb_s": round(gbs, 1),
                        "of_peak": round(gbs / peak, 3),
                    }
                    rows.append(row)
                    if not args.json:
                        print(
                            f"{model:13} {label:12} {n_out:>6}x{n_in:<6} {row['type']:5} b={b:<3}"
                            f" {us:9.2f} us {gbs:8.1f} GB/s {100 * gbs / peak:5.1f}%",
                            flush=True,
                        )
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

"""Where a native pass spends its time: device time per kernel, launches, graph replay and eager wall time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from app.engine.kernels import runtime

if TYPE_CHECKING:
    from app.engine.backends.native import NativeBackend


def pass_profile(backend: NativeBackend, width: int = 1, repeats: int = 20) -> dict[str, Any]:
    """Where a pass of `width` tokens spends its time: device time per kernel (eager launches, timed by
    events), the sum of those, a graph replay of the same pass, and an eager pass's wall time (host-bound:
    the Python cost of each launch). The cache must hold a prefix; nothing is kept."""
    import cupy

    b = backend
    n_keep = len(b.kv_tokens)
    tokens = (b.kv_tokens or [0])[-width:] * (width // max(len(b.kv_tokens), 1) + 1)
    tokens = tokens[:width]
    b.decode_argmax(tokens, 0)  # records the graph of this width
    b.rollback(n_keep)
    with b.stream:
        with runtime.LaunchProfile() as prof:
            b._forward(width, True)
        b.stream.synchronize()
        kernel_ms = prof.by_kernel()
        t0 = time.perf_counter()
        for _ in range(repeats):
            b._forward(width, True)
        b.stream.synchronize()
        eager_ms = (time.perf_counter() - t0) * 1e3 / repeats
        graph = b._graphs.get((width, True))
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(repeats):
            if graph is not None:
                graph.launch(b.stream)
            else:
                b._forward(width, True)
        end.record()
        end.synchronize()
        replay_ms = cupy.cuda.get_elapsed_time(start, end) / repeats
    total = sum(ms for _, ms in kernel_ms.values())
    return {
        "width": width,
        "kernels": {
            k: {"launches": c, "ms": round(ms, 4)}
            for k, (c, ms) in sorted(kernel_ms.items(), key=lambda i: -i[1][1])
        },
        "kernel_ms": round(total, 4),
        "launches": sum(c for c, _ in kernel_ms.values()),
        "graph_replay_ms": round(replay_ms, 4),
        "eager_ms": round(eager_ms, 4),
    }

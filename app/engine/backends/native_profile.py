"""Where a native pass spends its time: device time per kernel, launches, graph replay and eager wall time."""

from __future__ import annotations

import time
from typing import Any

from app.engine.backends.native_forward import ForwardPass
from app.engine.kernels import runtime


def pass_profile(forward: ForwardPass, width: int = 1, repeats: int = 20) -> dict[str, Any]:
    """Where a pass of `width` tokens spends its time: device time per kernel (eager launches, timed by
    events), the sum of those, a graph replay of the same pass (recorded by a pass of that width before),
    and an eager pass's wall time (host-bound: the Python cost of each launch). The pass runs over the ids
    and positions its last run copied in."""
    import cupy

    f = forward
    with f.stream:
        with runtime.LaunchProfile() as prof:
            f.enqueue(width, True)
        f.stream.synchronize()
        kernel_ms = prof.by_kernel()
        t0 = time.perf_counter()
        for _ in range(repeats):
            f.enqueue(width, True)
        f.stream.synchronize()
        eager_ms = (time.perf_counter() - t0) * 1e3 / repeats
        graph = f.graphs.get((width, True))
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(repeats):
            if graph is not None:
                graph.launch(f.stream)
            else:
                f.enqueue(width, True)
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

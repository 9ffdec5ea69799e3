"""Verify-cost calibration: what target passes of each width cost on this device, measured and cached."""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from app.engine.backends.base import Backend
from app.engine.backends.choice import FILLER

log = logging.getLogger("foresight.calibration")

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 65)
COST_EMA = 0.1  # weight of one measured pass (or drafted token) in a running cost
OUTLIER = 3.0  # a verify that took 3x the estimate (a GC pause, a busy host) does not move it


@dataclass
class VerifyCosts:
    """Seconds to decode m tokens in one target pass, for m = 1..max_m (interpolated between points)."""

    seconds: list[float]  # seconds[m - 1]: a pass of width m after passes of the same width (steady)
    switch: list[float] | None = None  # switch[m - 1]: extra seconds of the passes after a change to m

    @classmethod
    def from_points(
        cls, points: dict[int, float], max_m: int, switch: dict[int, float] | None = None
    ) -> VerifyCosts:
        return cls(_interpolate(points, max_m), _interpolate(switch, max_m) if switch else None)

    def cost(self, m: int) -> float:
        return self.seconds[min(m, len(self.seconds)) - 1]

    def penalty(self, m: int) -> float:
        """Extra seconds spent by the passes that follow a change of width to m (0 on a CPU)."""
        return self.switch[min(m, len(self.switch)) - 1] if self.switch else 0.0

    def observe(self, m: int, seconds: float) -> None:
        if 1 <= m <= len(self.seconds) and seconds < OUTLIER * self.seconds[m - 1]:
            self.seconds[m - 1] += COST_EMA * (seconds - self.seconds[m - 1])

    def relative(self) -> list[float]:
        return [round(s / self.seconds[0], 3) for s in self.seconds]


def _interpolate(points: dict[int, float], max_m: int) -> list[float]:
    xs = sorted(points)
    out = []
    for m in range(1, max_m + 1):
        if m in points:
            out.append(points[m])
            continue
        lo = max((x for x in xs if x < m), default=xs[0])
        hi = min((x for x in xs if x > m), default=xs[-1])
        if lo == hi:
            out.append(points[lo] * m / lo)
        else:
            w = (m - lo) / (hi - lo)
            out.append(points[lo] * (1 - w) + points[hi] * w)
    return out


def measure_verify_costs(
    target: Backend,
    max_m: int,
    cache_file: Path | None = None,
    cache_key: str = "",
    shape_sensitive: bool = False,
) -> VerifyCosts:
    """Time target passes of m tokens after a 64-token prefix, for a spread of m; cached per model.

    shape_sensitive (a GPU): also time the passes right after a change of width, from which each
    width's switch penalty is taken (width 1's from the passes back to plain steps).
    """
    sizes = [m for m in CALIBRATION_SIZES if m <= max_m] + ([max_m] if max_m not in CALIBRATION_SIZES else [])
    key = f"v3:{cache_key}:{'shape' if shape_sensitive else 'flat'}"
    if cache_file is not None and cache_file.exists():
        try:
            cached = json.loads(cache_file.read_text()).get(key)
            if cached:
                points = {int(k): float(v) for k, v in cached["steady"].items()}
                switch = {int(k): float(v) for k, v in cached.get("switch", {}).items()}
                if all(m in points for m in sizes):
                    return VerifyCosts.from_points(points, max_m, switch or None)
        except (ValueError, OSError, KeyError, TypeError, AttributeError):
            log.warning("ignoring unreadable verify-cost cache %s", cache_file)
    target.rollback(0)
    filler = target.tokenize(FILLER, True, False)
    prefix = (filler * (64 // max(len(filler), 1) + 1))[:64]
    target.decode_argmax(prefix, len(prefix) - 1)

    def timed(m: int) -> float:
        t0 = time.perf_counter()
        target.decode_argmax((prefix * (m // len(prefix) + 1))[:m], 0)
        dt = time.perf_counter() - t0
        target.rollback(len(prefix))
        return dt

    points: dict[int, float] = {}
    switch: dict[int, float] = {}
    try:
        if not shape_sensitive:
            for m in sizes:
                points[m] = min(timed(m) for _ in range(2 if m > 16 else 3))
        else:
            # After a change of width the first pass runs uncaptured and the second captures a graph;
            # from the third on the graph is replayed: the steady cost. The first capture of a shape
            # ever costs more than the re-captures of generation (it builds the graph from scratch):
            # one round over every width first, so the measured round sees what generation will.
            for m in sizes:
                timed(m)
                timed(m)
            ones = [timed(1) for _ in range(4)]
            points[1] = min(ones[2:])
            back: list[float] = []
            for m in sizes[1:]:
                runs = [timed(m) for _ in range(4)]
                points[m] = min(runs[2:])
                switch[m] = max(0.0, runs[0] + runs[1] - 2 * points[m])
                ones = [timed(1) for _ in range(3)]
                back.append(max(0.0, ones[0] + ones[1] - 2 * points[1]))
            switch[1] = sorted(back)[len(back) // 2] if back else 0.0
    finally:
        target.rollback(0)
    if cache_file is not None:
        try:
            data = json.loads(cache_file.read_text()) if cache_file.exists() else {}
        except (ValueError, OSError):
            data = {}
        data[key] = {
            "steady": {str(k): v for k, v in points.items()},
            "switch": {str(k): v for k, v in switch.items()},
        }
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(cache_file)
    return VerifyCosts.from_points(points, max_m, switch or None)


def cost_key(target: Backend, flash_attn: str) -> str:
    """The cache key of a target's verify costs: the file (name, size) and where and how it runs."""
    st = target.path.stat()
    argmax = "dev" if target.supports_device_argmax else "host"
    # where the layers sit changes the verify costs: partial offload, a pinned GPU, a split
    place = f"{target.facts.device}{target.main_gpu}:{target.facts.gpu_layers}l:{target.tensor_split or ''}"
    if target.devices_key:  # layers on RPC workers: which ones, the network is in the cost
        place += f":{target.devices_key}"
    if target.backend_name != "llama":
        place = f"{target.backend_name}:{place}"
    passes = f"{target.n_threads}t:{target.n_batch}b:{argmax}:fa-{flash_attn}"
    return f"{target.path.name}:{st.st_size}:{place}:{passes}"


def measure_token_cost(model: Backend, repeats: int = 7) -> tuple[float, float]:
    """Seconds per token of `model` drafting (one-token decodes) and reading context (a 64-token batch):
    medians over `repeats` after an untimed pass of each shape (a first pass may build or capture it),
    so one slow pass on a busy machine moves neither figure."""
    model.rollback(0)
    base = [model.vocab.bos if model.vocab.bos >= 0 else 1] * 64
    model.decode_argmax(base, len(base) - 1)
    model.decode_argmax([base[0]], 0)
    prefills, steps = [], []
    for _ in range(max(1, repeats // 2)):
        model.rollback(0)
        t0 = time.perf_counter()
        model.decode_argmax(base, len(base) - 1)
        prefills.append((time.perf_counter() - t0) / len(base))
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.decode_argmax([base[0]], 0)
        steps.append(time.perf_counter() - t0)
        model.rollback(len(base))
    model.rollback(0)
    return statistics.median(steps), statistics.median(prefills)

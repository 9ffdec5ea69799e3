"""Backends side by side on one model file in one run: greedy decode speed, verify cost by width, GB/s.

`python -m app bench --backends llama,native --target T.gguf [--json]`. Each backend in turn loads the
file (native with the GEMV kernels [engine] native_gemv names; compare() also takes native:reference and
native:fast), decodes the same prompt greedily, times verify passes of k = 1..16 tokens after the same
prefix, and is closed before the next loads. Both greedy answers are compared token for token. The
bandwidth figure is the bytes of weights one decode step reads (every matrix but the token embedding, of
which it reads one row) over the step's time; the bound is the GPU's memory bandwidth: the device's own
(NVML's peak, or a measured copy where NVML cannot say), or --bandwidth.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.config import EngineSettings
from app.devices.bandwidth import Bandwidth, device_bandwidth
from app.engine.backends.base import read_model_header

PROMPT = (
    b"Write a Python function that returns the n-th Fibonacci number iteratively, "
    b"with a docstring and type hints, then explain its complexity."
)
VERIFY_WIDTHS = tuple(range(1, 17))


def bytes_per_token(path: Path) -> int:
    """Weight bytes a one-token pass reads: every matrix, but one row of an untied token embedding."""
    header = read_model_header(path)
    tied = not any(t.name == "output.weight" for t in header.tensors)
    total = 0
    for t in header.tensors:
        if t.name == "token_embd.weight" and not tied:
            total += t.n_bytes // max(t.shape[1], 1)
        else:
            total += t.n_bytes
    return total


def native_gemv(backend: str) -> str:
    """The GEMV kernels a native entry names (native:fast), else the settings' [engine] native_gemv."""
    _, _, gemv = backend.partition(":")
    if gemv:
        return gemv
    from app.config import load_settings

    return load_settings().engine.native_gemv


def _load(backend: str, path: Path, n_ctx: int) -> Any:
    if backend.startswith("native"):
        from app.engine.backends.native import NativeBackend

        return NativeBackend(path, n_ctx=n_ctx, gemv=native_gemv(backend))
    from app.engine.backends.llama import LlamaBackend

    return LlamaBackend(path, EngineSettings(n_ctx=n_ctx))


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile_backend(
    backend: str,
    path: Path,
    n_tokens: int,
    n_ctx: int = 4096,
    widths: tuple[int, ...] = VERIFY_WIDTHS,
    repeats: int = 12,
) -> dict[str, Any]:
    target = _load(backend, path, n_ctx)
    try:
        prompt = target.tokenize(PROMPT, True, False)
        target.decode_argmax(prompt, len(prompt) - 1)  # warm-up: first-use costs stay out of the figures
        target.rollback(0)
        answer: list[int] = []
        t_prefill = _timed(lambda: answer.extend(target.decode_argmax(prompt, len(prompt) - 1)))
        for _ in range(4):  # the first one-token passes build (or capture) that shape's graph
            answer += target.decode_argmax([answer[-1]], 0)
        steps: list[float] = []
        while len(answer) < n_tokens and not target.is_eog(answer[-1]):
            last = answer[-1]
            t0 = time.perf_counter()
            answer.extend(target.decode_argmax([last], 0))
            steps.append(time.perf_counter() - t0)
        # Verify passes of k tokens after the prompt, each width repeated: what a run of drafts sees.
        verify: dict[int, float] = {}
        for k in widths:
            block = (prompt * (k // len(prompt) + 1))[:k]
            times = []
            for _ in range(repeats):
                target.rollback(len(prompt))
                times.append(_timed(lambda b=block: target.decode_argmax(b, 0)))
            verify[k] = statistics.median(times[2:] or times)
        target.rollback(0)
        out: dict[str, Any] = {
            "backend": backend,
            "gemv": getattr(target, "gemv", None),
            "device_reason": getattr(target, "device_reason", ""),
            "prompt_tokens": len(prompt),
            "generated": len(steps),
            "prefill_ms": round(t_prefill * 1e3, 3),
            "step_ms": round(statistics.median(steps) * 1e3, 4) if steps else None,
            "tok_s": round(len(steps) / sum(steps), 1) if steps else None,
            "verify_ms": {k: round(v * 1e3, 4) for k, v in verify.items()},
            # the widest verify pass in decode steps (the "verify 16 tokens <= 1.6 steps")
            "verify_steps": round(verify[max(widths)] / statistics.median(steps), 3) if steps else None,
            "answer": answer,
        }
        if backend.startswith("native"):
            target.decode_argmax(prompt, len(prompt) - 1)
            out["profile"] = [target.profile(width) for width in (1, 17)]
        return out
    finally:
        target.close()


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _margin_at(backend: str, path: Path, answer: list[int], at: int) -> float:
    """The top-2 logit gap of `backend` where its greedy answer chose answer[at] (a near-tie, when small)."""
    target = _load(backend, path, 4096)
    try:
        prompt = target.tokenize(PROMPT, True, False)
        row = target.decode(prompt + answer[:at], len(prompt) + at - 1)[0]
        top = np.sort(row)[-2:]
        return round(float(top[1] - top[0]), 4)
    finally:
        target.close()


def bound(bandwidth_gb_s: float | None, gpu: int = 0) -> Bandwidth:
    """--bandwidth where given, else the device's own."""
    if bandwidth_gb_s:
        return Bandwidth(bandwidth_gb_s * 1e9, "--bandwidth")
    return device_bandwidth(gpu)


def compare(
    path: Path,
    backends: list[str],
    n_tokens: int,
    as_json: bool,
    bandwidth_gb_s: float | None = None,
    widths: tuple[int, ...] = VERIFY_WIDTHS,
    repeats: int = 12,
) -> list[dict]:
    results = []
    per_token = bytes_per_token(path)
    limit = bound(bandwidth_gb_s)
    for backend in backends:
        r = profile_backend(backend, path, n_tokens, widths=widths, repeats=repeats)
        r["bandwidth_gb_s"] = round(limit.gb_s, 1) if limit.gb_s else None
        r["bandwidth_source"] = limit.source
        if r["step_ms"]:
            r["gb_s"] = round(per_token / (r["step_ms"] / 1e3) / 1e9, 1)
            r["bound_share"] = round(r["gb_s"] / limit.gb_s, 3) if limit.gb_s else None
        results.append(r)
    base = results[0]
    for r in results[1:]:
        r["speedup_vs_" + base["backend"]] = (
            round(base["step_ms"] / r["step_ms"], 3) if r["step_ms"] else None
        )
        diff = _first_difference(base["answer"], r["answer"])
        r["first_difference_vs_" + base["backend"]] = diff
        if diff is not None and diff < len(base["answer"]):
            r["margin_at_difference"] = _margin_at(base["backend"], path, base["answer"], diff)
    if as_json:
        for r in results:
            print(json.dumps({k: v for k, v in r.items() if k != "answer"}), flush=True)
        return results
    print(f"model: {path.name}; weights read per token: {per_token / 1e6:.1f} MB")
    if limit.gb_s:
        print(f"bound: {limit.gb_s:.0f} GB/s of memory bandwidth ({limit.source})")
    else:
        print(f"bound: none ({limit.source})")
    for r in results:
        ratio = next((v for k, v in r.items() if k.startswith("speedup_vs_")), None)
        diff = next((v for k, v in r.items() if k.startswith("first_difference_vs_")), "-")
        if "margin_at_difference" in r:
            diff = f"{diff} ({results[0]['backend']}'s top-2 margin there {r['margin_at_difference']})"
        share = f", {r['bound_share']:.0%} of the bound" if r.get("bound_share") else ""
        versus = f", {ratio:.2f}x" if ratio else ""
        name = r["backend"] if r["backend"] != "native" else f"native:{r['gemv']}"
        print(
            f"{name:<7} decode {r['tok_s']} tok/s ({r['step_ms']} ms/token, {r.get('gb_s')} GB/s"
            f"{share}){versus}; greedy answers part at: {diff}"
        )
        widest = max(r["verify_ms"])
        print(
            "        verify ms by k: "
            + " ".join(f"{k}:{v:.3f}" for k, v in r["verify_ms"].items())
            + f"; k={widest} costs {r['verify_steps']} decode steps"
        )
        for prof in r.get("profile", []):
            top = ", ".join(f"{k} {v['ms']:.3f}" for k, v in list(prof["kernels"].items())[:6])
            print(
                f"        width {prof['width']}: {prof['launches']} launches, "
                f"kernels {prof['kernel_ms']:.3f} ms, "
                f"graph replay {prof['graph_replay_ms']:.3f} ms, eager {prof['eager_ms']:.3f} ms; {top}"
            )
    return results

"""The native backend on token ids alone (no tokenizer, so no llama.cpp needed): logits against the NumPy
reference, a verify pass against single steps, greedy decode speed, verify cost by width, GB/s, a sampled
step with the row of logits or the device's top-k, and where a pass spends its time. One JSON per model.

  python scripts/native-probe.py MODEL.gguf [MODEL.gguf ...] [--reference] [--tokens 128] [--gemv fast]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from app.cli.backend_bench import bound, bytes_per_token
from app.engine.backends.native import NativeBackend
from app.engine.kernels.reference import ReferenceModel
from app.engine.sampling import Candidates, Sampler, SamplingParams


def probe(path: Path, n_tokens: int, reference: bool, bandwidth: float | None, gemv: str | None) -> dict:
    out: dict = {"model": path.name}
    t0 = time.perf_counter()
    backend = NativeBackend(path, n_ctx=2048, tokenizer=False, gemv=gemv)
    out["gemv"] = backend.gemv
    out["load_s"] = round(time.perf_counter() - t0, 2)
    vocab = backend.n_vocab
    ids = [2, *np.random.default_rng(0).integers(100, min(vocab, 20000), 47).tolist()]
    if reference:
        ref = ReferenceModel(path)
        want = ref.forward(ids, ref.new_cache(len(ids) + 1))
        w = backend.max_width  # logits come from the last pass only: one pass per chunk
        got = np.concatenate([backend.decode(ids[i : i + w], 0).copy() for i in range(0, len(ids), w)])
        spread = want.max(axis=1) - want.min(axis=1)
        err = np.abs(got - want).max(axis=1) / spread
        out["reference_max_error"] = round(float(err.max()), 5)
        out["reference_argmax_agree"] = round(float((got.argmax(1) == want.argmax(1)).mean()), 3)
        backend.rollback(0)
    backend.decode_argmax(ids[:-8], len(ids) - 9)
    batch = backend.decode(ids[-8:], 0).copy()
    backend.rollback(len(ids) - 8)
    single = np.stack([backend.decode([t], 0)[0].copy() for t in ids[-8:]])
    out["verify_vs_single_max_diff"] = float(np.abs(batch - single).max())
    backend.rollback(0)
    answer = backend.decode_argmax(ids, len(ids) - 1)
    for _ in range(8):  # warm-up: the graph of width 1
        answer += backend.decode_argmax([answer[-1]], 0)
    steps = []
    while len(steps) < n_tokens:
        t0 = time.perf_counter()
        answer += backend.decode_argmax([answer[-1]], 0)
        steps.append(time.perf_counter() - t0)
    step = statistics.median(steps)
    out["tok_s"] = round(len(steps) / sum(steps), 1)
    out["step_ms"] = round(step * 1e3, 4)
    out["gb_s"] = round(bytes_per_token(path) / step / 1e9, 1)
    limit = bound(bandwidth, backend.main_gpu)
    out["bandwidth_gb_s"] = round(limit.gb_s, 1) if limit.gb_s else None
    out["bandwidth_source"] = limit.source
    out["bound_share"] = round(out["gb_s"] / limit.gb_s, 3) if limit.gb_s else None
    verify = {}
    n_keep = len(backend.kv_tokens)
    for k in range(1, 17):
        times = []
        for _ in range(10):
            backend.rollback(n_keep)
            t0 = time.perf_counter()
            backend.decode_argmax(ids[:k], 0)
            times.append(time.perf_counter() - t0)
        verify[k] = round(statistics.median(times[2:]) * 1e3, 4)
    backend.rollback(n_keep)
    out["verify_ms"] = verify
    out["sampled_step_ms"] = sampled_steps(backend, ids)
    out["profile"] = [backend.profile(w) for w in (1, 17)]
    backend.close()
    return out


def sampled_steps(backend: NativeBackend, ids: list[int], n: int = 200) -> dict[str, float]:
    """Median ms per sampled token (temperature 0.7, top-k 40, top-p 0.95, min-p 0.05) with the row of
    logits copied to the host, and with the device's top-k handed to the sampler instead."""
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1)
    out = {}
    for mode in ("row", "top_k"):
        sampler = Sampler(params, backend.n_vocab)
        backend.rollback(0)
        token = backend.decode_argmax(ids, len(ids) - 1)[0]
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            if mode == "row":
                token = sampler.pick(backend.decode([token], 0)[0], [])
            else:
                values, top = backend.decode_topk([token], 0, 40)
                token = sampler.pick(Candidates(values[0], top[0]), [])
            times.append(time.perf_counter() - t0)
        out[mode] = round(statistics.median(times) * 1e3, 4)
    backend.rollback(0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reference", action="store_true", help="also compare logits with reference.py")
    ap.add_argument("--bandwidth", type=float, default=None, help="GB/s of the GPU (default: its own)")
    ap.add_argument(
        "--gemv", choices=("reference", "fast"), default=None, help="GEMV kernels (default: the setting's)"
    )
    a = ap.parse_args()
    for path in a.models:
        try:
            print(json.dumps(probe(path, a.tokens, a.reference, a.bandwidth, a.gemv)), flush=True)
        except Exception as exc:  # one model's failure still lets the others report
            print(json.dumps({"model": path.name, "error": f"{type(exc).__name__}: {exc}"}), flush=True)


if __name__ == "__main__":
    main()

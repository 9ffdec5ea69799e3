"""Replay the draft policy against a GPU's measured pass costs, with a real model on this CPU.

The target runs on the CPU (so drafts, acceptance and outputs are real) while a virtual clock charges
each pass what it cost on the GPU, by width and by what came before it: a pass right after a change of
width runs uncaptured, the next one captures a CUDA graph, later ones replay it (see `bench --shapes`).
The policy sees only the virtual clock, so its choices are the ones it would make on that GPU.

  python scripts/policy-sim.py --target default --only chat,code-edit --tokens 128
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  # isort: skip  (before NumPy)

import argparse
import json
from pathlib import Path
from typing import Any

from app.catalog.packaged import resolve_model
from app.config import DraftSettings, EngineSettings, Settings
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest, generate
from app.engine.policy import DraftPolicy, VerifyCosts
from app.engine.sampling import SamplingParams

# H200, Qwen2.5-Coder-1.5B Q4_K_M, llama.cpp CUDA, argmax on the device (ms), from bench --shapes:
# steady (replayed graph), first pass after a change (uncaptured), second pass (capture).
STEADY = {1: 1.77, 2: 2.10, 3: 2.36, 5: 2.98, 9: 4.41, 17: 5.12}
FIRST = {1: 3.35, 2: 4.05, 3: 4.15, 5: 4.40, 9: 5.95, 17: 6.80}
CAPTURE = {1: 5.60, 2: 5.95, 3: 6.20, 5: 6.85, 9: 10.10, 17: 10.60}


def interp(points: dict[int, float], m: int) -> float:
    return VerifyCosts.from_points(points, max(m, max(points))).cost(m)


class VirtualGPU:
    """Wraps a real backend; every decode advances a virtual clock by the GPU's cost for that pass."""

    def __init__(self, backend: Any) -> None:
        self._b = backend
        self.now = 0.0
        self.last, self.run = 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._b, name)

    def _charge(self, width: int) -> None:
        if width != self.last:
            self.last, self.run = width, 1
            cost = interp(FIRST, width)
        elif self.run == 1:
            self.run = 2
            cost = interp(CAPTURE, width)
        else:
            cost = interp(STEADY, width)
        self.now += cost / 1e3

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        self._charge(len(tokens))
        return self._b.decode_argmax(tokens, logits_from)

    def decode(self, tokens: list[int], logits_from: int) -> Any:
        self._charge(len(tokens))
        return self._b.decode(tokens, logits_from)

    def clock(self) -> float:
        return self.now


def run(engine: Engine, gpu: VirtualGPU, tokens: list[int], n: int, policy: DraftPolicy | None) -> Any:
    engine.target.rollback(0)
    request = GenerationRequest(tokens, SamplingParams(), n, engine.chat.stop, None, policy is not None)
    stats = None
    out: list[int] = []
    for chunk in generate(gpu, request, engine.drafter, policy, None, None, gpu.clock):  # type: ignore[arg-type]
        out += chunk.tokens
        stats = chunk.stats or stats
    return out, stats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="default")
    ap.add_argument(
        "--prompts", type=Path, default=Path(__file__).resolve().parent.parent / "bench/prompts.json"
    )
    ap.add_argument("--only", default="")
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    prompts = json.loads(a.prompts.read_text())
    if a.only:
        want = set(a.only.split(","))
        prompts = [p for p in prompts if p["name"] in want or p.get("kind") in want]
    settings = Settings(engine=EngineSettings(n_ctx=4096), draft=DraftSettings(mode="ngram", max_draft=16))
    steady = {m: v / 1e3 for m, v in STEADY.items()}
    switch = {m: (FIRST[m] + CAPTURE[m] - 2 * STEADY[m]) / 1e3 for m in STEADY}
    with Engine(resolve_model(a.target), None, settings) as engine:
        gpu = VirtualGPU(engine.target)
        policy = DraftPolicy(VerifyCosts.from_points(steady, 17, switch), 16, 0.0)
        for p in prompts:
            tokens = (
                engine.render_chat(p["messages"]).tokens
                if "messages" in p
                else engine.tokenize_text(p["prompt"])
            )
            plain, ps = run(engine, gpu, tokens, a.tokens, None)
            spec, ss = run(engine, gpu, tokens, a.tokens, policy)
            widths = {k: v for k, v in sorted(ss.draft_lengths.items())}
            print(
                f"{p['name']:<24} plain {ps.tokens_per_second:7.1f}  spec {ss.tokens_per_second:7.1f}  "
                f"{ss.tokens_per_second / ps.tokens_per_second:5.2f}x  acc {ss.acceptance_rate:4.2f}  "
                f"tok/pass {ss.mean_accepted_len:5.2f}  padded {ss.padded:4d}  same {plain == spec}  "
                f"k {widths}",
                flush=True,
            )


if __name__ == "__main__":
    main()

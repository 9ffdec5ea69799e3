"""Replay the draft policy against a GPU's measured pass costs, from greedy answers recorded once.

Greedy decoding is deterministic, so what a draft would be accepted is fixed by the plain answer: a
draft position is accepted exactly when it equals the answer's token there. `record` runs the real
model (on this CPU) once per prompt and keeps prompt and answer tokens; `replay` then runs the real
generation loop, policy and drafter against a backend that answers from the recording, while a
virtual clock charges each pass what it cost on the GPU, by width and by what came before it: a pass
right after a change of width runs uncaptured, the next one captures a CUDA graph, later ones replay
it (see `bench --shapes`). The naive prompt-lookup loop (../shared/gpu/naive_ngram.py: a 3- then
2-gram lookup, a fixed k, a draft whenever the lookup finds one) is replayed on the same clock.

  python scripts/policy-sim.py record --tokens 256 --out build/sim/answers.json
  python scripts/policy-sim.py replay build/sim/answers.json [--only code-edit] [--naive-k 4,8,16]
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  # isort: skip  (before NumPy: the other order crashed a CUDA build)

import argparse
import json
import time
from pathlib import Path
from typing import Any

from app.engine.backends.base import Backend
from app.engine.drafting.calibration import VerifyCosts
from app.engine.drafting.drafters import NgramDrafter
from app.engine.drafting.policy import DraftPolicy
from app.engine.drafting.step import Speculation
from app.engine.generation import GenerationRequest, generate

# H200, Qwen2.5-Coder-1.5B Q4_K_M, llama.cpp CUDA, argmax on the device (ms), from bench --shapes:
# steady (replayed graph), first pass after a change (uncaptured), second pass (capture).
STEADY = {1: 1.77, 2: 2.10, 3: 2.36, 5: 2.98, 9: 4.41, 17: 5.12}
FIRST = {1: 3.35, 2: 4.05, 3: 4.15, 5: 4.40, 9: 5.95, 17: 6.80}
CAPTURE = {1: 5.60, 2: 5.95, 3: 6.20, 5: 6.85, 9: 10.10, 17: 10.60}
# A 2-core CPU, same model (ms, bench's calibration): no graphs, a pass costs the same whatever came before.
CPU = {1: 73.6, 2: 120.9, 4: 233.7, 8: 462.7, 16: 510.2, 17: 540.0}
MAX_WIDTH = 17
ROOT = Path(__file__).resolve().parent.parent


def _curve(points: dict[int, float]) -> list[float]:
    return VerifyCosts.from_points({m: v / 1e3 for m, v in points.items()}, MAX_WIDTH).seconds


class VirtualClock:
    """Seconds on the GPU: every pass is charged by its width and the widths of the passes before."""

    def __init__(self, cpu: bool = False) -> None:
        if cpu:
            self.steady = self.first = self.capture = _curve(CPU)
        else:
            self.steady, self.first, self.capture = _curve(STEADY), _curve(FIRST), _curve(CAPTURE)
        self.now = 0.0
        self.last, self.run = 0, 0

    def charge(self, width: int) -> None:
        m = min(width, MAX_WIDTH) - 1
        if width != self.last:
            self.last, self.run = width, 1
            self.now += self.first[m]
        elif self.run == 1:
            self.run = 2
            self.now += self.capture[m]
        else:
            self.now += self.steady[m]

    def __call__(self) -> float:
        return self.now


class ReplayBackend:
    """A backend whose argmax after each prefix is the recorded answer's next token (-1 off the answer)."""

    def __init__(self, prompt: list[int], answer: list[int], eog: list[int], clock: VirtualClock) -> None:
        self.full = prompt + answer
        self.eog = set(eog)
        self.clock = clock
        self.kv_tokens: list[int] = []
        self.n_ctx = len(self.full) + 4096
        self.n_vocab = 1 << 20

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        self.clock.charge(len(tokens))
        base = len(self.kv_tokens)
        on_answer = True
        rows = []
        for i, token in enumerate(tokens):
            j = base + i
            on_answer = on_answer and j < len(self.full) and self.full[j] == token
            if i >= logits_from:
                nxt = j + 1
                rows.append(self.full[nxt] if on_answer and nxt < len(self.full) else -1)
        self.kv_tokens += tokens
        return rows

    def feed(self, tokens: list[int]) -> None:
        """A prompt before its last token: a pass of its own, its rows unread."""
        self.decode_argmax(tokens, len(tokens) - 1)

    def rollback(self, n_keep: int) -> None:
        del self.kv_tokens[n_keep:]

    def is_eog(self, token: int) -> bool:
        return token in self.eog or token == -1

    def token_bytes(self, token: int) -> bytes:
        return b""


def _costs(props: Path | None = None, cpu: bool = False) -> VerifyCosts:
    """What the policy believes: the clock's own table, or a real engine's calibration (bench --json)."""
    if props is not None:
        last = [json.loads(line) for line in props.read_text().splitlines() if '"props"' in line][-1]
        policy = last["props"]["draft"]["policy"]
        steady = {m: v / 1e3 for m, v in enumerate(policy["verify_cost_ms"], start=1)}
        switch = {m: v / 1e3 for m, v in enumerate(policy["switch_penalty_ms"], start=1)}
        return VerifyCosts.from_points(steady, MAX_WIDTH, switch)
    if cpu:
        return VerifyCosts.from_points({m: v / 1e3 for m, v in CPU.items()}, MAX_WIDTH)
    steady = {m: v / 1e3 for m, v in STEADY.items()}
    switch = {m: (FIRST[m] + CAPTURE[m] - 2 * STEADY[m]) / 1e3 for m in STEADY}
    return VerifyCosts.from_points(steady, MAX_WIDTH, switch)


def run_engine(
    case: dict[str, Any], policy: DraftPolicy | None, n: int, cpu: bool = False
) -> tuple[float, list[int], Any]:
    clock = VirtualClock(cpu)
    backend = ReplayBackend(case["prompt"], case["answer"], case["eog"], clock)
    request = GenerationRequest(prompt=list(case["prompt"]), max_tokens=n, speculative=policy is not None)
    speculation = Speculation(NgramDrafter(), policy) if policy is not None else None
    out: list[int] = []
    stats = None
    target: Backend = backend  # type: ignore[assignment]
    for chunk in generate(target, request, speculation, None, None, clock):
        out += chunk.tokens
        stats = chunk.stats or stats
    return clock.now - (stats.prefill_s if stats else 0.0), out, stats


def _naive_lookup(hist: list[int], k: int) -> list[int]:
    for n in (3, 2):
        key = hist[-n:]
        for j in range(len(hist) - n - 1, -1, -1):
            if hist[j : j + n] == key:
                return hist[j + n : j + n + k]
    return []


def run_naive(case: dict[str, Any], k: int, n: int, cpu: bool = False) -> tuple[float, list[int]]:
    clock = VirtualClock(cpu)
    backend = ReplayBackend(case["prompt"], case["answer"], case["eog"], clock)
    prompt = list(case["prompt"])
    nxt = backend.decode_argmax(prompt, len(prompt) - 1)[0]
    t0 = clock.now
    hist, out = list(prompt), []
    while len(out) < n:
        out.append(nxt)
        hist.append(nxt)
        if backend.is_eog(nxt):
            break
        draft = _naive_lookup(hist, k)
        rows = backend.decode_argmax([nxt, *draft], 0)
        acc = 0
        while acc < len(draft) and rows[acc] == draft[acc]:
            acc += 1
        backend.rollback(len(hist) + acc)
        for t in draft[:acc]:
            if len(out) < n:
                out.append(t)
                hist.append(t)
        if any(backend.is_eog(t) for t in draft[:acc]):
            break
        nxt = rows[acc]
    return clock.now - t0, out


def record(a: argparse.Namespace) -> None:
    from app.catalog.packaged import resolve_model
    from app.config import EngineSettings, Settings
    from app.engine.engine import Engine

    prompts = json.loads(a.prompts.read_text())
    settings = Settings(engine=EngineSettings(n_ctx=4096))
    cases = []
    with Engine(resolve_model(a.target), None, settings) as engine:
        eog = [t for t in range(engine.target.n_vocab) if engine.target.is_eog(t)]
        for p in prompts:
            tokens = (
                engine.render_chat(p["messages"]).tokens
                if "messages" in p
                else engine.tokenize_text(p["prompt"])
            )
            engine.target.rollback(0)
            answer: list[int] = []
            t0 = time.perf_counter()
            nxt = engine.target.decode_argmax(tokens, len(tokens) - 1)[0]
            while len(answer) < a.tokens:
                answer.append(nxt)
                if engine.target.is_eog(nxt):
                    break
                nxt = engine.target.decode_argmax([nxt], 0)[0]
            print(f"{p['name']:<24} {len(answer)} tokens in {time.perf_counter() - t0:.1f} s", flush=True)
            cases.append(
                {"name": p["name"], "kind": p.get("kind", ""), "prompt": tokens, "answer": answer, "eog": eog}
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(cases))


def replay(a: argparse.Namespace) -> None:
    cases = json.loads(a.answers.read_text())
    if a.only:
        want = set(a.only.split(","))
        cases = [c for c in cases if c["name"] in want or c["kind"] in want]
    naive_ks = [int(k) for k in a.naive_k.split(",") if k]
    policy = DraftPolicy(_costs(a.calibration, a.cpu), 16, 0.0)
    head = f"{'prompt':<24} {'plain':>6} {'engine':>6} " + " ".join(f"{'k=' + str(k):>6}" for k in naive_ks)
    print(head + "   engine widths")
    for case in cases:
        n = min(a.tokens, len(case["answer"]))
        t_plain, plain, _ = run_engine(case, None, n, a.cpu)
        t_spec, spec, stats = run_engine(case, policy, n, a.cpu)
        assert spec == plain, f"{case['name']}: replayed output differs"
        rate = len(plain) / t_plain
        naive = []
        for k in naive_ks:
            t_naive, out = run_naive(case, k, n, a.cpu)
            assert out[: len(plain)] == plain[: len(out)], f"{case['name']}: naive output differs"
            naive.append(len(out) / t_naive / rate)
        widths = dict(sorted(stats.draft_lengths.items()))
        print(
            f"{case['name']:<24} {rate:6.0f} {len(spec) / t_spec / rate:5.2f}x "
            + " ".join(f"{r:5.2f}x" for r in naive)
            + f"   {widths}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="greedy answers from the real model on this machine")
    rec.add_argument("--target", default="default")
    rec.add_argument("--prompts", type=Path, default=ROOT / "bench/prompts.json")
    rec.add_argument("--tokens", type=int, default=256)
    rec.add_argument("--out", type=Path, default=ROOT / "build/sim/answers.json")
    rep = sub.add_parser("replay", help="the policy and the naive loop on the GPU's clock")
    rep.add_argument("answers", type=Path, nargs="?", default=ROOT / "build/sim/answers.json")
    rep.add_argument("--only", default="")
    rep.add_argument("--tokens", type=int, default=256)
    rep.add_argument("--naive-k", default="4,8,16")
    rep.add_argument("--cpu", action="store_true", help="a 2-core CPU's pass costs instead of the H200's")
    rep.add_argument("--calibration", type=Path, help="bench --json output whose calibration the policy uses")
    a = ap.parse_args()
    record(a) if a.command == "record" else replay(a)


if __name__ == "__main__":
    main()

"""`bench --trace`: a real pair's draft agreement recorded per target position, replayed on any pair.

Weights of 7B-32B models cannot be had everywhere, but what speculation costs depends only on shapes, and
how much a drafter agrees with its target can be measured on a real small pair. `record` stores, for every
position of the target's greedy answer to each bench prompt, how many tokens the real drafter's greedy
continuation from there agrees with that answer (up to 16). `replay` runs any target/drafter pair (random
weights at real shapes): the drafter runs its real forward passes every step, but its proposal is the
target's own greedy continuation (from a plain pass first) up to the traced agreement, then a token the
target does not take. The target verifies as always, so pipeline, policy, host work and kernels are real;
only agreement is replayed, and the policy sees nothing but the acceptance it observes.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.catalog.digests import sha256_file
from app.cli.bench import prompt_tokens, run_once
from app.engine.drafting.drafters import Drafter, common_prefix
from app.engine.drafting.step import Speculation
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest, generate
from app.engine.stats import SpecStats

MAX_AGREEMENT = 16
VERSION = 1
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "bench" / "traces" / "qwen2.5-coder-1.5b+0.5b.json"


def greedy_answer(engine: Engine, tokens: list[int], n_tokens: int) -> list[int]:
    """The target's plain greedy answer, up to n_tokens or its end-of-generation token (not included)."""
    target = engine.target
    target.rollback(0)
    answer: list[int] = []
    nxt = target.decode_argmax(tokens, len(tokens) - 1)[0]
    while len(answer) < n_tokens and not target.is_eog(nxt):
        answer.append(nxt)
        nxt = target.decode_argmax([nxt], 0)[0]
    target.rollback(0)
    return answer


def agreement(engine: Engine, tokens: list[int], answer: list[int]) -> list[int]:
    """Per answer position g: how many tokens the drafter's greedy continuation of prompt + answer[:g]
    shares with answer[g:] (at most MAX_AGREEMENT).

    Where the drafter's first token at g is answer[g], its continuation from g + 1 is the rest of the one
    from g (the same decodes in the same cache), so it is carried over and only extended: a copied
    answer costs about one drafter decode a position, not sixteen.
    """
    model = engine.draft_model
    assert model is not None
    model.rollback(0)
    out: list[int] = []
    # the drafter's greedy tokens after prompt + answer[:g]; its KV holds all but the last of them
    ahead: list[int] = []
    for g in range(len(answer)):
        if g > 0:
            ahead = ahead[1:] if ahead and ahead[0] == answer[g - 1] else []
        context = tokens + answer[:g]
        agreed = 0
        while True:
            if agreed == len(ahead):
                if ahead:
                    ahead += model.decode_argmax([ahead[-1]], 0)
                else:
                    keep = min(common_prefix(model.kv_tokens, context), len(context) - 1)
                    model.rollback(keep)
                    ahead = model.decode_argmax(context[keep:], len(context) - keep - 1)
            if ahead[agreed] != answer[g + agreed]:
                break
            agreed += 1
            if agreed == MAX_AGREEMENT or g + agreed == len(answer):
                break
        out.append(agreed)
    model.rollback(0)
    return out


def record(engine: Engine, prompts: Sequence[dict[str, Any]], n_tokens: int, out: Path) -> dict[str, Any]:
    """Record the agreement trace of the loaded pair (a drafter model with the target's vocabulary)."""
    verdict = engine.vocab_verdict
    if engine.draft_model is None or verdict is None or not verdict.compatible:
        raise SystemExit("--trace record needs a drafter model with the target's vocabulary (--draft D)")
    models = {
        role: {"name": m.facts.name, "file": Path(m.facts.path).name, "sha256": sha256_file(m.facts.path)}
        for role, m in (("target", engine.target), ("drafter", engine.draft_model))
    }
    entries: list[dict[str, Any]] = []
    trace = {"version": VERSION, "max_agreement": MAX_AGREEMENT, "tokens": n_tokens, **models,
             "prompts": entries}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    for entry in prompts:
        tokens, _ = prompt_tokens(engine, entry)
        answer = greedy_answer(engine, tokens, n_tokens)
        agreed = agreement(engine, tokens, answer)
        entries.append({"name": entry["name"], "kind": entry.get("kind", ""), "agreement": agreed})
        mean = statistics.fmean(agreed) if agreed else 0.0
        print(f"{entry['name']:<24} {len(answer):>4} positions, mean agreement {mean:5.2f}", flush=True)
        # written after every prompt: a long recording stopped half-way keeps what it measured
        out.write_text(json.dumps(trace, indent=1) + "\n")
    return trace


def load_trace(path: Path) -> dict[str, Any]:
    trace = json.loads(path.read_text())
    if trace.get("version") != VERSION or not isinstance(trace.get("prompts"), list):
        raise SystemExit(f"{path}: not a version-{VERSION} agreement trace")
    return trace


class TraceDrafter:
    """A drafter model whose forward passes are real and whose proposals come from the trace: the target's
    greedy continuation up to the traced agreement at this position, then a token the target does not take,
    then the drafter's own tokens to the chosen length."""

    match_len: int | None = None

    def __init__(self, inner: Drafter, greedy: list[int], prompt_len: int, agreed: list[int], n_vocab: int):
        self.inner = inner
        self.source = inner.source
        self.cost_per_token_s = inner.cost_per_token_s
        self.prefill_cost_per_token_s = inner.prefill_cost_per_token_s
        self.greedy = greedy
        self.prompt_len = prompt_len
        self.agreed = agreed
        self.n_vocab = n_vocab
        self.passes = 0  # drafter forward passes: one per drafted token

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        self.inner.begin(prompt, draft_prompt)

    def propose(self, committed: list[int], k: int) -> list[int]:
        own = self.inner.propose(committed, k)
        self.passes += len(own)
        g = len(committed) - self.prompt_len  # the next position of the answer
        agreed = min(self.agreed[g] if g < len(self.agreed) else 0, k, max(len(self.greedy) - g, 0))
        out = self.greedy[g : g + agreed]
        if agreed < k and g + agreed < len(self.greedy):
            out.append((self.greedy[g + agreed] + 1) % self.n_vocab)
        return (out + own[len(out) :])[:k]

    def sync(self, committed: list[int]) -> None:
        self.inner.sync(committed)

    def catch_up_tokens(self, committed: list[int]) -> int:
        return self.inner.catch_up_tokens(committed)


def ideal_ratio(agreed: list[int], n: int, verify_s: list[float], draft_s: float) -> tuple[float, int]:
    """(speed-up, k) of the best fixed draft length with the traced agreement at these measured costs:
    verify_s[m - 1] a pass of m tokens, draft_s a drafted token."""
    best, best_k = 1.0, 0
    for k in range(1, len(verify_s)):
        g, seconds = 0, 0.0
        while g < n:
            g += min(agreed[g] if g < len(agreed) else 0, k) + 1
            seconds += verify_s[k] + k * draft_s
        ratio = n * verify_s[0] / seconds if seconds else 0.0
        if ratio > best:
            best, best_k = ratio, k
    return best, best_k


@dataclass
class ReplayReport:
    name: str
    kind: str
    plain_tok_s: float
    spec_tok_s: float
    drafter_passes: int
    drafter_s: float
    ideal: float
    ideal_k: int
    stats: SpecStats
    match: bool
    plain_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.spec_tok_s / self.plain_tok_s if self.plain_tok_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt": self.name,
            "kind": self.kind,
            "plain_tok_s": round(self.plain_tok_s, 2),
            "spec_tok_s": round(self.spec_tok_s, 2),
            "ratio": round(self.ratio, 3),
            "ideal_ratio": round(self.ideal, 3),
            "ideal_k": self.ideal_k,
            "drafter_passes": self.drafter_passes,
            "drafter_s": round(self.drafter_s, 4),
            "plain_tok_s_runs": [round(x, 2) for x in self.plain_runs],
            "spec_tok_s_runs": [round(x, 2) for x in self.spec_runs],
            "drafted": self.stats.drafted,
            "accepted": self.stats.accepted,
            "mean_accepted_len": round(self.stats.mean_accepted_len, 3),
            "fallback_reason": self.stats.fallback_reason,
            "match": self.match,
        }


def _spec_run(
    engine: Engine, tokens: list[int], n: int, drafter: TraceDrafter
) -> tuple[list[int], SpecStats]:
    policy = engine.policy
    assert policy is not None
    engine.target.rollback(0)
    request = GenerationRequest(prompt=tokens, max_tokens=n, stop=engine.chat.stop)
    out: list[int] = []
    stats = SpecStats()
    for chunk in generate(engine.target, request, Speculation(drafter, policy)):
        out += chunk.tokens
        stats = chunk.stats or stats
    return out, stats


def replay_prompt(
    engine: Engine, entry: dict[str, Any], agreed: list[int], n_tokens: int, repeat: int
) -> ReplayReport:
    """Plain runs, then trace-driven speculative runs of one prompt, alternating, `repeat` times each."""
    if engine.drafter is None or engine.draft_model is None or engine.policy is None:
        raise SystemExit("--trace replay needs a drafter model (--draft D)")
    tokens, draft_prompt = prompt_tokens(engine, entry)
    greedy = run_once(engine, tokens, draft_prompt, n_tokens, speculative=False).tokens
    plains, specs = [], []
    passes, drafter_s, last = 0, 0.0, SpecStats()
    spec_tokens: list[int] = []
    for i in range(repeat):
        for speculative in (False, True) if i % 2 == 0 else (True, False):
            if not speculative:
                plains.append(run_once(engine, tokens, draft_prompt, n_tokens, speculative=False).tok_s)
                continue
            drafter = TraceDrafter(engine.drafter, greedy, len(tokens), agreed, engine.target.n_vocab)
            spec_tokens, last = _spec_run(engine, tokens, n_tokens, drafter)
            specs.append(last.tokens_per_second)
            passes, drafter_s = drafter.passes, last.draft_s
    costs = engine.policy.costs.seconds
    ideal, ideal_k = ideal_ratio(agreed, len(greedy), costs, engine.drafter.cost_per_token_s)
    return ReplayReport(
        entry["name"], entry.get("kind", ""), statistics.median(plains), statistics.median(specs), passes,
        drafter_s, ideal, ideal_k, last, spec_tokens == greedy, plains, specs,
    )  # fmt: skip


def geomean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(max(v, 1e-9)) for v in values)) if values else 0.0


def replay(
    engine: Engine, prompts: Sequence[dict[str, Any]], trace: dict[str, Any], n_tokens: int, repeat: int,
    as_json: bool,
) -> list[ReplayReport]:  # fmt: skip
    """Replay the trace on the loaded pair; prompts without a trace entry are left out."""
    traced = {p["name"]: p["agreement"] for p in trace["prompts"]}
    n = min(n_tokens, int(trace.get("tokens", n_tokens)))
    note = (
        f"real-size costs, small-pair acceptance: agreement of {trace['target']['name']} + "
        f"{trace['drafter']['name']} replayed on {engine.target.facts.name} + "
        f"{engine.draft_model.facts.name if engine.draft_model else '?'}"
    )
    print(json.dumps({"trace": note}) if as_json else note, flush=True)
    head = (
        f"{'prompt':<24} {'kind':<10} {'plain t/s':>9} {'spec t/s':>9} {'ratio':>6} {'ideal':>6} "
        f"{'k*':>3} {'dr.pass':>7} {'dr.s':>6} output"
    )
    if not as_json:
        print(head)
    reports = []
    for entry in prompts:
        if entry["name"] not in traced:
            continue
        r = replay_prompt(engine, entry, traced[entry["name"]], n, repeat)
        reports.append(r)
        if as_json:
            print(json.dumps(r.as_dict()), flush=True)
        else:
            print(
                f"{r.name:<24} {r.kind:<10} {r.plain_tok_s:>9.1f} {r.spec_tok_s:>9.1f} {r.ratio:>5.2f}x "
                f"{r.ideal:>5.2f}x {r.ideal_k:>3} {r.drafter_passes:>7} {r.drafter_s:>6.2f} "
                f"{'identical' if r.match else 'differs'}",
                flush=True,
            )
    kinds: dict[str, list[ReplayReport]] = {}
    for r in reports:
        kinds.setdefault(r.kind or "all", []).append(r)
    summary = {
        kind: {
            "plain_tok_s": round(geomean([r.plain_tok_s for r in rs]), 2),
            "spec_tok_s": round(geomean([r.spec_tok_s for r in rs]), 2),
            "geomean_ratio": round(geomean([r.ratio for r in rs]), 3),
            "geomean_ideal_ratio": round(geomean([r.ideal for r in rs]), 3),
        }
        for kind, rs in kinds.items()
    }
    if as_json:
        print(json.dumps({"summary": summary, "note": note, "props": engine.props()}), flush=True)
    else:
        for kind, s in summary.items():
            print(
                f"{kind:<10} geomean {s['geomean_ratio']:.2f}x (ideal {s['geomean_ideal_ratio']:.2f}x), "
                f"plain {s['plain_tok_s']:.1f} tok/s, speculative {s['spec_tok_s']:.1f} tok/s"
            )
        print(note)
    return reports

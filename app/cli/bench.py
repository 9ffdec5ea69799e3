"""`python -m app bench`: plain vs speculative decoding, same prompts, model files and device, one run."""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from app.engine.engine import Engine
from app.engine.generation import GenerationRequest
from app.engine.stats import SpecStats

NEAR_TIE = 0.5  # logits: a greedy run may part from another only where the top-2 margin is below this
# Runs of one side that spread more than this (max - min over the median) say the machine's speed moved
# during the bench (single runs on a shared GPU vary by about 8%): the ratio is then less sure.
SPREAD_WARNING = 0.10


@dataclass
class RunResult:
    tokens: list[int]
    text: str
    stats: SpecStats

    @property
    def tok_s(self) -> float:
        return self.stats.tokens_per_second


@dataclass
class PromptReport:
    name: str
    kind: str
    plain: RunResult
    spec: RunResult
    match: bool
    first_difference: int | None = None
    margin: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # tok/s of every run of each side (the reported run is the median one)
    plain_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.spec.tok_s / self.plain.tok_s if self.plain.tok_s else 0.0

    @property
    def plain_spread(self) -> float:
        return spread(self.plain_runs)

    @property
    def spec_spread(self) -> float:
        return spread(self.spec_runs)

    def warnings(self) -> list[str]:
        out = []
        for side, runs in (("plain", self.plain_runs), ("speculative", self.spec_runs)):
            if spread(runs) > SPREAD_WARNING:
                out.append(
                    f"warning: {self.name}: the {side} runs spread {100 * spread(runs):.0f}% "
                    f"({', '.join(f'{x:.1f}' for x in runs)} tok/s), more than {100 * SPREAD_WARNING:.0f}%: "
                    "the machine's speed moved during the bench, so its ratio is less sure"
                )
        return out

    def as_dict(self) -> dict[str, Any]:
        s = self.spec.stats
        return {
            "prompt": self.name,
            "kind": self.kind,
            "tokens": [len(self.plain.tokens), len(self.spec.tokens)],
            "plain_tok_s": round(self.plain.tok_s, 2),
            "spec_tok_s": round(self.spec.tok_s, 2),
            "plain_tok_s_runs": [round(x, 2) for x in self.plain_runs],
            "spec_tok_s_runs": [round(x, 2) for x in self.spec_runs],
            "plain_spread": round(self.plain_spread, 4),
            "spec_spread": round(self.spec_spread, 4),
            "warnings": self.warnings(),
            "ratio": round(self.ratio, 3),
            "mean_accepted_len": round(s.mean_accepted_len, 3),
            "acceptance_rate": round(s.acceptance_rate, 3),
            "draft_lengths": {str(k): v for k, v in sorted(s.draft_lengths.items())},
            "accepted_histogram": {str(k): v for k, v in sorted(s.accepted_hist.items())},
            "fallback_steps": s.fallback_steps,
            "fallback_reason": s.fallback_reason,
            "host_share": round(s.host_s / s.decode_s, 3) if s.decode_s else 0.0,
            "plain_host_share": round(self.plain.stats.host_s / self.plain.stats.decode_s, 3)
            if self.plain.stats.decode_s
            else 0.0,
            "time_split_s": {
                "draft": round(s.draft_s, 4),
                "verify": round(s.verify_s, 4),
                "host": round(s.host_s, 4),
            },
            "passes": [f"{w}/{real}/{acc}@{ms}" for w, real, acc, ms in s.passes],
            "match": self.match,
            "first_difference": self.first_difference,
            "margin_at_difference": None if self.margin is None else round(self.margin, 4),
            "near_tie": None if self.margin is None else self.margin < NEAR_TIE,
        }


def load_prompts(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(p, dict) and "name" in p for p in data):
        raise ValueError(f"{path}: expected a list of objects with a name and messages or prompt")
    return data


def prompt_tokens(engine: Engine, entry: dict[str, Any]) -> tuple[list[int], bytes | None]:
    p = engine.render_chat(entry["messages"]) if "messages" in entry else engine.render_text(entry["prompt"])
    return p.tokens, p.draft_prompt


def run_once(
    engine: Engine, tokens: list[int], draft_prompt: bytes | None, n: int, speculative: bool
) -> RunResult:
    engine.target.rollback(0)  # both sides prefill from scratch
    request = GenerationRequest(
        prompt=tokens, max_tokens=n, draft_prompt=draft_prompt, speculative=speculative
    )
    out_tokens: list[int] = []
    text = []
    stats = SpecStats()
    for chunk in engine.generate(request):
        out_tokens += chunk.tokens
        text.append(chunk.text)
        if chunk.stats is not None:
            stats = chunk.stats
    return RunResult(out_tokens, "".join(text), stats)


def warm_up(engine: Engine, entry: dict[str, Any]) -> None:
    """Untimed runs of both sides first: first-use costs (allocations, kernel loading, graph capture) must
    not land on the first prompt's timed runs."""
    tokens, draft_prompt = prompt_tokens(engine, entry)
    run_once(engine, tokens, draft_prompt, 8, speculative=False)
    run_once(engine, tokens, draft_prompt, 8, speculative=True)


def top2_margin(engine: Engine, context: list[int]) -> float:
    """Gap between the best and second-best logit after `context`, from one plain pass."""
    target = engine.target
    target.rollback(0)
    row = np.array(target.decode(context, len(context) - 1)[0], copy=True)
    target.rollback(0)
    top = np.partition(row, -2)[-2:]
    return float(abs(top[1] - top[0]))


def _median_run(runs: list[RunResult]) -> RunResult:
    return sorted(runs, key=lambda r: r.tok_s)[(len(runs) - 1) // 2]


def spread(runs: list[float]) -> float:
    """(max - min) / median of the runs' tok/s; 0 for fewer than two runs."""
    if len(runs) < 2:
        return 0.0
    middle = statistics.median(runs)
    return (max(runs) - min(runs)) / middle if middle else 0.0


def bench_prompt(engine: Engine, entry: dict[str, Any], n_tokens: int, repeat: int = 3) -> PromptReport:
    """Plain and speculative runs of one prompt: each side runs `repeat` times in alternating order
    (plain, spec, spec, plain, ...) so that a drift of the machine's speed falls on both, and the median
    run of each side is reported with the spread of its runs."""
    tokens, draft_prompt = prompt_tokens(engine, entry)
    plains: list[RunResult] = []
    specs: list[RunResult] = []
    for i in range(repeat):
        for speculative in (False, True) if i % 2 == 0 else (True, False):
            run = run_once(engine, tokens, draft_prompt, n_tokens, speculative=speculative)
            (specs if speculative else plains).append(run)
    plain, spec = _median_run(plains), _median_run(specs)
    n = min(len(plain.tokens), len(spec.tokens))
    diff = next((i for i in range(n) if plain.tokens[i] != spec.tokens[i]), None)
    if diff is None and len(plain.tokens) != len(spec.tokens):
        diff = n
    margin = top2_margin(engine, tokens + plain.tokens[:diff]) if diff is not None else None
    report = PromptReport(entry["name"], entry.get("kind", ""), plain, spec, diff is None, diff, margin)
    report.plain_runs = [r.tok_s for r in plains]
    report.spec_runs = [r.tok_s for r in specs]
    return report


def format_table(reports: list[PromptReport]) -> str:
    head = (
        f"{'prompt':<24} {'kind':<10} {'plain t/s':>9} {'spec t/s':>9} {'ratio':>6} {'acc.len':>7} "
        f"{'acc%':>5} {'mean k':>9} {'fallbk':>6} {'host%':>5} {'spread':>6}  output"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        s = r.spec.stats
        drafting = {k: n for k, n in s.draft_lengths.items() if k > 0}
        k_mean = sum(k * n for k, n in drafting.items()) / sum(drafting.values()) if drafting else 0.0
        same = (
            "identical"
            if r.match
            else f"parts at {r.first_difference} (margin {r.margin:.3f}"
            f"{', near-tie' if (r.margin or 0) < NEAR_TIE else ''})"
        )
        host = 100 * s.host_s / s.decode_s if s.decode_s else 0.0
        lines.append(
            f"{r.name:<24} {r.kind:<10} {r.plain.tok_s:>9.1f} {r.spec.tok_s:>9.1f} {r.ratio:>5.2f}x "
            f"{s.mean_accepted_len:>7.2f} {100 * s.acceptance_rate:>5.0f} {k_mean:>9.1f} "
            f"{s.fallback_steps:>6} {host:>5.1f} {100 * max(r.plain_spread, r.spec_spread):>5.0f}%  {same}"
        )
    return "\n".join(lines)


def summarise(reports: list[PromptReport]) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = {}
    for r in reports:
        by_kind.setdefault(r.kind or "all", []).append(r.ratio)
    return {
        kind: {
            "geomean_ratio": round(math.exp(statistics.fmean(math.log(max(x, 1e-9)) for x in ratios)), 3),
            "min_ratio": round(min(ratios), 3),
            "max_ratio": round(max(ratios), 3),
        }
        for kind, ratios in by_kind.items()
    }


def shape_profile(
    target: Any, widths: tuple[int, ...] = (1, 2, 3, 5, 9, 17), calls: int = 6
) -> dict[str, Any]:
    """Per-call seconds of verify passes by width: repeated (steady), and alternating with one-token steps.

    A GPU backend may replay a captured graph only while consecutive passes keep their shape, so the
    cost of a width depends on the width before it: this shows by how much.
    """
    import time

    prefix = target.tokenize(b"def add(a, b):\n    return a + b\n" * 40, True, False)[:256]
    argmax_modes = [True, False] if target.supports_device_argmax else [False]
    out: dict[str, Any] = {}
    for device in argmax_modes:
        target._device_argmax = device
        label = "device" if device else "host"
        target.rollback(0)
        target.decode_argmax(prefix, len(prefix) - 1)

        def step(m: int) -> float:
            t0 = time.perf_counter()
            target.decode_argmax(prefix[:m], 0)
            dt = time.perf_counter() - t0
            target.rollback(len(prefix))
            return dt

        for m in widths:
            out[f"{label}/steady/{m}"] = [round(step(m) * 1e3, 3) for _ in range(calls)]
        for m in widths[1:]:
            seq = [round(step(w) * 1e3, 3) for _ in range(calls) for w in (1, m)]
            out[f"{label}/alternate-1/{m}"] = seq
        for m in widths[1:]:  # runs of 4 of one width, then 4 of the other
            seq = [round(step(w) * 1e3, 3) for _ in range(2) for w in (1, 1, 1, 1, m, m, m, m)]
            out[f"{label}/runs-of-4/{m}"] = seq
    target.rollback(0)
    target._device_argmax = bool(argmax_modes[0])
    return out


def run_bench(
    engine: Engine, prompts: list[dict[str, Any]], n_tokens: int, as_json: bool, repeat: int = 3
) -> list[PromptReport]:
    props = engine.props()
    if not as_json:
        t = props["target"]
        print(f"target: {t['name']} ({t['architecture']}) on {t['device']}, {t['threads']} threads; "
              f"draft: {props['draft']['source']}")  # fmt: skip
        if "vocabulary" in props["draft"]:
            print(f"drafter vocabulary: {props['draft']['vocabulary']['summary']}")
        if "policy" in props["draft"]:
            pol = props["draft"]["policy"]
            curve = ", ".join(
                f"{m}:{ms:.2f}"
                for m, ms in enumerate(pol["verify_cost_ms"], start=1)
                if m in (1, 2, 4, 8, 16, 32)
            )
            print(f"verify cost (ms) by batch size: {curve}")
    warm_up(engine, prompts[0])
    reports = []
    for entry in prompts:
        report = bench_prompt(engine, entry, n_tokens, repeat)
        reports.append(report)
        if as_json:
            print(json.dumps(report.as_dict()), flush=True)
        else:
            print(format_table([report]).splitlines()[-1], flush=True)
    summary = summarise(reports)
    props = engine.props()
    warnings = [w for r in reports for w in r.warnings()]
    if as_json:
        print(json.dumps({"summary": summary, "warnings": warnings, "props": props}), flush=True)
    else:
        print()
        print(format_table(reports))
        print()
        for kind, s in summary.items():
            print(
                f"{kind:<10} geomean {s['geomean_ratio']:.2f}x  "
                f"(min {s['min_ratio']:.2f}x, max {s['max_ratio']:.2f}x)"
            )
        if "policy" in props["draft"]:
            rel = props["draft"]["policy"]["verify_cost_relative"]
            shown = ", ".join(f"{m}:{rel[m - 1]}" for m in (1, 2, 4, 8, 16, 32) if m <= len(rel))
            print(f"verify cost relative to one step (after the run): {shown}")
        print(f"draft choice: {props['draft']['choice']['reason']}")
        print(f"each side ran {repeat} times, alternating; the median run is reported")
        for warning in warnings:
            print(warning)
    sys.stdout.flush()
    return reports

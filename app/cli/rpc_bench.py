"""`bench --no-draft --rpc HOST:PORT,...`: plain decoding on this machine alone and spread over the RPC
workers, same prompts and model file, side by side: what the network's round trips cost per token."""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.cli.bench import NEAR_TIE, RunResult, prompt_tokens, run_once, top2_margin
from app.config import Settings
from app.devices import placement
from app.engine.engine import Engine
from app.engine.errors import EngineError


@dataclass
class Side:
    """One way of running the target: its engine, its reason, and its median run per prompt."""

    name: str
    engine: Engine | None
    reason: str
    runs: dict[str, RunResult]
    tok_s: dict[str, list[float]]


def _local(settings: Settings) -> Settings:
    """The same settings on this machine's devices only, placed as the engine would place them."""
    es = settings.engine
    local = {"rpc": "", "tensor_split": None, "gpu_layers": -1}
    if es.device == "gpu":  # a split meant for the workers: placement decides this machine's devices
        local["device"] = "auto"
    return settings.model_copy(update={"engine": es.model_copy(update=local)})


def _load(name: str, settings: Settings, target: Path) -> Side:
    try:
        settled, placed = placement.settle(settings, target)
        engine = Engine(target, None, settled)
    except (EngineError, ValueError, OSError) as exc:  # the local side may not fit: the workers' reason
        return Side(name, None, f"cannot run: {exc}", {}, {})
    engine.placement = placement.describe(placed)
    reason = engine.props()["target"]["device_reason"]
    if placed is not None:
        reason += f" ({placed.reason})"
    return Side(name, engine, reason, {}, {})


def _run(side: Side, prompts: list[dict[str, Any]], n_tokens: int, repeat: int) -> None:
    if side.engine is None:
        return
    tokens, draft_prompt = prompt_tokens(side.engine, prompts[0])
    run_once(side.engine, tokens, draft_prompt, 8, speculative=False)  # first-use costs off the clock
    for entry in prompts:
        tokens, draft_prompt = prompt_tokens(side.engine, entry)
        runs = [run_once(side.engine, tokens, draft_prompt, n_tokens, False) for _ in range(repeat)]
        runs.sort(key=lambda r: r.tok_s)
        side.runs[entry["name"]] = runs[(len(runs) - 1) // 2]
        side.tok_s[entry["name"]] = [r.tok_s for r in runs]


def _row(entry: dict[str, Any], local: Side, split: Side) -> dict[str, Any]:
    name = entry["name"]
    here, there = local.runs.get(name), split.runs.get(name)
    row: dict[str, Any] = {"name": name, "kind": entry.get("kind", ""),
                           "local_tok_s": round(here.tok_s, 2) if here else None,
                           "split_tok_s": round(there.tok_s, 2) if there else None}  # fmt: skip
    if here is None or there is None:
        return row
    row["ratio"] = round(there.tok_s / here.tok_s, 3) if here.tok_s else None
    row["added_ms_per_token"] = round((1 / there.tok_s - 1 / here.tok_s) * 1e3, 3) if there.tok_s else None
    n = min(len(here.tokens), len(there.tokens))
    diff = next((i for i in range(n) if here.tokens[i] != there.tokens[i]), None)
    if diff is None and len(here.tokens) != len(there.tokens):
        diff = n
    row["match"] = diff is None
    if diff is not None and local.engine is not None:
        tokens, _ = prompt_tokens(local.engine, entry)
        margin = top2_margin(local.engine, tokens + here.tokens[:diff])
        row.update(first_difference=diff, margin=round(margin, 4), near_tie=margin < NEAR_TIE)
    return row


def compare(
    settings: Settings, target: Path, prompts: list[dict[str, Any]], n_tokens: int, repeat: int, as_json: bool
) -> int:
    """Each prompt on this machine alone, then over the workers; tok/s of the median runs side by side."""
    local = _load("local", _local(settings), target)  # before the workers join this process
    _run(local, prompts, n_tokens, repeat)
    split = _load("split", settings, target)
    _run(split, prompts, n_tokens, repeat)
    rows = [_row(entry, local, split) for entry in prompts]
    rpc = (split.engine.placement or {}).get("rpc", {}) if split.engine is not None else {}
    summary = _summary(rows)
    if as_json:
        for row in rows:
            print(json.dumps(row))
        print(json.dumps({"summary": summary, "local": local.reason, "split": split.reason, "rpc": rpc}))
    else:
        workers = ", ".join(f"{d['name']} {d['latency_ms']:.2f} ms" for d in rpc.get("devices", []))
        print(f"local: {local.reason}\nsplit: {split.reason}\nworkers (round trip): {workers or 'none'}")
        head = f"{'prompt':<24} {'kind':<10} {'local t/s':>9} {'split t/s':>9} {'ratio':>6} {'+ms/tok':>8}"
        head += "  output"
        print(head + "\n" + "-" * len(head))
        for r in rows:
            print(_line(r))
        if summary:
            added = summary["median_added_ms_per_token"]
            change = f"adds {added:.2f}" if added >= 0 else f"saves {-added:.2f}"
            print(f"\nsplit/local geomean {summary['geomean_ratio']:.2f}x; the split {change} ms per token "
                  "(median over prompts)")  # fmt: skip
        print(f"each side ran {repeat} times per prompt; the median run is reported")
    for side in (local, split):
        if side.engine is not None:
            side.engine.close()
    sys.stdout.flush()
    return 0 if split.engine is not None else 2


def _line(r: dict[str, Any]) -> str:
    def tok_s(value: float | None) -> str:
        return f"{value:>9.1f}" if value is not None else f"{'-':>9}"

    if "ratio" not in r:
        return f"{r['name']:<24} {r['kind']:<10} {tok_s(r['local_tok_s'])} {tok_s(r['split_tok_s'])}"
    output = "same" if r["match"] else (
        f"parts at {r['first_difference']} (margin {r['margin']:.3f}{', near-tie' if r['near_tie'] else ''})"
    )  # fmt: skip
    return (f"{r['name']:<24} {r['kind']:<10} {tok_s(r['local_tok_s'])} {tok_s(r['split_tok_s'])} "
            f"{r['ratio']:>5.2f}x {r['added_ms_per_token']:>8.2f}  {output}")  # fmt: skip


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for r in rows if r.get("ratio")]
    added = [r["added_ms_per_token"] for r in rows if r.get("added_ms_per_token") is not None]
    if not ratios:
        return {}
    return {
        "geomean_ratio": round(math.exp(statistics.fmean(math.log(x) for x in ratios)), 3),
        "median_added_ms_per_token": round(statistics.median(added), 3),
        "all_match_or_near_tie": all(r["match"] or r.get("near_tie") for r in rows if "match" in r),
    }

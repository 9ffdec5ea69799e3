"""Plain and speculative decoding of one bench prompt interleaved in one engine (plain, spec, spec,
plain per round), with each run's decode time: for telling a real cost of drafting from the run-to-run
spread of a small machine, where a whole `bench` run per side can differ by several percent.

  python scripts/ab-decode.py --prompt chat-remote-work [--target default] [--draft gemma-3-270m | --ngram]
                              [--rounds 3] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from app.catalog.packaged import resolve_model
from app.config import DraftSettings, EngineSettings, Settings
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest

PROMPTS = Path(__file__).resolve().parent.parent / "bench" / "prompts.json"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--target", default="default")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--ngram", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    a = ap.parse_args()
    prompt = {p["name"]: p for p in json.loads(PROMPTS.read_text())}[a.prompt]
    draft = resolve_model(a.draft) if a.draft else None
    settings = Settings(
        engine=EngineSettings(n_threads=2), draft=DraftSettings(mode="ngram" if a.ngram else "model")
    )
    times: dict[bool, list[float]] = {False: [], True: []}
    with Engine(resolve_model(a.target), draft, settings) as engine:
        tokens = engine.render_chat(prompt["messages"]).tokens
        for _ in range(a.rounds):
            for spec in (False, True, True, False):
                request = GenerationRequest(prompt=list(tokens), max_tokens=a.tokens, speculative=spec)
                stats = [chunk.stats for chunk in engine.generate(request) if chunk.stats is not None][-1]
                times[spec].append(stats.decode_s)
                label = "spec" if spec else "plain"
                print(f"{label:<5} decode {stats.decode_s:.3f} s, drafted {stats.drafted}")
    plain, spec = statistics.mean(times[False][1:]), statistics.mean(times[True])
    print(
        f"mean decode (the first plain run left out: first-use costs) plain {plain:.3f} s, "
        f"speculative {spec:.3f} s: {plain / spec:.3f}x"
    )


if __name__ == "__main__":
    main()

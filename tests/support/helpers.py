"""Test helpers that drive the real engine: KV invariants, argmax recording, exactness checks."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.cli.bench import NEAR_TIE, top2_margin
from app.config import DraftSettings, EngineSettings, Settings
from app.engine.backends.llama import LlamaBackend
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest, generate


def settings(mode: str = "auto", max_draft: int = 8, adaptive: bool = False, n_ctx: int = 2048) -> Settings:
    return Settings(
        engine=EngineSettings(n_ctx=n_ctx, n_threads=2),
        draft=DraftSettings(mode=mode, max_draft=max_draft, adaptive=adaptive),  # type: ignore[arg-type]
    )


class ArgmaxRecorder:
    """Delegates to a real backend and remembers the argmax of every logits row it returned."""

    device_topk_max = 0  # rows of logits only, each one recorded (no device top-k passes by)

    def __init__(self, backend: LlamaBackend) -> None:
        self._backend = backend
        self.passes: list[list[int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def decode(self, tokens: list[int], logits_from: int) -> np.ndarray:
        rows = self._backend.decode(tokens, logits_from)
        self.passes.append(rows.argmax(axis=1).tolist())
        return rows

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        best = self._backend.decode_argmax(tokens, logits_from)
        self.passes.append(list(best))
        return best


class TopKOnHost:
    """A real llama.cpp backend whose decode_topk (taken on the host from its rows, best first, ties to the
    lower id, as the native kernels) stands for a device top-k, so the engine's top-k path runs on a
    machine without a GPU. Counts the passes that went through it."""

    device_topk_max = 64

    def __init__(self, backend: LlamaBackend) -> None:
        self._backend = backend
        self.topk_passes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def decode_topk(self, tokens: list[int], logits_from: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        self.topk_passes += 1
        return self._backend.decode_topk(tokens, logits_from, k)


def run_checked(
    engine: Engine, prompt: list[int], max_tokens: int, speculative: bool, draft_prompt: bytes | None = None
) -> tuple[list[int], Any]:
    """Greedy generation that checks after every step: the target's KV holds exactly the committed tokens
    (all but the pending one), the drafter's KV holds nothing but committed tokens, and every emitted
    token is the target's argmax in the pass that emitted it."""
    recorder = ArgmaxRecorder(engine.target)
    request = GenerationRequest(
        prompt=prompt, max_tokens=max_tokens, draft_prompt=draft_prompt, speculative=speculative
    )
    seen = {"committed": len(prompt) + 1}
    speculation = engine.speculation if speculative else None
    drafter = speculation.drafter if speculation is not None else None

    def check(committed: list[int]) -> None:
        target = engine.target
        assert target.kv_tokens == committed[:-1]
        assert target.kv_pos_max() == len(committed) - 2
        emitted = committed[seen["committed"] :]
        assert emitted == recorder.passes[-1][: len(emitted)]
        seen["committed"] = len(committed)
        if drafter is not None and engine.draft_model is not None:
            dm = engine.draft_model
            assert dm.kv_pos_max() == len(dm.kv_tokens) - 1
            context = committed if engine.vocab_verdict and engine.vocab_verdict.compatible else None
            if context is not None:
                assert dm.kv_tokens == context[: len(dm.kv_tokens)]
            else:
                draft_context = drafter._drafter_context(committed)  # type: ignore[attr-defined]
                assert dm.kv_tokens == draft_context[: len(dm.kv_tokens)]

    engine.target.rollback(0)
    tokens: list[int] = []
    stats = None
    chunks = generate(recorder, request, speculation, None, check)  # type: ignore[arg-type]
    for chunk in chunks:
        tokens += chunk.tokens
        stats = chunk.stats or stats
    assert recorder.passes[0][-1] == tokens[0]  # the prefill pass emitted the first token
    assert engine.target.kv_tokens == (prompt + tokens)[:-1]  # what stays cached for the next request
    return tokens, stats


def assert_exact(engine: Engine, prompt: list[int], plain: list[int], spec: list[int]) -> int | None:
    """Identical outputs, or the first difference sits at a near-tie of the plain run. Returns it."""
    n = min(len(plain), len(spec))
    diff = next((i for i in range(n) if plain[i] != spec[i]), None)
    if diff is None:
        assert len(plain) == len(spec)
        return None
    margin = top2_margin(engine, prompt + plain[:diff])
    assert margin < NEAR_TIE, f"outputs part at token {diff} where the top-2 margin is {margin:.3f}"
    return diff

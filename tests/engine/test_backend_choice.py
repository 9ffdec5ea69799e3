"""`auto`'s choice of backend: the rule over recorded timings, its cache keyed by the file's SHA-256, and the
measuring path on real backends (on the CPU, llama.cpp on both sides: the path, not the winner, is tested)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from app.config import EngineSettings
from app.engine.backends.choice import (
    DECODE_PASSES,
    PROMPT_TOKENS,
    Timings,
    cache_key,
    cached_choice,
    choose_backend,
    decide,
)
from app.engine.backends.llama import LlamaBackend

CPU_512 = EngineSettings(n_ctx=512, n_threads=2, device="cpu")

# Decode steps and verify passes of 9 tokens (8 drafts + 1), ms, from docs/bench/h200-2026-12-01-fused/
# backends.txt (one H200, llama.cpp CUDA vs our kernels). That record has no prefill figure: both sides get
# the same prefill, so decoding alone decides these cases.
H200 = {  # model: (native step, native verify of 9, llama.cpp step, llama.cpp verify of 9)
    "gemma-3-270m": (0.9242, 1.936, 1.0365, 2.898),
    "qwen2.5-coder-1.5b": (1.8819, 4.816, 1.7492, 4.483),
    "random qwen2.5-7b shape": (4.4, 12.773, 3.9567, 7.627),
}
SAME_PREFILL_MS_PER_TOKEN = 0.02


def _timings(
    step_ms: float, verify_ms: float, prefill_ms_per_token: float = SAME_PREFILL_MS_PER_TOKEN
) -> Timings:
    return Timings(
        prefill_ms_per_token * PROMPT_TOKENS / 1e3, PROMPT_TOKENS, step_ms / 1e3, verify_ms / 1e3, 9
    )


@pytest.mark.parametrize(
    ("model", "drafting", "winner"),
    [
        ("gemma-3-270m", False, "native"),
        ("gemma-3-270m", True, "native"),
        ("qwen2.5-coder-1.5b", False, "llama"),
        ("qwen2.5-coder-1.5b", True, "llama"),
        ("random qwen2.5-7b shape", False, "llama"),
        ("random qwen2.5-7b shape", True, "llama"),
    ],
)
def test_recorded_h200_timings_choose_the_faster_backend(model: str, drafting: bool, winner: str) -> None:
    n_step, n_verify, l_step, l_verify = H200[model]
    choice = decide(_timings(n_step, n_verify), _timings(l_step, l_verify), drafting)
    assert choice.backend == winner
    pass_n, pass_l = (n_verify, l_verify) if drafting else (n_step, l_step)
    prefill_ms = SAME_PREFILL_MS_PER_TOKEN * PROMPT_TOKENS
    want = (prefill_ms + DECODE_PASSES * pass_l) / (prefill_ms + DECODE_PASSES * pass_n)
    assert choice.speedup == pytest.approx(want, abs=1e-3)
    assert f"{choice.speedup:.2f}x" in choice.reason
    assert ("verify of 9" in choice.reason) is drafting
    props = choice.as_dict()
    assert props["backend"] == winner
    assert props["native"]["step_ms"] == n_step
    assert props["llama"]["verify_ms"] == l_verify


def test_a_slower_prefill_can_outweigh_faster_decoding() -> None:
    n_step, n_verify, l_step, l_verify = H200["gemma-3-270m"]
    # decoding saves 256 x 0.112 ms = 29 ms; a prefill 0.1 ms/token slower costs 51 ms over 512 tokens
    native = _timings(n_step, n_verify, SAME_PREFILL_MS_PER_TOKEN + 0.1)
    choice = decide(native, _timings(l_step, l_verify), drafting=False)
    assert choice.backend == "llama"
    assert "decoding is faster on our kernels, prefill on llama.cpp" in choice.reason
    assert "chosen per model" in choice.reason


def test_a_tie_goes_to_llama_cpp() -> None:
    same = _timings(1.0, 2.0)
    assert decide(same, same, drafting=True).backend == "llama"


def test_the_cached_timings_decide_keyed_by_the_files_content(
    gemma_path: Path, qwen_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "backend-timings.json"
    device = "native kernels on GPU 0 (NVIDIA H200)"
    key = cache_key(gemma_path, device, 9, "b512:fa-auto:argmax-True")
    n_step, n_verify, l_step, l_verify = H200["qwen2.5-coder-1.5b"]
    recorded = {"native": asdict(_timings(n_step, n_verify)), "llama": asdict(_timings(l_step, l_verify))}
    cache.write_text(json.dumps({key: recorded}))
    choice = cached_choice(cache, key, drafting=True)
    assert choice is not None
    assert choice.cached
    assert choice.backend == "llama"
    # another file, another device or other settings have timings of their own
    assert cached_choice(cache, cache_key(qwen_path, device, 9, "b512:fa-auto:argmax-True"), True) is None
    assert cached_choice(cache, cache_key(gemma_path, "native kernels on GPU 1 (x)", 9, "b512"), True) is None
    assert cached_choice(cache, cache_key(gemma_path, device, 5, "b512:fa-auto:argmax-True"), True) is None


def test_choose_backend_times_both_sides_once_then_reads_the_cache(gemma_path: Path, tmp_path: Path) -> None:
    """Both candidates are llama.cpp on the CPU here (our kernels need a GPU): the timings, the cache, which
    loaders run and that the returned backend works are what is checked, not who wins."""
    cache = tmp_path / "timings.json"
    loads: list[str] = []

    def loader(label: str):
        def load() -> LlamaBackend:
            loads.append(label)
            return LlamaBackend(gemma_path, CPU_512)

        return load

    def choose() -> tuple[LlamaBackend, object]:
        first = LlamaBackend(gemma_path, CPU_512)
        return choose_backend(
            first,
            loader("native"),
            loader("llama"),
            width=2,
            settings="test",
            cache=cache,
            prompt_tokens=8,
            repeats=3,
        )

    model, choice = choose()
    try:
        assert model.decode_argmax([2, 3], 1)  # loaded and working
    finally:
        model.close()
    assert not choice.cached
    assert choice.native.width == choice.llama.width == 2
    assert min(choice.native.step_s, choice.llama.step_s, choice.native.prefill_s) > 0
    # the llama side was loaded to be timed; the native side again only where it won
    assert loads == (["llama"] if choice.backend == "llama" else ["llama", "native"])
    loads.clear()
    model, again = choose()
    model.close()
    assert again.cached
    assert (again.backend, again.native, again.llama) == (choice.backend, choice.native, choice.llama)
    assert loads == (["llama"] if choice.backend == "llama" else [])

"""The same exactness checks on a GPU build of llama.cpp (skipped without one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import DraftSettings, EngineSettings, Settings
from app.engine.backends.llama import gpu_offload_supported
from app.engine.engine import Engine
from tests.support.helpers import assert_exact, run_checked

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _needs_gpu() -> None:
    if not gpu_offload_supported():
        pytest.skip("this llama.cpp build has no GPU backend")


def _gpu_settings(mode: str, max_draft: int) -> Settings:
    return Settings(
        engine=EngineSettings(n_ctx=4096, device="gpu", draft_device="gpu"),
        draft=DraftSettings(mode=mode, max_draft=max_draft, adaptive=False),  # type: ignore[arg-type]
    )


def test_self_drafting_on_the_gpu_is_exact(gemma_path: Path) -> None:
    with Engine(gemma_path, gemma_path, _gpu_settings("model", 8)) as engine:
        assert engine.target.facts.device == "gpu"
        prompt = engine.render_chat([{"role": "user", "content": "List five prime numbers."}]).tokens
        plain, _ = run_checked(engine, prompt, 96, speculative=False)
        spec, st = run_checked(engine, prompt, 96, speculative=True)
        diff = assert_exact(engine, prompt, plain, spec)
        print(f"\nGPU gemma self-draft: acceptance {st.acceptance_rate:.3f}, parted at {diff}")


def test_ngram_on_the_gpu_is_exact(gemma_path: Path) -> None:
    with Engine(gemma_path, None, _gpu_settings("ngram", 16)) as engine:
        text = "def add(a, b):\n    return a + b\n\n" * 6
        prompt = engine.tokenize_text(text)
        plain, _ = run_checked(engine, prompt, 96, speculative=False)
        spec, st = run_checked(engine, prompt, 96, speculative=True)
        assert_exact(engine, prompt, plain, spec)
        assert st.accepted > 0

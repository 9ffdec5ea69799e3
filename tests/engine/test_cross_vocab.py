"""The cross-vocabulary drafter (Qwen2.5-Coder-0.5B target, gemma-3-270m drafting through text) where an
answer ends: at an end-of-generation token or a stop string inside a drafted step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.drafting.drafters import CrossVocabDrafter
from app.engine.engine import Engine
from app.engine.generation import Chunk, GenerationRequest
from app.engine.sampling import SamplingParams
from tests.support.helpers import settings


@pytest.fixture(scope="module")
def qwen_from_gemma(qwen_draft_path: Path, gemma_path: Path) -> Iterator[Engine]:
    with Engine(qwen_draft_path, gemma_path, settings("model", max_draft=4)) as engine:
        yield engine


def _drafter(engine: Engine) -> CrossVocabDrafter:
    assert isinstance(engine.drafter, CrossVocabDrafter)
    return engine.drafter


def _assert_drafter_holds_only(engine: Engine, committed: list[int]) -> None:
    """The drafter's KV holds nothing but its own tokens for the committed text."""
    assert engine.draft_model is not None
    context = _drafter(engine)._drafter_context(committed)
    kv = engine.draft_model.kv_tokens
    assert kv == context[: len(kv)]


def _answer(
    engine: Engine, text: str, stop: tuple[str, ...] = (), max_tokens: int = 48
) -> tuple[list[int], list[Chunk]]:
    """The chunks of a greedy answer, and the committed tokens (prompt and answer) at its end."""
    prompt = engine.render_chat([{"role": "user", "content": text}])
    engine.target.rollback(0)
    request = GenerationRequest(
        prompt=prompt.tokens,
        params=SamplingParams(),
        max_tokens=max_tokens,
        stop=stop,
        draft_prompt=prompt.draft_prompt,
    )
    chunks = list(engine.generate(request))
    return prompt.tokens + [t for c in chunks for t in c.tokens], chunks


def test_the_drafter_follows_a_history_cut_back_to_the_committed_tokens(qwen_from_gemma: Engine) -> None:
    """A drafted step hands the drafter the step's tokens, end-of-generation and all; the answer ends
    before that token, so the history the drafter last saw is cut back (once raised ValueError)."""
    engine = qwen_from_gemma
    drafter = _drafter(engine)
    prompt = engine.render_chat([{"role": "user", "content": "Say hello."}])
    drafter.begin(prompt.tokens, prompt.draft_prompt)
    kept = engine.target.tokenize(b"Hello there, friend", False, False)
    eog = next(t for t in range(engine.target.n_vocab) if engine.target.is_eog(t))
    drafter.propose(prompt.tokens + kept[:2], 4)
    drafter.sync(prompt.tokens + kept + [eog, kept[0]])  # the step: accepted drafts, EOG, beyond
    committed = prompt.tokens + kept  # what the answer kept
    drafter.sync(committed)
    _assert_drafter_holds_only(engine, committed)
    text = drafter.model.detokenize(drafter._drafter_context(committed))  # type: ignore[attr-defined]
    assert text.endswith(b"Hello there, friend")
    assert drafter.propose(committed, 3)  # it drafts on from there


def test_an_answer_that_ends_in_a_drafted_step_ends_cleanly(qwen_from_gemma: Engine) -> None:
    committed, chunks = _answer(qwen_from_gemma, "What is 2 + 2? Answer with the number only.")
    stats = chunks[-1].stats
    assert stats is not None
    assert chunks[-1].finish_reason == "stop"
    assert stats.drafted > 0
    assert stats.passes[-1][1] > 0  # the last pass verified a real draft: the end came inside it
    _assert_drafter_holds_only(qwen_from_gemma, committed)


def test_a_stop_string_inside_a_drafted_step_ends_cleanly(qwen_from_gemma: Engine) -> None:
    committed, chunks = _answer(
        qwen_from_gemma, "Count from 1 to 20, separated by commas.", stop=("7",), max_tokens=64
    )
    stats = chunks[-1].stats
    assert stats is not None
    assert chunks[-1].finish_reason == "stop"
    text = "".join(c.text for c in chunks)
    assert "7" not in text
    assert "6" in text
    assert stats.passes[-1][1] > 0
    _assert_drafter_holds_only(qwen_from_gemma, committed)

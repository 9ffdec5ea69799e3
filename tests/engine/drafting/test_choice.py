"""The drafter in use: a drafter model whose trial failed hands generations to n-gram lookup, and is
tried again later; /props says which drafter and why (gemma-3-270m drafting for itself, CPU)."""

from __future__ import annotations

from pathlib import Path

from app.engine.drafting.choice import RETRIAL_AFTER
from app.engine.drafting.policy import TRIAL_STEPS, TrialState
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest
from tests.support.helpers import settings


def _source(engine: Engine, prompt: list[int], max_tokens: int = 8) -> str:
    chunks = list(engine.generate(GenerationRequest(prompt=prompt, max_tokens=max_tokens)))
    stats = chunks[-1].stats
    assert stats is not None
    return stats.draft_source


def test_a_failed_drafter_model_hands_over_to_lookup_and_is_tried_again(gemma_path: Path) -> None:
    with Engine(gemma_path, gemma_path, settings("model", max_draft=4, adaptive=True)) as engine:
        policy = engine.policy
        assert policy is not None
        assert engine.props()["draft"]["choice"]["drafter"] == "model"
        # Whatever it accepts, a drafter that costs 10 s a token cannot pay: the trial must fail.
        policy.draft_cost_s = 10.0
        prompt = engine.tokenize_text("one two three four five six seven eight nine ten " * 4)
        assert _source(engine, prompt, max_tokens=48) == "model"
        assert policy.trial.drafted_steps == TRIAL_STEPS
        assert policy.trial.state is TrialState.FAILED
        choice = engine.props()["draft"]["choice"]
        assert choice["drafter"] == "ngram"
        assert choice["reason"].startswith("n-gram prompt lookup: the drafter model's trial of 8 drafted")
        assert choice["gained"]["generations"] == 1
        assert [_source(engine, prompt) for _ in range(RETRIAL_AFTER)] == ["ngram"] * RETRIAL_AFTER
        assert _source(engine, prompt) == "model"  # the next one tries the drafter model again
        assert policy.trial.state in (TrialState.RUNNING, TrialState.FAILED)
        assert engine.props()["draft"]["choice"]["gained"]["generations"] == RETRIAL_AFTER + 2

"""The packaged pair on the token path (CPU): Qwen2.5-Coder-1.5B drafted for by Qwen2.5-Coder-0.5B, and the
policy's trial of a drafter model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.drafting.drafters import ModelDrafter
from app.engine.drafting.policy import TRIAL_STEPS, TrialState
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest
from app.engine.sampling import SamplingParams
from tests.support.helpers import assert_exact, run_checked, settings

PROMPTS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "prompts.json").read_text())


def _prompt(name: str) -> list[dict]:
    return next(p["messages"] for p in PROMPTS if p["name"] == name)


@pytest.fixture(scope="module")
def qwen_pair(qwen_path: Path, qwen_draft_path: Path) -> Iterator[Engine]:
    with Engine(qwen_path, qwen_draft_path, settings("model", max_draft=4)) as engine:
        yield engine


def test_the_packaged_drafter_shares_the_default_models_vocabulary(qwen_pair: Engine) -> None:
    assert isinstance(qwen_pair.drafter, ModelDrafter)
    verdict = qwen_pair.vocab_verdict
    assert verdict is not None
    assert verdict.compatible, verdict.reasons
    assert verdict.target_size == verdict.drafter_size == 151936


def test_greedy_drafts_of_the_pair_are_exact_and_both_caches_hold_the_committed_tokens(
    qwen_pair: Engine,
) -> None:
    prompt = qwen_pair.render_chat(_prompt("write-merge-intervals")).tokens
    plain, _ = run_checked(qwen_pair, prompt, 32, speculative=False)
    spec, st = run_checked(qwen_pair, prompt, 32, speculative=True)
    assert_exact(qwen_pair, prompt, plain, spec)
    assert st.drafted > 0
    assert st.accepted > 0
    print(f"\nqwen 0.5B -> 1.5B: acceptance {st.acceptance_rate:.3f}, {st.mean_accepted_len:.2f} tokens/pass")


def test_sampled_drafts_of_the_pair_give_the_seeds_own_text(qwen_pair: Engine) -> None:
    """One uniform draw per emitted token: a seed gives the same text with and without drafts, and after
    every step both caches hold the committed tokens and nothing else."""
    engine = qwen_pair
    question = "Write a Python function that reverses a list."
    prompt = engine.render_chat([{"role": "user", "content": question}])
    model = engine.draft_model
    assert model is not None

    drafting = False  # a plain generation leaves the drafter's cache as the last drafted one left it

    def check(committed: list[int]) -> None:
        assert engine.target.kv_tokens == committed[:-1]
        assert engine.target.kv_pos_max() == len(committed) - 2
        if drafting:
            assert model.kv_tokens == committed[: len(model.kv_tokens)]
            assert model.kv_pos_max() == len(model.kv_tokens) - 1

    drafted = 0
    for seed in range(2):
        params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=seed)
        texts = []
        for speculative in (False, True):
            drafting = speculative
            request = GenerationRequest(
                prompt=prompt.tokens, params=params, max_tokens=16, speculative=speculative
            )
            chunks = list(engine.generate(request, on_step=check))
            texts.append("".join(c.text for c in chunks))
            stats = chunks[-1].stats
            assert stats is not None
            drafted += stats.drafted if speculative else 0
        assert texts[0] == texts[1]
    assert drafted > 0


def test_a_drafter_model_drafts_on_trial_before_its_priors_are_asked(
    qwen_path: Path, qwen_draft_path: Path
) -> None:
    """The adaptive policy drafts the trial's steps whatever its priors say; their outcome decides, and
    /props says which drafter is used and why."""
    with Engine(qwen_path, qwen_draft_path, settings("model", max_draft=4, adaptive=True)) as engine:
        assert engine.policy is not None
        assert engine.policy.trial.state is TrialState.RUNNING
        assert engine.props()["draft"]["choice"]["reason"].startswith("the drafter model on trial")
        prompt = engine.render_chat(_prompt("write-merge-intervals")).tokens
        spec, st = run_checked(engine, prompt, 48, speculative=True)
        plain, _ = run_checked(engine, prompt, 48, speculative=False)
        assert_exact(engine, prompt, plain, spec)
        trial = engine.policy.trial
        assert st.spec_steps >= TRIAL_STEPS
        assert trial.drafted_steps == TRIAL_STEPS
        assert trial.state in (TrialState.PAID, TrialState.FAILED)
        assert trial.draft_s > 0
        choice = engine.props()["draft"]["choice"]
        assert choice["trial"]["drafted_steps"] == TRIAL_STEPS
        assert trial.verdict in choice["reason"]
        expected = "model" if trial.state is TrialState.PAID else "ngram"
        assert choice["drafter"] == expected
        print(f"\n{choice['reason']}")

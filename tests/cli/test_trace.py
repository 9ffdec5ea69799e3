"""The trace-driven bench on the CPU: gemma-3-270m as target and drafter, real and synthetic traces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.catalog.packaged import PACKAGED
from app.cli import trace
from app.engine.drafting.policy import TRIAL_STEPS, TrialState
from app.engine.engine import Engine
from tests.support.helpers import settings

PROMPTS = json.loads((Path(__file__).resolve().parents[2] / "bench" / "prompts.json").read_text())
WRITE = next(p for p in PROMPTS if p["name"] == "write-merge-intervals")
N_TOKENS = 40


@pytest.fixture
def gemma_pair(gemma_path: Path) -> Iterator[Engine]:
    """A fresh pair per test: the policy (and its trial) learns across generations."""
    with Engine(gemma_path, gemma_path, settings("model", max_draft=4, adaptive=True)) as engine:
        yield engine


def _synthetic(value: int) -> dict[str, Any]:
    model = {"name": "synthetic", "file": "", "sha256": ""}
    agreement = [value] * N_TOKENS
    return {"version": trace.VERSION, "tokens": N_TOKENS, "target": model, "drafter": model,
            "prompts": [{"name": WRITE["name"], "kind": WRITE["kind"], "agreement": agreement}]}  # fmt: skip


def test_no_agreement_anywhere_drafts_only_on_trial(
    gemma_pair: Engine, capsys: pytest.CaptureFixture
) -> None:
    (report,) = trace.replay(gemma_pair, [WRITE], _synthetic(0), N_TOKENS, 1, as_json=False)
    assert "real-size costs, small-pair acceptance" in capsys.readouterr().out
    assert report.match  # the target verified every step: its greedy text, drafts or not
    st = report.stats
    assert st.accepted == 0
    # the trial's drafted steps, and at most a probe or two after it: the policy stopped drafting
    assert 1 <= st.spec_steps <= TRIAL_STEPS + 2
    assert gemma_pair.policy is not None
    assert gemma_pair.policy.trial.state is TrialState.FAILED
    assert report.drafter_passes >= st.spec_steps  # the drafter's real forward passes ran
    assert report.ideal == 1.0
    assert report.ideal_k == 0


def test_full_agreement_everywhere_is_drafted_and_accepted(gemma_pair: Engine) -> None:
    (report,) = trace.replay(gemma_pair, [WRITE], _synthetic(16), N_TOKENS, 1, as_json=True)
    assert report.match
    st = report.stats
    assert st.spec_steps >= TRIAL_STEPS
    # proposals are the target's own greedy text; batched passes round differently from single steps,
    # so a near-tie can still reject one
    assert st.acceptance_rate > 0.6
    assert report.drafter_passes > 0
    assert report.drafter_s > 0


def test_the_ideal_ratio_follows_agreement_and_costs() -> None:
    verify = [1.0, 1.1, 1.2, 1.3, 1.4]  # a pass of m tokens: m = 1..5
    assert trace.ideal_ratio([0] * 32, 32, verify, 0.1) == (1.0, 0)
    ratio, k = trace.ideal_ratio([16] * 32, 32, verify, 0.1)
    assert k == 4  # the longest draft: every token is kept
    assert ratio == pytest.approx(32 * 1.0 / ((32 / 5) // 1 * 1.8 + 1.8), rel=1e-9)
    assert trace.ideal_ratio([16] * 32, 32, verify, 2.0) == (1.0, 0)  # a drafter too dear never pays


def test_record_writes_each_positions_agreement_with_both_models_hashes(
    gemma_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "trace.json"
    with Engine(gemma_path, gemma_path, settings("model", max_draft=4)) as engine:
        recorded = trace.record(engine, [WRITE], 12, out)
    assert json.loads(out.read_text()) == recorded
    assert trace.load_trace(out) == recorded
    assert recorded["target"]["sha256"] == recorded["drafter"]["sha256"] == PACKAGED["gemma-3-270m"].sha256
    (entry,) = recorded["prompts"]
    assert len(entry["agreement"]) == 12
    assert all(0 <= a <= 12 - g for g, a in enumerate(entry["agreement"]))
    assert sum(entry["agreement"]) > 0  # a model agrees with itself, up to the rounding of batches

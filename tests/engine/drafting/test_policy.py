"""The draft-length policy on measured-looking cost curves."""

from __future__ import annotations

from app.engine.drafting.calibration import VerifyCosts
from app.engine.drafting.policy import TRIAL_STEPS, DraftPolicy, TrialState

# Measured on a 2-core CPU, Qwen2.5-Coder-1.5B Q4_K_M (ms): verifying m tokens costs about m steps.
CPU_QWEN = {1: 33.0, 2: 60.0, 4: 100.0, 8: 200.0, 16: 250.0, 17: 260.0}
# Measured on an H200, Qwen2.5-7B shape (ms): 16 tokens verify faster than 8.
H200_7B = {1: 4.33, 2: 4.18, 4: 5.72, 8: 8.38, 16: 7.31, 17: 7.4}


def _policy(points: dict[int, float], draft_cost: float = 0.0, max_draft: int = 16) -> DraftPolicy:
    return DraftPolicy(VerifyCosts.from_points({m: v / 1e3 for m, v in points.items()}, max_draft + 1),
                       max_draft, draft_cost)  # fmt: skip


def _teach(policy: DraftPolicy, rate: float, rounds: int = 200) -> None:
    """Feed acceptance observations with a per-position acceptance probability `rate` (deterministic)."""
    for r in range(rounds):
        accepted = 0
        while accepted < policy.max_draft and ((r * 7 + accepted * 13) % 100) < rate * 100:
            accepted += 1
        policy.observe_acceptance(policy.max_draft, accepted)


def test_interpolation_keeps_measured_points() -> None:
    c = VerifyCosts.from_points({1: 1.0, 4: 4.0, 8: 6.0}, 10)
    assert c.cost(1) == 1.0
    assert c.cost(4) == 4.0
    assert c.cost(8) == 6.0
    assert c.cost(2) == 2.0
    assert c.cost(6) == 5.0
    assert c.cost(10) == 7.5  # extrapolated linearly from the last point


def test_expensive_drafter_on_cpu_falls_back_to_plain() -> None:
    # gemma-3-270m costs ~0.39 of a Qwen-1.5B step on CPU; even perfect acceptance does not pay there.
    p = _policy(CPU_QWEN, draft_cost=0.39 * 0.033)
    _teach(p, 0.9)
    assert p.choose() == 0
    assert "would not pay" in p.last_reason


def test_free_accurate_drafts_on_cpu_go_long() -> None:
    p = _policy(CPU_QWEN)
    _teach(p, 1.0)
    k, gain = p.best()
    assert k == 16
    assert gain > 1.5
    assert p.choose() == 16


def test_non_monotonic_curve_prefers_16_over_8() -> None:
    p = _policy(H200_7B)
    _teach(p, 1.0)
    assert p.best()[0] == 16


def test_poor_acceptance_shortens_or_stops_drafts() -> None:
    p = _policy(H200_7B)
    _teach(p, 0.3)
    k, _ = p.best()
    assert k <= 2


def test_fallback_probes_back_off() -> None:
    p = _policy(CPU_QWEN, draft_cost=0.005)  # cheap enough that a perfect draft would pay
    _teach(p, 0.5)
    choices = [p.choose() for _ in range(16 + 32 + 1)]
    probes = [i for i, k in enumerate(choices) if k > 0]
    assert probes == [15, 47]  # after 16 plain steps, then after 32 more


def test_costs_follow_observations() -> None:
    p = _policy(CPU_QWEN)
    before = p.costs.cost(5)
    for _ in range(30):
        p.observe(4, 4, 0.050, 0.001)
    assert p.costs.cost(5) < before
    assert abs(p.costs.cost(5) - 0.050) < 0.005


def test_a_run_of_full_acceptances_turns_drafts_long_and_a_miss_stops_them() -> None:
    p = _policy(CPU_QWEN)
    for _ in range(30):  # copies: every draft accepted whole
        p.observe_acceptance(16, 16)
    for _ in range(30):  # prose: the first drafted token misses
        p.observe_acceptance(4, 0)
    assert not p.hot
    assert p.choose() == 0  # cold: drafting does not pay
    p.observe_acceptance(4, 4)  # a draft lands whole: a copy has started again
    assert p.hot
    assert p.choose() >= 12


def test_no_probe_where_even_perfect_drafts_lose() -> None:
    # A drafter costing a whole target step per token can never pay on a compute-bound CPU.
    p = _policy(CPU_QWEN, draft_cost=0.040)
    assert p.best_case_gain() < 1.0
    assert all(p.choose() == 0 for _ in range(200))


def test_no_probe_when_the_drafter_must_first_read_a_long_prompt() -> None:
    p = _policy(CPU_QWEN, draft_cost=0.005)
    _teach(p, 0.5)
    # 800 prompt tokens at 5 ms each (a CPU drafter's prefill) dwarf what 240 tokens could save.
    assert all(p.choose(lambda: 800 * 0.005, remaining=240) == 0 for _ in range(200))
    # A fast drafter (GPU prefill) may probe.
    assert any(p.choose(lambda: 800 * 0.00005, remaining=240) > 0 for _ in range(200))


# Measured on an H200, Qwen2.5-Coder-1.5B Q4_K_M (ms): steady passes replay a captured CUDA graph; the
# passes after a change of width run uncaptured (switch penalty, summed over those passes).
H200_STEADY = {1: 1.98, 2: 2.26, 4: 2.94, 8: 4.00, 16: 5.08, 17: 5.1}
H200_SWITCH = {1: 2.5, 2: 3.5, 4: 3.5, 8: 4.0, 16: 4.5, 17: 4.5}


def _gpu_policy() -> DraftPolicy:
    costs = VerifyCosts.from_points(
        {m: v / 1e3 for m, v in H200_STEADY.items()}, 17, {m: v / 1e3 for m, v in H200_SWITCH.items()}
    )
    return DraftPolicy(costs, 16, 0.0)


def test_drafts_grow_past_the_longest_length_tried_while_all_is_accepted() -> None:
    p = _policy(H200_7B)
    for _ in range(10):
        p.observe_acceptance(6, 6)
    assert p.hot
    assert p.choose() == 16  # untried positions lean on the accepted ones before them


def test_a_gpu_policy_keeps_its_width_and_pads_short_drafts() -> None:
    p = _gpu_policy()
    for _ in range(20):
        p.observe(16, 16, 0.0051, 0.0)
    assert p.width == 17
    assert p.choose() == 16
    assert p.pad_pays(3, 16)  # three real tokens: the pass stays at width 17
    cpu = _policy(CPU_QWEN)
    assert not cpu.pad_pays(3, 16)  # on a CPU, filler costs a full token each


def test_a_change_of_width_must_pay_its_switch_penalty() -> None:
    # Acceptance that pays a little on a steady width does not pay for leaving plain decoding.
    marginal = _gpu_policy()
    for _ in range(40):
        marginal.observe_acceptance(1, 1)
        marginal.observe_acceptance(1, 0)
    marginal.observe(0, 0, 0.00198, 0.0)
    assert marginal.width == 1
    k, gain = marginal.best()
    steady = (1 + marginal.acceptance()[0]) * H200_STEADY[1] / H200_STEADY[2]
    assert steady > 1.0  # on the steady curve a one-token draft would win...
    assert k == 0 or gain < steady  # ...the penalty of a new width takes that back


def test_a_gpu_policy_leaves_a_drafting_width_when_drafts_stop_landing() -> None:
    # Staying at width 5 costs less per pass than a plain step plus its switch penalty; the penalty is
    # paid once, though, and a plain stretch lasts: the policy must go plain, not stay for ever.
    p = _gpu_policy()
    for _ in range(6):
        p.observe(4, 0, 0.00298, 0.0, width=5)
    assert p.width == 5
    assert p.choose() == 0


def test_a_miss_in_a_hot_run_gets_one_more_draft_at_the_same_width() -> None:
    p = _gpu_policy()
    for _ in range(10):  # prose: drafts miss
        p.observe_acceptance(4, 0)
    for _ in range(10):  # then a copy
        p.observe(16, 16, 0.0051, 0.0, width=17)
    p.observe(16, 5, 0.0051, 0.0, width=17)  # an edited copy misses at the change
    assert not p.hot
    assert p.choose() == 16  # one more draft: the copy likely goes on after the edit
    p.observe(16, 0, 0.0051, 0.0, width=17)  # it did not
    assert p.choose() < 16


def test_a_long_match_in_a_copy_drafts_at_once_and_a_chance_pair_in_prose_goes_short() -> None:
    p = _gpu_policy()
    p.begin_request()
    p.set_match(2)  # the first tokens of an answer: a copy is assumed until the answer says otherwise
    assert p.choose(available=16) == 16
    p.observe(16, 16, 0.0051, 0.0, width=17)
    p.observe_foreseen([True] * 17)
    p.set_match(40)
    assert p.choose(available=16) == 16
    prose = _gpu_policy()
    prose.begin_request()
    prose.observe_foreseen([False] * 30)  # thirty tokens the lookup never foresaw
    assert not prose.dense()
    prose.set_match(2)
    assert prose.choose(available=16) <= 2
    prose.set_match(40)  # a long quotation, even in prose
    assert prose.choose(available=16) == 16


def test_match_classes_learn_apart() -> None:
    p = _gpu_policy()
    p.begin_request()
    p.observe_foreseen([True] * 30)
    p.set_match(3)
    for _ in range(30):  # three-token matches keep failing here...
        p.observe_acceptance(16, 0)
    assert p.choose(available=16) == 0
    p.set_match(20)  # ...which says nothing about twenty-token ones
    assert p.choose(available=16) == 16


def test_a_short_lookup_in_a_wide_stretch_is_padded_not_a_detour() -> None:
    p = _gpu_policy()
    p.begin_request()
    p.observe_foreseen([True] * 30)
    p.set_match(40)
    for _ in range(10):
        p.observe(16, 16, 0.0051, 0.0, width=17)
    p.set_match(40)
    assert p.choose(available=3) == 16  # three real tokens, padded: the width and its graph stay


def _excursion(p: DraftPolicy, accepted: int) -> None:
    """A plain stretch, one 16-token lookup draft keeping `accepted`, and back to plain steps."""
    for _ in range(3):
        p.observe(0, 0, 0.00198, 0.0)
    p.observe(16, accepted, 0.0068, 0.0, width=17)
    p.observe(0, 0, 0.0035, 0.0)


def test_an_answer_that_shares_only_phrases_stops_its_excursions_and_a_copy_does_not() -> None:
    # A chat answer in Markdown lists repeats its own phrases: the lookup foresees most tokens (a
    # "copy" by density) and its first drafted token is often right, but each draft keeps two or three.
    chat = _gpu_policy()
    chat.begin_request()
    chat.observe_foreseen([True] * 30)
    chat.set_match(4)
    assert chat.choose(available=16) == 16  # nothing says otherwise yet
    for accepted in (2, 3, 1):
        _excursion(chat, accepted)
    assert chat.goes_on() < 0.75
    chat.set_match(4)
    assert chat.choose(available=16) == 0
    # A real copy in the next answer starts from the priors again, and goes on.
    chat.begin_request()
    chat.observe_foreseen([True] * 30)
    chat.set_match(4)
    assert chat.choose(available=16) == 16
    for _ in range(5):
        chat.observe(16, 16, 0.0051, 0.0, width=17)
        chat.set_match(32)
        assert chat.choose(available=16) == 16
    assert chat.goes_on() > 0.95


def _trial_policy(points: dict[int, float], draft_cost: float) -> DraftPolicy:
    costs = VerifyCosts.from_points({m: v / 1e3 for m, v in points.items()}, 17)
    return DraftPolicy(costs, 16, draft_cost, trial_steps=TRIAL_STEPS)


def _drafted_step(p: DraftPolicy, accepted_of: int | None = None) -> int:
    """One step as generation makes it: a choice, and if it drafted, its outcome (all kept by default)."""
    k = p.choose()
    if k > 0:
        p.observe_draft_cost(k, k * p.draft_cost_s)
        p.observe(k, k if accepted_of is None else accepted_of, 0.2, 0.0)
    return k


def test_a_drafter_model_is_tried_before_its_priors_refuse_it() -> None:
    # The priors alone refuse a drafter this dear on a CPU (see above)...
    p = _trial_policy(CPU_QWEN, draft_cost=0.39 * 0.033)
    assert p.trial.state is TrialState.RUNNING
    # ...but the trial drafts its steps, and what they keep decides.
    ks = [_drafted_step(p, accepted_of=0) for _ in range(TRIAL_STEPS)]
    assert all(k > 0 for k in ks)
    assert p.trial.state is TrialState.FAILED
    assert p.trial.drafted_steps == TRIAL_STEPS
    assert p.trial.accepted == 0
    assert p.trial.draft_s > 0
    assert p.choose() == 0
    assert "trial of 8 drafted steps kept 0 of" in p.last_reason
    assert "plain decoding" in p.trial.verdict


def test_a_drafter_whose_trial_pays_goes_on_drafting() -> None:
    p = _trial_policy(H200_7B, draft_cost=0.0003)
    for _ in range(TRIAL_STEPS):
        assert _drafted_step(p) > 0
    assert p.trial.state is TrialState.PAID
    assert "so drafting" in p.trial.verdict
    assert p.choose() > 0


def test_a_failed_trial_can_be_run_again_and_lookups_need_none() -> None:
    p = _trial_policy(CPU_QWEN, draft_cost=0.39 * 0.033)
    for _ in range(TRIAL_STEPS):
        _drafted_step(p, accepted_of=0)
    p.retry_trial()
    assert p.trial.state is TrialState.RUNNING
    assert p.choose() > 0
    assert _policy(CPU_QWEN).trial.state is TrialState.NONE  # a lookup is scored for free instead
    fixed = DraftPolicy(VerifyCosts.from_points({1: 0.03}, 17), 16, 0.01, adaptive=False, trial_steps=8)
    assert fixed.trial.state is TrialState.NONE


def test_a_draft_that_read_the_prompt_first_tells_the_trial_its_cost_but_not_the_per_token_cost() -> None:
    p = _trial_policy(CPU_QWEN, draft_cost=0.010)
    p.observe_draft_cost(4, 2.0, per_token=False)  # 800 prompt tokens read, then 4 drafted
    assert p.draft_cost_s == 0.010
    assert p.trial.draft_s == 2.0
    p.observe_draft_cost(4, 0.08)
    assert p.draft_cost_s > 0.010

"""The sampler chain and the acceptance rules as pure functions on synthetic distributions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from app.engine.errors import InvalidRequest
from app.engine.sampling import Candidates, LogprobTrace, Sampler, SamplingParams, draw_index
from app.engine.speculative import rejection_accept, sample_and_compare

ALPHA = 0.001  # significance level of every goodness-of-fit test in this file


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_greedy_is_argmax_and_draws_nothing() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0.0, seed=1), 4)
    state = s.rng.bit_generator.state
    assert s.pick(logits, []) == 1
    assert s.rng.bit_generator.state == state


def test_repetition_penalty_moves_the_argmax() -> None:
    logits = np.array([0.0, 3.0, 2.9, -1.0], dtype=np.float32)
    s = Sampler(SamplingParams(temperature=0.0, repeat_penalty=1.5), 4)
    assert s.pick(logits, [1]) == 2  # 3.0 / 1.5 = 2.0 < 2.9
    assert s.pick(logits, [0], extra=[1]) == 2  # a token assumed accepted counts as history
    assert logits[1] == pytest.approx(3.0)  # the backend's row is never modified
    # an image's positions (-1: no token) penalise nothing, not the vocabulary's last token
    last = np.array([0.0, 1.0, 2.0, 3.0], dtype=np.float32)
    assert s.pick(last, [-1, -1, -1]) == 3


def test_top_k_top_p_min_p_match_their_definitions() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32) * 3
    order = np.argsort(-logits)
    # top-k
    ids, probs = Sampler(SamplingParams(temperature=1.0, top_k=5), 1000).distribution(logits, [])
    assert set(ids) == set(order[:5])
    np.testing.assert_allclose(probs, _softmax(logits[np.sort(order[:5])].astype(np.float64)), rtol=1e-6)
    # top-p: the smallest set of best tokens whose mass reaches p
    p_all = _softmax(logits.astype(np.float64))
    for top_p in (0.1, 0.5, 0.9, 0.999):
        ids, _ = Sampler(SamplingParams(temperature=1.0, top_p=top_p), 1000).distribution(logits, [])
        need = int(np.searchsorted(np.cumsum(p_all[order]), top_p)) + 1
        assert set(ids) == set(order[:need]), top_p
    # min-p
    ids, _ = Sampler(SamplingParams(temperature=1.0, min_p=0.2), 1000).distribution(logits, [])
    assert set(ids) == set(np.flatnonzero(p_all >= 0.2 * p_all.max()))


def test_temperature_scales_the_kept_logits() -> None:
    logits = np.array([1.0, 2.0, 0.5], dtype=np.float32)
    ids, probs = Sampler(SamplingParams(temperature=0.5), 3).distribution(logits, [])
    np.testing.assert_allclose(probs, _softmax(logits.astype(np.float64) / 0.5), rtol=1e-9)
    assert list(ids) == [0, 1, 2]


def test_sampling_follows_the_chain_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    s = Sampler(SamplingParams(temperature=1.0, top_k=3, seed=7), 4)
    n = 20_000
    counts = np.bincount([s.pick(logits, []) for _ in range(n)], minlength=4)
    expected = np.array([0.5, 0.3, 0.15, 0.0]) / 0.95 * n
    assert counts[3] == 0
    assert stats.chisquare(counts[:3], expected[:3]).pvalue > ALPHA


def _top_k(row: np.ndarray, k: int) -> Candidates:
    """What a device top-k hands over: the k best values, best first, ties to the lower id. (With ties
    at the k-th value the host's argpartition may keep other ids: both are top-k sets of the row.)"""
    ids = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    return Candidates(row[ids], ids.astype(np.int32))


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p", "temperature"),
    [(40, 0.95, 0.05, 0.7), (40, 1.0, 0.0, 1.0), (5, 0.5, 0.0, 1.3), (64, 0.99, 0.2, 0.2), (1, 0.9, 0, 0.7)],
)
def test_top_k_candidates_give_the_distribution_of_the_whole_row(
    top_k: int, top_p: float, min_p: float, temperature: float
) -> None:
    rng = np.random.default_rng(top_k)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=3)
    for trial in range(20):
        row = (rng.standard_normal(5000) * (1 + trial)).astype(np.float32)
        want_ids, want_p = Sampler(params, 5000).distribution(row, [])
        got_ids, got_p = Sampler(params, 5000).distribution(_top_k(row, top_k), [])
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_allclose(got_p, want_p, rtol=1e-12)
    # the same seed draws the same tokens from either form
    a, b = Sampler(params, 5000), Sampler(params, 5000)
    rows = [(rng.standard_normal(5000) * 3).astype(np.float32) for _ in range(50)]
    assert [a.pick(r, []) for r in rows] == [b.pick(_top_k(r, top_k), []) for r in rows]


def test_candidates_stand_in_only_for_a_top_k_chain_without_penalty() -> None:
    assert Sampler(SamplingParams(temperature=0.7, top_k=40), 10).device_k == 40
    assert Sampler(SamplingParams(temperature=0.0, top_k=40), 10).device_k == 0  # greedy: argmax
    assert Sampler(SamplingParams(temperature=0.7, top_k=0), 10).device_k == 0  # no top-k
    penalised = SamplingParams(temperature=0.7, top_k=40, repeat_penalty=1.1)
    assert Sampler(penalised, 10).device_k == 0  # the penalty reorders the row first
    row = np.arange(100, dtype=np.float32)
    with pytest.raises(ValueError, match="cannot stand for a top-40"):
        Sampler(SamplingParams(temperature=0.7, top_k=40), 100).distribution(_top_k(row, 20), [])


def test_draw_index_is_the_inverse_cdf() -> None:
    p = np.array([0.2, 0.0, 0.8])
    assert draw_index(p, 0.0) == 0
    assert draw_index(p, 0.19) == 0
    assert draw_index(p, 0.2) == 2
    assert draw_index(p, 0.999999) == 2


@pytest.mark.parametrize("vocab", [3, 6, 10])
def test_rejection_sampling_reproduces_the_target(vocab: int) -> None:
    """p/q rejection with the residual: whatever the drafter's q, the emitted token follows p."""
    rng = np.random.default_rng(vocab)
    p = _softmax(rng.normal(size=vocab) * 1.5)
    q = _softmax(rng.normal(size=vocab) * 1.5)
    n = 40_000
    out = np.empty(n, dtype=np.int64)
    accepted = 0
    for i in range(n):
        draft = draw_index(q, rng.random())
        ok, token = rejection_accept(p, q, draft, rng.random(), rng)
        accepted += ok
        out[i] = token
    counts = np.bincount(out, minlength=vocab)
    assert stats.chisquare(counts, p * n).pvalue > ALPHA
    # The acceptance rate is sum(min(p, q)), the overlap of the two distributions.
    assert accepted / n == pytest.approx(np.minimum(p, q).sum(), abs=0.015)


def test_sample_and_compare_reproduces_the_target_for_a_fixed_draft() -> None:
    rng = np.random.default_rng(3)
    p = _softmax(rng.normal(size=8))
    n = 40_000
    out = [sample_and_compare(p, 2, rng.random())[1] for _ in range(n)]
    assert stats.chisquare(np.bincount(out, minlength=8), p * n).pvalue > ALPHA


def test_two_token_speculative_chain_matches_plain_sampling() -> None:
    """A synthetic target (a Markov chain over 5 tokens) and a greedy drafter from another chain:
    the joint law of the first two emitted tokens equals the target's p(a) p(b|a)."""
    rng = np.random.default_rng(11)
    vocab = 5
    target = np.stack([_softmax(rng.normal(size=vocab) * 1.2) for _ in range(vocab)])
    drafter = np.stack([_softmax(rng.normal(size=vocab) * 1.2) for _ in range(vocab)])
    start = 0
    n = 30_000
    counts = np.zeros((vocab, vocab))
    for _ in range(n):
        # draft two tokens greedily from the drafter, verify both in one "pass"
        d1 = int(drafter[start].argmax())
        d2 = int(drafter[d1].argmax())
        ok, a = sample_and_compare(target[start], d1, rng.random())
        if ok:
            _, b = sample_and_compare(target[d1], d2, rng.random())
        else:
            b = draw_index(target[a], rng.random())  # the next step starts from the target's token
        counts[a, b] += 1
    expected = target[start][:, None] * target * n
    assert stats.chisquare(counts.ravel(), expected.ravel()).pvalue > ALPHA


def test_params_come_from_the_configured_defaults_with_overrides() -> None:
    from app.config import SamplingSettings

    defaults = SamplingSettings()
    p = SamplingParams.from_settings(defaults, temperature=0.0, seed=None, top_k=5)
    assert (p.temperature, p.top_k, p.seed) == (0.0, 5, defaults.seed)
    assert (p.top_p, p.min_p, p.repeat_last_n) == (defaults.top_p, defaults.min_p, defaults.repeat_last_n)


# --- penalties, logit bias and logprobs (llama.cpp's penalties and logit-bias samplers) ---------------
def test_presence_and_frequency_penalties_follow_llama_cpp() -> None:
    logits = np.array([2.0, 1.9, 1.0, -1.0], dtype=np.float32)
    history = [0, 0, 0, 3]  # token 0 three times, token 3 once
    for params, want in (
        (SamplingParams(presence_penalty=0.5), [1.5, 1.9, 1.0, -1.5]),
        (SamplingParams(frequency_penalty=0.5), [0.5, 1.9, 1.0, -1.5]),
        (SamplingParams(repeat_penalty=2.0, frequency_penalty=0.1), [0.7, 1.9, 1.0, -2.1]),
    ):
        sampler = Sampler(params, 4)
        np.testing.assert_allclose(sampler._penalised(logits, history, []), want, rtol=1e-6)
    assert Sampler(SamplingParams(presence_penalty=0.5), 4).pick(logits, history) == 1
    assert Sampler(SamplingParams(presence_penalty=0.5, repeat_last_n=1), 4).pick(logits, history) == 0
    assert logits[0] == pytest.approx(2.0)  # the backend's row is never modified


def test_a_logit_bias_adds_to_its_tokens() -> None:
    logits = np.array([2.0, 1.0, 0.0], dtype=np.float32)
    assert Sampler(SamplingParams(logit_bias=((2, 100.0),)), 3).pick(logits, []) == 2
    assert Sampler(SamplingParams(logit_bias=((0, -100.0),)), 3).pick(logits, []) == 1
    ids, probs = Sampler(SamplingParams(temperature=1.0, logit_bias=((1, 1.0),)), 3).distribution(logits, [])
    assert list(ids) == [0, 1, 2]
    np.testing.assert_allclose(probs, _softmax(np.array([2.0, 2.0, 0.0])), rtol=1e-6)
    with pytest.raises(InvalidRequest, match="logit_bias"):
        Sampler(SamplingParams(logit_bias=((3, 1.0),)), 3)


def test_whatever_changes_the_row_keeps_argmax_and_top_k_on_the_host() -> None:
    for params in (
        SamplingParams(presence_penalty=0.1),
        SamplingParams(frequency_penalty=0.1),
        SamplingParams(logit_bias=((1, 1.0),)),
        SamplingParams(logprobs=LogprobTrace(2)),
    ):
        assert not params.plain_greedy
        assert Sampler(replace(params, temperature=0.7, top_k=40), 10).device_k == 0
    assert SamplingParams(presence_penalty=0.1, repeat_last_n=0).plain_greedy  # an empty window: nothing


def test_the_logprob_trace_records_every_pick_from_the_raw_row() -> None:
    logits = np.log(np.array([0.6, 0.3, 0.1], dtype=np.float32))
    trace = LogprobTrace(top_n=2)
    sampler = Sampler(SamplingParams(temperature=1.0, seed=3, logprobs=trace, presence_penalty=1.0), 3)
    picks = [sampler.pick(logits, [0]) for _ in range(20)]
    assert [t.token for t in trace.tokens] == picks
    for entry in trace.tokens:  # the model's distribution, before penalties and temperature
        assert entry.logprob == pytest.approx(float(np.log([0.6, 0.3, 0.1][entry.token])), abs=1e-6)
        assert [t for t, _ in entry.top] == [0, 1]
        assert entry.top[0][1] == pytest.approx(np.log(0.6), abs=1e-6)

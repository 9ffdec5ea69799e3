"""One speculative step (verify -> accept -> roll back) and the acceptance rules as pure functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from app.engine.backends.base import Backend
from app.engine.sampling import Candidates, Sampler, draw_index


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]  # emitted this step: accepted drafts, then the target's own token
    accepted: int  # how many of `tokens` came from the draft
    verify_s: float


def sample_and_compare(p: np.ndarray, draft: int, u: float) -> tuple[bool, int]:
    """Acceptance for a deterministic drafter: draw from the target p; accept when it is the draft.

    The emitted token is always the target's own draw, so the output law is exactly p.
    """
    token = draw_index(p, u)
    return token == draft, token


def rejection_accept(
    p: np.ndarray, q: np.ndarray, draft: int, u: float, rng: np.random.Generator
) -> tuple[bool, int]:
    """p/q rejection sampling for a drafter that samples from q (Leviathan et al. 2023, Chen et al. 2023).

    Accept the draft with probability min(1, p/q); otherwise draw from the residual max(p - q, 0).
    The token returned is distributed exactly as p.
    """
    if q[draft] > 0 and u * q[draft] < p[draft]:
        return True, draft
    residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if total <= 0:  # p == q: the rejection above can only fail by rounding
        return True, draft
    return False, draw_index(residual / total, rng.random())


def sampled_rows(
    target: Backend, sampler: Sampler, tokens: list[int], logits_from: int
) -> Sequence[np.ndarray | Candidates]:
    """Rows logits_from.. of a pass for a sampled request: the device's top-k of each row where the
    backend has one and the sampler chain starts with a top-k it covers, else the rows of logits."""
    k = sampler.device_k
    if k and k <= target.device_topk_max:
        values, ids = target.decode_topk(tokens, logits_from, k)
        return [Candidates(v, i) for v, i in zip(values, ids, strict=True)]
    return target.decode(tokens, logits_from)


def accept_best(best: list[int], draft: list[int]) -> tuple[list[int], int]:
    """Greedy acceptance from the target's argmax after each prefix: (emitted tokens, accepted drafts)."""
    accepted = 0
    while accepted < len(draft) and best[accepted] == draft[accepted]:
        accepted += 1
    return best[: accepted + 1], accepted


def accept_rows(
    sampler: Sampler, rows: Sequence[np.ndarray | Candidates], committed: list[int], draft: list[int]
) -> tuple[list[int], int]:
    """Sample-and-compare over a pass's k + 1 rows: (emitted tokens, accepted drafts); one draw per token."""
    out: list[int] = []
    for i, proposed in enumerate(draft):
        token = sampler.pick(rows[i], committed, draft[:i])
        out.append(token)
        if token != proposed:
            return out, i
    out.append(sampler.pick(rows[len(draft)], committed, draft))
    return out, len(draft)


def verify(
    target: Backend,
    sampler: Sampler,
    committed: list[int],
    draft: list[int],
    clock: Callable[[], float],
) -> StepResult:
    """Run [pending] + draft through the target in one pass and accept the longest agreeing prefix.

    committed ends with the pending token, the one not yet in the target's KV (which holds exactly
    committed[:-1] on entry). On return the KV holds committed + the accepted drafts, whatever happened.
    """
    n_keep = len(committed)
    accepted = 0
    t0 = clock()
    try:
        if sampler.params.plain_greedy:
            best = target.decode_argmax([committed[-1], *draft], 0)  # the target's token after each prefix
            verify_s = clock() - t0
            tokens, accepted = accept_best(best, draft)
        else:
            rows = sampled_rows(target, sampler, [committed[-1], *draft], 0)  # one per token: k + 1
            verify_s = clock() - t0
            tokens, accepted = accept_rows(sampler, rows, committed, draft)
        return StepResult(tokens, accepted, verify_s)
    finally:
        target.rollback(n_keep + accepted)

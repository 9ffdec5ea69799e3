"""The target's sampler chain: penalties -> top-k -> top-p -> min-p -> temperature -> one draw.

The order is llama.cpp's default chain. Every emitted token costs exactly one uniform draw from the
request's generator, whether it came from a plain step or from verifying a draft, so a seeded
speculative run reproduces the seeded plain run token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from app.config import SamplingSettings

_NUCLEUS_PROBE = 256  # top-p first looks at the best 256 candidates; a full sort only when they fall short


@dataclass(frozen=True)
class Candidates:
    """A row's top-k logits as a backend's device top-k hands them over, instead of the whole row:
    values (best first) and their token ids. Enough for a chain that starts with the same top-k."""

    values: np.ndarray
    ids: np.ndarray


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    @classmethod
    def from_settings(cls, defaults: SamplingSettings, **overrides: Any) -> SamplingParams:
        """The configured defaults, with every override that is not None taking their place."""
        values = {f.name: getattr(defaults, f.name) for f in fields(cls)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that needs the logits on the host: the argmax can come from the device."""
        return self.greedy and (self.repeat_penalty == 1.0 or self.repeat_last_n == 0)


class Sampler:
    """Turns a row of logits into one token under one request's parameters and random stream."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self.rng = np.random.Generator(np.random.PCG64(params.seed))
        self._work = np.empty(n_vocab, dtype=np.float32)
        self._uses_penalty = params.repeat_penalty != 1.0 and params.repeat_last_n > 0

    def _penalised(self, logits: np.ndarray, history: list[int], extra: list[int]) -> np.ndarray:
        """Logits after the repetition penalty over the last tokens of history + extra."""
        if not self._uses_penalty or not (history or extra):
            return logits
        np.copyto(self._work, logits)
        n = self.params.repeat_last_n
        recent = (history[-n:] + extra)[-n:]
        window = np.unique(np.asarray(recent, dtype=np.int64))
        window = window[window >= 0]  # image positions hold no token (-1)
        vals = self._work[window]
        penalty = self.params.repeat_penalty
        self._work[window] = np.where(vals > 0, vals / penalty, vals * penalty)
        return self._work

    @property
    def device_k(self) -> int:
        """k of the top-k that can stand for a whole row (Candidates), or 0 when the chain needs the row:
        greedy, a repetition penalty (it reorders logits before the top-k), or no top-k."""
        p = self.params
        return p.top_k if not p.greedy and not self._uses_penalty and p.top_k > 0 else 0

    def distribution(
        self, logits: np.ndarray | Candidates, history: list[int], extra: list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Candidate ids (ascending) and their probabilities after the whole chain."""
        p = self.params
        if isinstance(logits, Candidates):  # the top-k is done: the chain goes on from it
            if self.device_k != len(logits.ids):
                raise ValueError(f"{len(logits.ids)} candidates cannot stand for a top-{p.top_k} chain's row")
            local, vals = self._after_top_k(logits.values, np.arange(len(logits.ids)))
            return self._normalised(logits.ids.astype(np.int64)[local], vals)
        x = self._penalised(logits, history, extra or [])
        if p.greedy:
            return np.array([int(x.argmax())]), np.array([1.0])
        n = x.shape[0]
        ids = np.argpartition(x, n - p.top_k)[n - p.top_k :] if 0 < p.top_k < n else None
        if ids is None and p.top_p >= 1.0 and p.min_p <= 0.0:
            return self._normalised(np.arange(n), x, ordered=True)
        ids, vals = self._after_top_k(x, ids)
        return self._normalised(ids, vals)

    def _after_top_k(self, x: np.ndarray, ids: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """top-p, then min-p, over x (or the ids of x that the top-k kept): (ids, their values)."""
        p = self.params
        if p.top_p < 1.0:
            ids = self._nucleus(x, ids, p.top_p)
        vals = x if ids is None else x[ids]
        if p.min_p > 0.0:
            # min-p on the untempered distribution: keep p(t) >= min_p * p(max)
            keep = vals >= vals.max() + np.log(p.min_p)
            ids = np.flatnonzero(keep) if ids is None else ids[keep]
            vals = vals[keep]
        if ids is None:
            ids = np.arange(x.shape[0])
        return ids, vals

    def _normalised(
        self, ids: np.ndarray, vals: np.ndarray, ordered: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending, the tempered softmax of their values)."""
        if not ordered:
            order = np.argsort(ids, kind="stable")
            ids, vals = ids[order], vals[order]
        z = vals.astype(np.float64) / self.params.temperature
        z -= z.max()
        probs = np.exp(z)
        probs /= probs.sum()
        return ids, probs

    @staticmethod
    def _nucleus(x: np.ndarray, ids: np.ndarray | None, top_p: float) -> np.ndarray:
        vals = x if ids is None else x[ids]
        m = vals.shape[0]
        lse_max = float(vals.max())
        total = float(np.exp(vals.astype(np.float64) - lse_max).sum())
        probe = min(_NUCLEUS_PROBE, m)
        best = np.argpartition(vals, m - probe)[m - probe :] if probe < m else np.arange(m)
        best = best[np.argsort(-vals[best], kind="stable")]
        cum = np.cumsum(np.exp(vals[best].astype(np.float64) - lse_max)) / total
        if cum[-1] < top_p and probe < m:
            best = np.argsort(-vals, kind="stable")
            cum = np.cumsum(np.exp(vals[best].astype(np.float64) - lse_max)) / total
        cut = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix whose mass reaches top_p
        chosen = best[: min(cut, best.shape[0])]
        return chosen if ids is None else ids[chosen]

    def pick(
        self, logits: np.ndarray | Candidates, history: list[int], extra: list[int] | None = None
    ) -> int:
        """One token after history (+ extra, tokens assumed accepted); sampled requests draw once."""
        extra = extra or []
        if self.params.greedy and not isinstance(logits, Candidates):
            return int(self._penalised(logits, history, extra).argmax())
        ids, probs = self.distribution(logits, history, extra)
        return int(ids[draw_index(probs, self.rng.random())])


def draw_index(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the index whose cumulative probability interval holds u."""
    cum = np.cumsum(probs)
    return min(int(np.searchsorted(cum, u * cum[-1], side="right")), probs.shape[0] - 1)

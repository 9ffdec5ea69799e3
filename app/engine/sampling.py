"""The target's sampler chain: logit bias -> penalties -> grammar -> top-k -> top-p -> min-p -> temperature.

The order is llama.cpp's default chain, with a request's grammar (structured output, forced tool calls)
masking what may not come next. Every emitted token costs exactly one uniform draw from the request's
generator, whether it came from a plain step or from verifying a draft, so a seeded speculative run
reproduces the seeded plain run token for token. Every token the sampler picks is emitted (verification
stops at the first pick that differs from the draft), so the grammar advances exactly with the reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from app.config import SamplingSettings
from app.engine.errors import InvalidRequest
from app.engine.grammar import Grammar, GrammarError, GrammarState

_NUCLEUS_PROBE = 256  # top-p first looks at the best 256 candidates; a full sort only when they fall short
_GRAMMAR_PROBE = 256  # a constrained top-k is looked for among this many best tokens before the whole row


class SamplingError(InvalidRequest):
    """A sampling field this model cannot take; `param` names it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Candidates:
    """A row's top-k logits as a backend's device top-k hands them over, instead of the whole row:
    values (best first) and their token ids. Enough for a chain that starts with the same top-k."""

    values: np.ndarray
    ids: np.ndarray


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability under the model (softmax of its logits row) and the best ones."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob), best first


@dataclass(eq=False)
class LogprobTrace:
    """Filled by the Sampler as it picks: one TokenLogprob per emitted token, in order."""

    top_n: int = 0
    tokens: list[TokenLogprob] = field(default_factory=list)

    def record(self, row: np.ndarray, token: int) -> None:
        wide = row.astype(np.float64)
        peak = float(wide.max())
        log_total = peak + float(np.log(np.exp(wide - peak).sum()))
        top: tuple[tuple[int, float], ...] = ()
        if self.top_n > 0:
            n = min(self.top_n, wide.shape[0])
            best = np.argpartition(wide, wide.shape[0] - n)[wide.shape[0] - n :]
            best = best[np.lexsort((best, -wide[best]))]
            top = tuple((int(t), float(wide[t]) - log_total) for t in best)
        self.tokens.append(TokenLogprob(token, float(wide[token]) - log_total, top))


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64  # the window of all three penalties, prompt included (as llama.cpp's)
    presence_penalty: float = 0.0  # subtracted once from a token that occurs in the window
    frequency_penalty: float = 0.0  # subtracted per occurrence in the window
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, added to its logit)
    seed: int | None = None
    grammar: Grammar | None = None  # the reply must follow it (bound to the model's vocabulary)
    logprobs: LogprobTrace | None = None  # where the emitted tokens' log-probabilities go

    @classmethod
    def from_settings(cls, defaults: SamplingSettings, **overrides: Any) -> SamplingParams:
        """The configured defaults, with every override that is not None taking their place."""
        values = {f.name: getattr(defaults, f.name) for f in fields(cls) if hasattr(defaults, f.name)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalised(self) -> bool:
        """Penalties or biases that change the logits before the chain (the host needs the row)."""
        penalty = self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        return bool(self.logit_bias) or (penalty and self.repeat_last_n > 0)

    @property
    def needs_rows(self) -> bool:
        """The whole logits row of every step is needed on the host (no device argmax or top-k)."""
        return self.penalised or self.grammar is not None or self.logprobs is not None

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that needs the logits on the host: the argmax can come from the device."""
        return self.greedy and not self.needs_rows


class Sampler:
    """Turns a row of logits into one token under one request's parameters and random stream."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        self.params = params
        self.n_vocab = n_vocab
        self.rng = np.random.Generator(np.random.PCG64(params.seed))
        self._work = np.empty(n_vocab, dtype=np.float32)
        p = params
        self._penalty = p.repeat_last_n > 0 and (
            p.repeat_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
        )
        self._bias_ids = np.array([t for t, _ in p.logit_bias], dtype=np.int64)
        self._bias = np.array([b for _, b in p.logit_bias], dtype=np.float32)
        if self._bias_ids.size and (self._bias_ids.min() < 0 or self._bias_ids.max() >= n_vocab):
            raise SamplingError(f"token ids must lie in 0..{n_vocab - 1} for this model", "logit_bias")
        self.grammar = GrammarState(p.grammar, n_vocab) if p.grammar is not None else None

    def _penalised(self, logits: np.ndarray, history: list[int], extra: list[int]) -> np.ndarray:
        """Logits after the logit bias and the penalties over the last tokens of history + extra."""
        if not (self._penalty and (history or extra)) and not self._bias_ids.size:
            return logits
        np.copyto(self._work, logits)
        if self._bias_ids.size:
            np.add.at(self._work, self._bias_ids, self._bias)
        if not (self._penalty and (history or extra)):
            return self._work
        p = self.params
        n = p.repeat_last_n
        recent = np.asarray((history[-n:] + extra)[-n:], dtype=np.int64)
        window, counts = np.unique(recent[recent >= 0], return_counts=True)  # images hold no token (-1)
        vals = self._work[window]
        if p.repeat_penalty != 1.0:
            vals = np.where(vals > 0, vals / p.repeat_penalty, vals * p.repeat_penalty)
        vals = vals - (counts * p.frequency_penalty + p.presence_penalty).astype(np.float32)
        self._work[window] = vals
        return self._work

    def _masked(self, x: np.ndarray) -> np.ndarray:
        """x with every token the grammar does not allow next at -inf."""
        assert self.grammar is not None
        allowed = self.grammar.allowed()
        if not allowed.any():
            raise GrammarError("the grammar allows no token here", self.grammar.param)
        if x is not self._work:
            np.copyto(self._work, x)
        self._work[~allowed] = -np.inf
        return self._work

    def _constrained_ids(self, x: np.ndarray) -> np.ndarray:
        """The tokens a sampled constrained step chooses from, before top-p and min-p: the top-k of those the
        grammar allows (all of them without a top-k). Looked for among the best tokens first: any allowed
        token outside them has a lower logit than each of them."""
        assert self.grammar is not None
        n, k = x.shape[0], self.params.top_k
        if 0 < k < n:
            m = min(max(_GRAMMAR_PROBE, k), n)
            best = np.argpartition(x, n - m)[n - m :]
            ok = best[self.grammar.allowed(best)]
            if len(ok) >= k:
                return ok[np.argpartition(x[ok], len(ok) - k)[len(ok) - k :]]
        ids = np.flatnonzero(self.grammar.allowed())
        if len(ids) == 0:
            raise GrammarError("the grammar allows no token here", self.grammar.param)
        if 0 < k < len(ids):
            ids = ids[np.argpartition(x[ids], len(ids) - k)[len(ids) - k :]]
        return ids

    @property
    def device_k(self) -> int:
        """k of the top-k that can stand for a whole row (Candidates), or 0 when the chain needs the row:
        greedy, a penalty or bias (they reorder logits before the top-k), a grammar, logprobs, or no top-k."""
        p = self.params
        return p.top_k if not p.greedy and not p.needs_rows and p.top_k > 0 else 0

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
            return np.array([self._argmax(x)]), np.array([1.0])
        if self.grammar is not None:
            ids, vals = self._after_top_k(x, self._constrained_ids(x))
            return self._normalised(ids, vals)
        n = x.shape[0]
        ids = np.argpartition(x, n - p.top_k)[n - p.top_k :] if 0 < p.top_k < n else None
        if ids is None and p.top_p >= 1.0 and p.min_p <= 0.0:
            return self._normalised(np.arange(n), x, ordered=True)
        ids, vals = self._after_top_k(x, ids)
        return self._normalised(ids, vals)

    def _argmax(self, x: np.ndarray) -> int:
        """The best token the grammar allows (the row's argmax unless the grammar refuses it)."""
        token = int(x.argmax())
        if self.grammar is not None and not self.grammar.allows(token):
            token = int(self._masked(x).argmax())
        return token

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
        """One token after history (+ extra, tokens assumed accepted); sampled requests draw once.

        The token is taken: the grammar advances past it and the logprob trace records it."""
        extra = extra or []
        if self.params.greedy and not isinstance(logits, Candidates):
            token = self._argmax(self._penalised(logits, history, extra))
        else:
            ids, probs = self.distribution(logits, history, extra)
            token = int(ids[draw_index(probs, self.rng.random())])
        if self.grammar is not None:
            self.grammar.accept(token)
        if self.params.logprobs is not None and not isinstance(logits, Candidates):
            self.params.logprobs.record(logits, token)
        return token


def draw_index(probs: np.ndarray, u: float) -> int:
    """Inverse-CDF draw: the index whose cumulative probability interval holds u."""
    cum = np.cumsum(probs)
    return min(int(np.searchsorted(cum, u * cum[-1], side="right")), probs.shape[0] - 1)

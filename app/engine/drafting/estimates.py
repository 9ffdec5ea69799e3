"""What the draft policy learns as it goes: acceptance by draft state and position, how far an answer is a
copy, how long drafting stretches last, the passes so far, when to probe again."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

# Acceptance memory: every observation ages every position, so a position that is no longer reached
# (the first token keeps missing) drifts back to the prior instead of keeping a stale, hopeful figure.
DECAY = 0.95
# A lookup's draft is judged by how long a stretch before it matched its source: the longer, the likelier
# the copy goes on (measured over bench/prompts.json with Qwen2.5-Coder-1.5B: a 2-token match in a chat
# answer kept 1.7 of 16 drafted tokens, a 32-token match in a code edit 14.5). Each length class learns
# its own acceptance, starting from a prior that grows with the length.
MATCH_CLASSES = (2, 3, 4, 6, 8, 12, 16, 24, 32)
# ...and by whether the answer is a copy so far: an edited copy of code keeps matching its source
# between the edits, while prose matches a word pair by chance. "Dense": at least 60% of the last 16
# tokens were what the lookup would have proposed. On a GPU the first tokens of an answer count as
# dense: a draft wasted there costs little, a copy missed from its start costs a fifth of a short edit.
# (Chosen with scripts/policy-sim.py over bench/prompts.json at 128, 256 and 384 tokens.)
COPY_WINDOW = 16
COPY_DENSE = 0.6
COPY_START = 4
# In a copy the first drafted token is the question; once it is taken the source usually goes on.
# How often it went on is learned per answer, pooled over every lookup's draft (each match class sees
# too few drafts to learn it alone): an answer that only shares phrases with its context (a chat
# answer in Markdown lists) keeps two or three tokens of each draft, and on an H200 a 16-token
# excursion and back must keep about four to pay (bench-ngram-chat.jsonl in docs/bench).
COPY_GOES_ON = 0.9
_GOES_ON_WEIGHT = 4.0
_PRIOR_WEIGHT = 1.0  # observations a prior counts for
_PRIOR_ACCEPT = 0.5  # a drafter model's: enough to try drafting before anything is measured
# A change of width pays its switch penalty once; the policy spreads it over the steps a drafting
# stretch is expected to last: a running mean of past stretches, or for a lookup in a copy what its
# acceptance implies (measured on an H200: a change costs the next two passes about three plain steps,
# so a short excursion into drafting and back rarely pays).
RUN_PRIOR = 4.0
_RUN_EMA = 0.2
_RUN_PRIOR_WEIGHT = 0.5
_FIRST_PROBE = 16
_LAST_PROBE = 1024


class Kind(Enum):
    """What made the draft at hand; drafts of each kind learn apart."""

    MODEL = "model"  # a drafter model
    COPY = "lookup in a copy"  # a lookup while the answer is mostly what the lookup foresaw
    PROSE = "lookup in prose"  # a lookup elsewhere, where a match is likelier chance


@dataclass(frozen=True)
class DraftState:
    """The state a draft is made in. A drafter model's drafts come in runs: after a draft of 3+ tokens
    accepted whole the drafter is in step with the target ("hot"), otherwise "cold". A lookup's is the
    class of its match length, in a copy or in prose."""

    kind: Kind
    hot: bool = False  # a drafter model's
    match_class: int = 0  # a lookup's: index into MATCH_CLASSES

    @property
    def lookup(self) -> bool:
        return self.kind is not Kind.MODEL

    def prior(self) -> float:
        """The chance of a first drafted position before any is seen."""
        if self.kind is Kind.MODEL:
            return _PRIOR_ACCEPT
        length = MATCH_CLASSES[self.match_class]
        return length / (length + (1.0 if self.kind is Kind.COPY else 2.0))

    def floor(self) -> float:
        """Where an answer's drafts have not gone on, a long match still may: m / (m + 2) for a match of m."""
        length = MATCH_CLASSES[self.match_class] if self.lookup else 0
        return length / (length + 2.0)


COLD = DraftState(Kind.MODEL)
HOT = DraftState(Kind.MODEL, hot=True)


def lookup_state(match_len: int, dense: bool) -> DraftState:
    """The state of a lookup's draft whose last `match_len` tokens matched its source."""
    match_class = max(0, sum(match_len >= m for m in MATCH_CLASSES) - 1)
    return DraftState(Kind.COPY if dense else Kind.PROSE, match_class=match_class)


class PositionCounts:
    """Decayed counts of tried and accepted drafts by position, for one draft state."""

    def __init__(self, n_positions: int) -> None:
        self.hits = [0.0] * n_positions
        self.tries = [0.0] * n_positions

    def chances(self, state: DraftState, goes_on: float) -> list[float]:
        """Per position: the chance it is accepted once the ones before it were, drafts being in `state`
        and a lookup's drafts in this answer going on at the rate `goes_on`.

        A position seldom tried leans on the position before it, not on a flat prior: in a copied
        run every position is as likely as the first, so drafts grow as far as acceptance holds.
        """
        prior = state.prior()
        floor = state.floor()
        out = []
        for h, t in zip(self.hits, self.tries, strict=True):
            prior = (h + prior * _PRIOR_WEIGHT) / (t + _PRIOR_WEIGHT)
            out.append(prior)
            if state.kind is Kind.COPY:
                prior = max(prior, goes_on) if goes_on >= COPY_GOES_ON else max(goes_on, floor)
        return out

    def age(self) -> None:
        self.hits = [h * DECAY for h in self.hits]
        self.tries = [t * DECAY for t in self.tries]

    def add(self, position: int, hit: bool) -> None:
        self.hits[position] += 1.0 if hit else 0.0
        self.tries[position] += 1.0


class CopyWindow:
    """Per token of the answer's last COPY_WINDOW: whether the lookup's draft (made or not) had it there."""

    def __init__(self) -> None:
        self._flags: deque[bool] = deque(maxlen=COPY_WINDOW)
        self._copied = 0  # how many flags are True (kept as the window slides, not summed per step)
        self.seen = 0  # tokens of this answer

    def clear(self) -> None:
        self._flags.clear()
        self._copied = 0
        self.seen = 0

    def add(self, foreseen: Iterable[bool]) -> None:
        for flag in foreseen:
            if len(self._flags) == COPY_WINDOW:
                self._copied -= self._flags[0]
            self._flags.append(flag)
            self._copied += flag
            self.seen += 1

    def dense(self) -> bool:
        return self._copied >= COPY_DENSE * len(self._flags)


class GoesOn:
    """This answer's lookup drafts: how often one went on once a position of it was kept."""

    def __init__(self) -> None:
        self.kept = 0.0
        self.tried = 0.0

    def observe(self, drafted: int, accepted: int) -> None:
        self.kept += max(0, min(accepted, drafted) - 1)
        self.tried += min(accepted, drafted - 1)

    def rate(self) -> float:
        return (self.kept + COPY_GOES_ON * _GOES_ON_WEIGHT) / (self.tried + _GOES_ON_WEIGHT)


class Stretches:
    """How many passes a drafting stretch lasts, by the kind of draft that began it: a running mean over
    answers (a copy's is not kept: a copy in one answer says little about the next), and this answer's
    lookup stretches so far."""

    def __init__(self) -> None:
        self.expected = dict.fromkeys(Kind, RUN_PRIOR)
        self._passes = dict.fromkeys((Kind.COPY, Kind.PROSE), 0.0)
        self._count = dict.fromkeys((Kind.COPY, Kind.PROSE), 0.0)

    def begin_answer(self) -> None:
        for kind in self._passes:
            self._passes[kind] = self._count[kind] = 0.0

    def ended(self, kind: Kind, passes: int) -> None:
        if kind is not Kind.COPY:
            self.expected[kind] += _RUN_EMA * (passes - self.expected[kind])
        if kind is not Kind.MODEL:
            self._passes[kind] += passes
            self._count[kind] += 1

    def this_answer(self, kind: Kind, prior: float) -> float:
        """Mean passes of this answer's stretches of a lookup kind, leaning on `prior` while they are few."""
        return (self._passes[kind] + prior * _RUN_PRIOR_WEIGHT) / (self._count[kind] + _RUN_PRIOR_WEIGHT)


class PassHistory:
    """The target passes so far: the last one's width (1: a plain step; 0: a prompt's prefill), how many
    of that width in a row, how many in a row on the same side (plain or drafting), and the kind of draft
    that began the drafting stretch."""

    def __init__(self) -> None:
        self.width = 1
        self.run = 0
        self.same_side = 0
        self.stretch_kind = Kind.MODEL

    def begin_answer(self) -> None:
        self.width, self.run, self.same_side = 0, 0, 0

    def record(self, width: int, kind: Kind, stretches: Stretches) -> None:
        """A pass of `width` tokens whose draft (if any) was of `kind`; a stretch that ends is told to
        `stretches`."""
        self.run = self.run + 1 if width == self.width else 1
        if self.width == 0 or (width > 1) == (self.width > 1):
            if self.width == 0 and width > 1:  # a stretch that starts right after the prefill
                self.stretch_kind = kind
            self.same_side += 1
        else:
            if self.width > 1:  # a drafting stretch ended
                stretches.ended(self.stretch_kind, self.same_side)
            else:
                self.stretch_kind = kind
            self.same_side = 1
        self.width = width


class ProbeSchedule:
    """While drafting does not pay, a short probe now and then keeps the acceptance estimate fresh;
    backing off keeps its price small."""

    def __init__(self) -> None:
        self.since = 0
        self.every = _FIRST_PROBE

    def reset(self) -> None:
        self.every = _FIRST_PROBE
        self.since = 0

    def due(self, probing: bool) -> bool:
        """One more plain step; whether a probe is due now (never when not `probing`)."""
        self.since += 1
        if not probing or self.since < self.every:
            return False
        self.since = 0
        self.every = min(self.every * 2, _LAST_PROBE)
        return True


def best_length(
    acceptance: list[float],
    seconds: Callable[[int], float],
    available: int | None = None,
    widths: list[int] | None = None,
) -> tuple[int, float]:
    """(k, speed-up over a plain step) for the draft length k with the most expected tokens per second.

    acceptance: per position, the chance it is accepted once the ones before it were; seconds(k): a step
    drafting k tokens (0: a plain step); available: a draft already made is this long (a longer k pads it
    with filler, which is never accepted); widths: the only draft lengths allowed (None: any).
    """
    plain = 1.0 / seconds(0)
    best_k, best_rate = 0, plain
    tokens, survive = 1.0, 1.0
    for k, a in enumerate(acceptance, start=1):
        survive *= a if available is None or k <= available else 0.0
        tokens += survive
        if widths is not None and k not in widths:
            continue
        rate = tokens / seconds(k)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate / plain

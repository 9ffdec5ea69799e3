"""Draft-length policy: expected tokens per second from measured acceptance and measured verify cost.

Verifying m tokens costs c(m), measured on the device at load and refined by every step (the curve
is not monotonic: on an H200 at a 7B shape, 16 tokens verified faster than 8). With a_j the running
probability that draft position j is accepted once j-1 were, a draft of length k yields
E(k) = 1 + sum_{i<=k} prod_{j<=i} a_j tokens in c(k+1) + k * drafter cost + host time. The policy picks
the k with the best rate and decodes plainly when no k beats a plain step, then probes again later.

On a GPU, c(m) also depends on the pass before: llama.cpp replays a captured CUDA graph only while
consecutive passes keep their shape, and a new shape runs uncaptured, then is captured. So each width
has a steady cost (the same width again) and a switch penalty (the extra cost of the passes after a
change of width); the policy charges a change of width its penalty, spread over the steps it is
expected to last, which makes it keep one width through a run of drafts and stay plain through prose.

A lookup costs nothing, so its draft is made before the choice and judged by what it is: how far back
its match reaches and whether the answer has been a copy so far. A lookup that finds nothing is a plain
step, not a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from app.engine.drafting.calibration import COST_EMA, VerifyCosts
from app.engine.drafting.estimates import (
    COLD,
    COPY_START,
    HOT,
    RUN_PRIOR,
    CopyWindow,
    DraftState,
    GoesOn,
    Kind,
    PassHistory,
    PositionCounts,
    ProbeSchedule,
    Stretches,
    best_length,
    lookup_state,
)

_MIN_GAIN = 1.03  # a draft must promise 3% over a plain step to be worth verifying
# A probe is an investment (a model drafter may first have to catch up on the whole prompt): only
# made where perfect drafts would win clearly.
_PROBE_MIN_GAIN = 1.25
# ...and only where what the drafter must first read (its whole prompt, say) costs less than a tenth
# of what perfect drafts could save over the tokens still to come: a probe bets on acceptance not yet
# seen (measured: a quarter let gemma-3-270m prefill an 800-token prompt on a 2-core CPU, 0.81x).
_PROBE_BUDGET = 0.1
# A draft accepted whole from this length on starts a run ("hot"): prose shares a word or two with
# its context by chance (measured: chat with n-gram lookups on an H200 lost 3-15% at 2).
_HOT_RUN = 3
# A drafter model is tried before it is judged: priors alone refused a 0.5B drafter for a 7B target on
# an H200 before it drafted once. Eight drafted steps of four tokens see 32 positions, enough to tell
# a drafter that keeps two tokens a step from one that keeps none, for a few hundred ms on a CPU.
TRIAL_STEPS = 8
_TRIAL_DRAFT = 4


class TrialState(Enum):
    NONE = "none"  # a lookup, or a policy that does not adapt: nothing to try
    RUNNING = "running"
    PAID = "paid"  # drafting paid at the end of the trial
    FAILED = "failed"  # it did not: the policy decodes plainly (and probes), the engine may look up instead


@dataclass
class Trial:
    """A drafter model's first drafted steps, made whatever the priors say, and what they showed."""

    steps: int  # drafted steps the trial takes (0: none)
    state: TrialState = TrialState.NONE
    drafted_steps: int = 0
    drafted: int = 0  # draft tokens verified
    accepted: int = 0
    draft_s: float = 0.0  # what the trial cost: drafting and verifying
    verify_s: float = 0.0
    verdict: str = ""  # the decision at its end, in words

    def __post_init__(self) -> None:
        if self.steps > 0:
            self.state = TrialState.RUNNING

    @property
    def running(self) -> bool:
        return self.state is TrialState.RUNNING

    def record(self, drafted: int, accepted: int, verify_s: float) -> None:
        self.drafted_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.verify_s += verify_s

    def conclude(self, k: int, gain: float, draft_cost_s: float) -> None:
        """The trial's end: drafting pays where the best draft length k promises `gain` of at least 3%."""
        paid = k > 0 and gain >= _MIN_GAIN
        self.state = TrialState.PAID if paid else TrialState.FAILED
        self.verdict = (
            f"trial of {self.drafted_steps} drafted steps kept {self.accepted} of {self.drafted} drafted "
            f"tokens ({self.accepted / max(self.drafted_steps, 1):.2f} a step) at "
            f"{draft_cost_s * 1e3:.2f} ms per drafted token: best draft length {k} promises "
            f"{gain:.2f}x a plain step, so {'drafting' if paid else 'plain decoding'}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.value,
            "steps": self.steps,
            "drafted_steps": self.drafted_steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "accepted_per_step": round(self.accepted / self.drafted_steps, 3) if self.drafted_steps else 0.0,
            "cost_s": {"draft": round(self.draft_s, 4), "verify": round(self.verify_s, 4)},
            "verdict": self.verdict,
        }


class DraftPolicy:
    """Chooses each step's draft length; one instance per loaded pair, learning across requests.

    Acceptance is tracked by draft state (estimates.DraftState), each learning apart: a drafter model's
    drafts are hot or cold, a lookup's are in the class of its match length (`set_match`).
    """

    def __init__(
        self,
        costs: VerifyCosts,
        max_draft: int,
        draft_cost_s: float,
        adaptive: bool = True,
        trial_steps: int = 0,
    ) -> None:
        """trial_steps: a drafter model's trial, in drafted steps (0: none; a lookup needs none, its
        drafts are scored for free while it decodes plainly)."""
        self.costs = costs
        self.max_draft = max_draft
        self.draft_cost_s = draft_cost_s
        self.adaptive = adaptive
        self.host_s = 0.0  # running host time of a step
        self._counts: dict[DraftState, PositionCounts] = {}
        self.hot = False  # a drafter model's drafts: in step with the target
        self._lookup: DraftState | None = None  # the state of the lookup draft at hand
        self._window = CopyWindow()
        self._goes_on = GoesOn()
        self._stretches = Stretches()
        self._passes = PassHistory()
        self._probes = ProbeSchedule()
        self._grace = False  # a hot run just missed: one more draft at the same width
        self._lookup_choice = False  # the last choice was a lookup's, at its one width
        self.last_reason = ""
        self.trial = Trial(trial_steps if adaptive else 0)

    def begin_request(self) -> None:
        """A new generation: its text owes nothing to the last one's run, and its prefill pass has
        changed the width (what was learned about acceptance and costs stays)."""
        self.hot = False
        self._grace = False
        self._passes.begin_answer()
        self._window.clear()
        self._goes_on = GoesOn()
        self._stretches.begin_answer()
        for state in [s for s in self._counts if s.lookup]:
            del self._counts[state]

    @property
    def state(self) -> DraftState:
        if self._lookup is not None:
            return self._lookup
        return HOT if self.hot else COLD

    @property
    def width(self) -> int:
        """Width of the last target pass (1: a plain step; 0: a prompt's prefill)."""
        return self._passes.width

    def _counts_of(self, state: DraftState) -> PositionCounts:
        counts = self._counts.get(state)
        if counts is None:
            counts = self._counts[state] = PositionCounts(self.max_draft)
        return counts

    def _expected_run(self) -> float:
        """Passes a drafting stretch begun now is expected to last.

        A lookup's stretch goes on while its drafts are taken: with a chance a of the first drafted
        token being right, 1 / (1 - a) passes. A drafter model's: the running mean of past stretches.
        """
        kind = self.state.kind
        if kind is Kind.MODEL:
            return self._stretches.expected[Kind.MODEL]
        # A lookup's stretches: no longer than this answer's have lasted so far (an answer that shares
        # only phrases with its context takes one draft and is back to plain steps). The prior: in a copy
        # a fixed hope (a copy in one answer says little about the next); in prose, how long prose
        # stretches have lasted over earlier answers.
        prior = RUN_PRIOR if kind is Kind.COPY else self._stretches.expected[Kind.PROSE]
        so_far = self._stretches.this_answer(kind, prior)
        if kind is Kind.PROSE:
            return so_far
        first = self.acceptance()[0]
        return min(1.0 / max(1.0 - first, 1e-3), float(self.max_draft), so_far)

    def dense(self) -> bool:
        """Whether the answer so far is mostly what the lookup foresaw (a copy, an edited copy)."""
        if self._window.seen < COPY_START:
            # Optimism pays only where a plain start is no cheaper than a wide one (after a prefill a
            # GPU captures its graph anew either way); on a CPU every drafted token costs its share.
            return self.costs.switch is not None
        return self._window.dense()

    def set_match(self, length: int) -> None:
        """The draft at hand is a lookup whose last `length` tokens matched its source."""
        self._lookup = lookup_state(length, self.dense())

    def observe_foreseen(self, foreseen: list[bool]) -> None:
        """Per token the last step added: whether the lookup's draft (made or not) had it there."""
        self._window.add(foreseen)

    def acceptance(self, state: DraftState | None = None) -> list[float]:
        """Per position: the chance it is accepted once the ones before it were (PositionCounts.chances)."""
        state = self.state if state is None else state
        return self._counts_of(state).chances(state, self.goes_on())

    def goes_on(self) -> float:
        """This answer's chance that a lookup's draft goes on once a position of it was kept."""
        return self._goes_on.rate()

    def _pass_seconds(self, width: int) -> float:
        """A target pass of `width` tokens now: steady cost, plus a share of the switch penalty.

        A drafting stretch is an excursion from plain decoding: entering it pays for the way in and
        the way back, spread over the steps it is expected to last; leaving it pays nothing more.
        """
        if width == self.width or width == 1:
            return self.costs.cost(width)
        penalty = self.costs.penalty(width)
        if self.width == 0:  # after a prefill every width is new: only the difference counts
            penalty -= self.costs.penalty(1)
        elif self.width == 1:
            penalty += self.costs.penalty(1)
        return self.costs.cost(width) + penalty / self._expected_run()

    def _seconds(self, k: int) -> float:
        return self._pass_seconds(k + 1) + k * self.draft_cost_s + self.host_s

    def _one_width(self, available: int | None) -> bool:
        """A lookup's drafts on a device that captures graphs by shape are verified at one width, the
        longest: the cost curve is flat near its top (on an H200 widths 15 and 17 cost within 3%) while
        every change of width costs about three plain steps, and a calibration's noise between near
        widths would otherwise pin the stretch to a shorter one. The choice is a plain step or a full pass.
        """
        return available is not None and self.costs.switch is not None

    def pad_pays(self, drafted: int, k: int) -> bool:
        """Whether a draft that came out shorter than the chosen k is better verified padded to k.

        On a GPU the padded pass keeps the width (and its captured graph) that the next steps reuse.
        """
        if drafted >= k or drafted == 0 or self.costs.switch is None:
            return False  # nothing drafted: a plain step, not a pass of filler
        if self._lookup_choice:
            return True  # the one width of a lookup's stretch
        padded, short = k + 1, drafted + 1
        if padded != self.width:  # entering a new width either way: the cheaper one
            return self._pass_seconds(padded) <= self._pass_seconds(short)
        # A one-pass detour from the current width: its first pass runs uncaptured, and coming back
        # pays the current width's whole penalty.
        detour = self.costs.cost(short) + self.costs.penalty(short) / 2 + self.costs.penalty(padded)
        return self.costs.cost(padded) <= detour

    def best(self, available: int | None = None) -> tuple[int, float]:
        """(k, speed-up over a plain step) for the best draft length, in one pass over k.

        available: a draft already made is this long; a longer k pads it with filler, which gains
        nothing but may keep the width of the passes before (and its captured graph).
        """
        widths = [self.max_draft] if self._one_width(available) else None
        return best_length(self.acceptance(), self._seconds, available, widths)

    def _probe_pays(self, catch_up_s: Callable[[], float], remaining: int) -> bool:
        gain = self.best_case_gain()
        if gain < _PROBE_MIN_GAIN:
            return False
        saving = remaining * self._seconds(0) * (1.0 - 1.0 / gain)
        return catch_up_s() <= _PROBE_BUDGET * saving

    def best_case_gain(self) -> float:
        """Speed-up over a plain step if every drafted token were accepted: below 1, nothing can pay."""
        plain = self._seconds(0)
        return max((k + 1) * plain / self._seconds(k) for k in range(1, self.max_draft + 1))

    def choose(
        self,
        catch_up_s: Callable[[], float] = lambda: 0.0,
        remaining: int = 256,
        probe: bool = True,
        available: int | None = None,
    ) -> int:
        """Draft length for the next step (0: decode plainly).

        catch_up_s: the drafter's cost of reading what it has not seen yet, asked only before a probe.
        remaining: tokens the request may still generate.
        probe: whether plain stretches need probe drafts to see acceptance again; not for a free
        drafter, whose drafts are scored against the plain tokens at no cost (a shadow draft).
        available: the length of a draft already made (a free drafter proposes before the choice); a
        longer k pads it with filler.
        """
        self._lookup_choice = self._one_width(available)
        if not self.adaptive:
            return self.max_draft
        if self.trial.running:
            self.last_reason = ""
            return min(_TRIAL_DRAFT, self.max_draft)
        if self._grace:
            # An edited copy misses at each change and goes on right after it (the lookup resyncs on
            # the target's own token): one more draft at the width in use, instead of paying the way
            # out and back in.
            self._grace = False
            if self.width > 1:
                return self.width - 1
        k, gain = self.best(available)
        if k > 0 and gain >= _MIN_GAIN:
            self._probes.reset()
            self.last_reason = ""
            return k
        self.last_reason = self._refusal(k, gain)
        if not self._probes.due(probe):
            return 0
        # A short probe keeps the acceptance estimate fresh; no probe is spent where even a perfect
        # draft would lose (a drafter too dear), nor where what the drafter must first read costs
        # more than perfect drafts could save.
        return max(1, min(4, self.max_draft)) if self._probe_pays(catch_up_s, remaining) else 0

    def _refusal(self, k: int, gain: float) -> str:
        reason = (
            f"drafting would not pay here: best draft length {k} promises {gain:.2f}x a plain step "
            f"(verify cost ratio c({k + 1})/c(1) = {self._pass_seconds(k + 1) / self._pass_seconds(1):.2f}, "
            f"drafter {self.draft_cost_s * 1e3:.2f} ms/token)"
        )
        if self.trial.state is TrialState.FAILED:
            reason += f"; {self.trial.verdict}"
        return reason

    def retry_trial(self) -> None:
        """Try the drafter again (a failed trial is revisited: acceptance differs from task to task)."""
        if self.adaptive and self.trial.steps > 0:
            self.trial = Trial(self.trial.steps)

    def observe_position(self, position: int, hit: bool, state: DraftState, last: bool = False) -> None:
        """One shadow observation of draft position `position` (0-based) given the ones before it matched.

        `state` is the state the shadow draft was made in; its outcome sets the state when it ends
        (a miss, or its last position).
        """
        counts = self._counts_of(state)
        if position == 0:
            counts.age()
        if position < self.max_draft:
            counts.add(position, hit)
        if (not hit or last) and not state.lookup:
            self.hot = hit and position >= _HOT_RUN - 1

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """One verified draft: positions up to the first rejection were tried, the first `accepted` hit."""
        if drafted == 0:
            return
        state = self.state
        counts = self._counts_of(state)
        counts.age()
        for i in range(min(drafted, accepted + 1, self.max_draft)):
            counts.add(i, i < accepted)
        if state.lookup:  # a lookup: the next draft's own match length says how it stands
            self._goes_on.observe(drafted, accepted)
            return
        self._grace = state.hot and accepted < drafted
        self.hot = accepted == drafted >= _HOT_RUN  # a word or two in common is no run

    def observe(
        self, drafted: int, accepted: int, verify_s: float, host_s: float, width: int | None = None
    ) -> None:
        """One step in a pass of `width` tokens: `drafted` is the draft length chosen (a drafter that came
        up short counts as a miss at the position where it stopped: that is what the step gained);
        `accepted` counts real draft tokens only, never filler."""
        width = drafted + 1 if width is None else width
        self.observe_acceptance(drafted, accepted)
        if self.trial.running and drafted > 0:
            self.trial.record(drafted, accepted, verify_s)
            if self.trial.drafted_steps >= self.trial.steps:
                self.trial.conclude(*self.best(), self.draft_cost_s)
        self._passes.record(width, self.state.kind, self._stretches)
        # The first passes after a change of width carry its switch penalty, not the steady cost.
        if self.costs.switch is None or self._passes.run >= 3:
            self.costs.observe(width, verify_s)
        self.host_s += COST_EMA * (host_s - self.host_s)

    def observe_draft_cost(self, n_tokens: int, seconds: float, per_token: bool = True) -> None:
        """A draft of n_tokens took `seconds`; per_token False: it also read context (a prompt) first, so it
        counts toward a trial's cost but says nothing of the drafter's cost per token."""
        if self.trial.running:
            self.trial.draft_s += seconds
        if n_tokens > 0 and per_token:
            self.draft_cost_s += COST_EMA * (seconds / n_tokens - self.draft_cost_s)

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

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.engine.backends.base import Backend

log = logging.getLogger("foresight.policy")

CALIBRATION_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 65)
_PRIOR_ACCEPT = 0.5  # enough to try drafting before anything is measured, little enough to stop soon
_PRIOR_WEIGHT = 1.0
# Acceptance memory: every observation ages every position, so a position that is no longer reached
# (the first token keeps missing) drifts back to the prior instead of keeping a stale, hopeful figure.
_DECAY = 0.95
_COST_EMA = 0.1
_OUTLIER = 3.0  # a verify that took 3x the estimate (a GC pause, a busy host) does not move it
_MIN_GAIN = 1.03  # a draft must promise 3% over a plain step to be worth verifying
_FIRST_PROBE = 16
# A probe is an investment (a model drafter may first have to catch up on the whole prompt): only
# made where perfect drafts would win clearly.
_PROBE_MIN_GAIN = 1.25
# ...and only where what the drafter must first read (its whole prompt, say) costs less than a tenth
# of what perfect drafts could save over the tokens still to come: a probe bets on acceptance not yet
# seen (measured: a quarter let gemma-3-270m prefill an 800-token prompt on a 2-core CPU, 0.81x).
_PROBE_BUDGET = 0.1
# A change of width pays its switch penalty once; the policy spreads it over the steps a drafting
# stretch is expected to last: a running mean of past stretches, or for a lookup in a copy what its
# acceptance implies (measured on an H200: a change costs the next two passes about three plain steps,
# so a short excursion into drafting and back rarely pays).
_RUN_PRIOR = 4.0
_RUN_EMA = 0.2
_RUN_PRIOR_WEIGHT = 0.5
# A draft accepted whole from this length on starts a run ("hot"): prose shares a word or two with
# its context by chance (measured: chat with n-gram lookups on an H200 lost 3-15% at 2).
_HOT_RUN = 3
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
_COPY_GOES_ON = 0.9
_GOES_ON_WEIGHT = 4.0


@dataclass
class VerifyCosts:
    """Seconds to decode m tokens in one target pass, for m = 1..max_m (interpolated between points)."""

    seconds: list[float]  # seconds[m - 1]: a pass of width m after passes of the same width (steady)
    switch: list[float] | None = None  # switch[m - 1]: extra seconds of the passes after a change to m

    @classmethod
    def from_points(
        cls, points: dict[int, float], max_m: int, switch: dict[int, float] | None = None
    ) -> VerifyCosts:
        return cls(_interpolate(points, max_m), _interpolate(switch, max_m) if switch else None)

    def cost(self, m: int) -> float:
        return self.seconds[min(m, len(self.seconds)) - 1]

    def penalty(self, m: int) -> float:
        """Extra seconds spent by the passes that follow a change of width to m (0 on a CPU)."""
        return self.switch[min(m, len(self.switch)) - 1] if self.switch else 0.0

    def observe(self, m: int, seconds: float) -> None:
        if 1 <= m <= len(self.seconds) and seconds < _OUTLIER * self.seconds[m - 1]:
            self.seconds[m - 1] += _COST_EMA * (seconds - self.seconds[m - 1])

    def relative(self) -> list[float]:
        return [round(s / self.seconds[0], 3) for s in self.seconds]


def _interpolate(points: dict[int, float], max_m: int) -> list[float]:
    xs = sorted(points)
    out = []
    for m in range(1, max_m + 1):
        if m in points:
            out.append(points[m])
            continue
        lo = max((x for x in xs if x < m), default=xs[0])
        hi = min((x for x in xs if x > m), default=xs[-1])
        if lo == hi:
            out.append(points[lo] * m / lo)
        else:
            w = (m - lo) / (hi - lo)
            out.append(points[lo] * (1 - w) + points[hi] * w)
    return out


def measure_verify_costs(
    target: Backend,
    max_m: int,
    cache_file: Path | None = None,
    cache_key: str = "",
    shape_sensitive: bool = False,
) -> VerifyCosts:
    """Time target passes of m tokens after a 64-token prefix, for a spread of m; cached per model.

    shape_sensitive (a GPU): also time the passes right after a change of width, from which each
    width's switch penalty is taken (width 1's from the passes back to plain steps).
    """
    sizes = [m for m in CALIBRATION_SIZES if m <= max_m] + ([max_m] if max_m not in CALIBRATION_SIZES else [])
    key = f"v3:{cache_key}:{'shape' if shape_sensitive else 'flat'}"
    if cache_file is not None and cache_file.exists():
        try:
            cached = json.loads(cache_file.read_text()).get(key)
            if cached:
                points = {int(k): float(v) for k, v in cached["steady"].items()}
                switch = {int(k): float(v) for k, v in cached.get("switch", {}).items()}
                if all(m in points for m in sizes):
                    return VerifyCosts.from_points(points, max_m, switch or None)
        except (ValueError, OSError, KeyError, TypeError, AttributeError):
            log.warning("ignoring unreadable verify-cost cache %s", cache_file)
    target.rollback(0)
    filler = target.tokenize(
        b"def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n", True, False
    )
    prefix = (filler * (64 // max(len(filler), 1) + 1))[:64]
    target.decode_argmax(prefix, len(prefix) - 1)

    def timed(m: int) -> float:
        t0 = time.perf_counter()
        target.decode_argmax((prefix * (m // len(prefix) + 1))[:m], 0)
        dt = time.perf_counter() - t0
        target.rollback(len(prefix))
        return dt

    points: dict[int, float] = {}
    switch: dict[int, float] = {}
    try:
        if not shape_sensitive:
            for m in sizes:
                points[m] = min(timed(m) for _ in range(2 if m > 16 else 3))
        else:
            # After a change of width the first pass runs uncaptured and the second captures a graph;
            # from the third on the graph is replayed: the steady cost. The first capture of a shape
            # ever costs more than the re-captures of generation (it builds the graph from scratch):
            # one round over every width first, so the measured round sees what generation will.
            for m in sizes:
                timed(m)
                timed(m)
            ones = [timed(1) for _ in range(4)]
            points[1] = min(ones[2:])
            back: list[float] = []
            for m in sizes[1:]:
                runs = [timed(m) for _ in range(4)]
                points[m] = min(runs[2:])
                switch[m] = max(0.0, runs[0] + runs[1] - 2 * points[m])
                ones = [timed(1) for _ in range(3)]
                back.append(max(0.0, ones[0] + ones[1] - 2 * points[1]))
            switch[1] = sorted(back)[len(back) // 2] if back else 0.0
    finally:
        target.rollback(0)
    if cache_file is not None:
        try:
            data = json.loads(cache_file.read_text()) if cache_file.exists() else {}
        except (ValueError, OSError):
            data = {}
        data[key] = {
            "steady": {str(k): v for k, v in points.items()},
            "switch": {str(k): v for k, v in switch.items()},
        }
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(cache_file)
    return VerifyCosts.from_points(points, max_m, switch or None)


class DraftPolicy:
    """Chooses each step's draft length; one instance per loaded pair, learning across requests.

    Acceptance is tracked by state, each learning apart. A drafter model's drafts are in one of two:
    after a draft of 3+ tokens that was accepted whole ("hot": the drafter is in step with the target)
    and otherwise ("cold"); drafts come in runs, so the state predicts the next draft far better than
    one average. A lookup's draft is in the class of its match length (`set_match`).
    """

    def __init__(
        self, costs: VerifyCosts, max_draft: int, draft_cost_s: float, adaptive: bool = True
    ) -> None:
        self.costs = costs
        self.max_draft = max_draft
        self.draft_cost_s = draft_cost_s
        self.adaptive = adaptive
        # decayed counts of accepted / tried drafts by position, per state (0 cold, 1 hot)
        n_states = 2 + 2 * len(MATCH_CLASSES)
        self.hits = [[0.0] * max_draft for _ in range(n_states)]
        self.tries = [[0.0] * max_draft for _ in range(n_states)]
        self.hot = 0
        self.match_class: int | None = None  # the state of the lookup draft at hand
        self._copied: deque[bool] = deque(maxlen=COPY_WINDOW)  # last tokens: foreseen by the lookup?
        self._n_copied = 0  # how many of those are True (kept as the window slides, not summed per step)
        self._seen = 0  # tokens of this answer
        self._goes_on = [0.0, 0.0]  # this answer's lookup drafts: positions after the first kept, tried
        # this answer's drafting stretches begun by a lookup, in a copy and in prose: passes, stretches
        self._lookup_runs = [[0.0, 0.0], [0.0, 0.0]]
        self.host_s = 0.0
        self.width = 1  # width of the last target pass (1: a plain step; 0: a prompt's prefill)
        self._run = 0  # passes of that width in a row
        self._regime_run = 0  # passes in a row on the same side (plain or drafting)
        # passes a drafting stretch lasts, by how it began: a drafter model's, a lookup's in a copy (not
        # kept: a copy is judged per answer), a lookup's in prose
        self.expected_runs = [_RUN_PRIOR] * 3
        self._run_kind = 0
        self._since_probe = 0
        self._probe_every = _FIRST_PROBE
        self._grace = False  # a hot run just missed: one more draft at the same width
        self._lookup_choice = False  # the last choice was a lookup's, at its one width
        self.last_reason = ""

    def begin_request(self) -> None:
        """A new generation: its text owes nothing to the last one's run, and its prefill pass has
        changed the width (what was learned about acceptance and costs stays)."""
        self.hot = 0
        self._grace = False
        self.width, self._run, self._regime_run = 0, 0, 0
        self._copied.clear()
        self._n_copied = 0
        self._seen = 0
        self._goes_on = [0.0, 0.0]
        self._lookup_runs = [[0.0, 0.0], [0.0, 0.0]]
        for state in range(2, len(self.hits)):
            self.hits[state] = [0.0] * self.max_draft
            self.tries[state] = [0.0] * self.max_draft

    @property
    def state(self) -> int:
        return self.hot if self.match_class is None else 2 + self.match_class

    def _expected_run(self) -> float:
        """Passes a drafting stretch begun now is expected to last.

        A lookup's stretch goes on while its drafts are taken: with a chance a of the first drafted
        token being right, 1 / (1 - a) passes. A drafter model's: the running mean of past stretches.
        """
        kind = self._kind()
        if kind == 0:
            return self.expected_runs[0]
        # A lookup's stretches: no longer than this answer's have lasted so far (an answer that shares
        # only phrases with its context takes one draft and is back to plain steps).
        passes, stretches = self._lookup_runs[kind - 1]
        # the prior: in a copy a fixed hope (a copy in one answer says little about the next); in prose,
        # how long prose stretches have lasted over earlier answers
        prior = _RUN_PRIOR if kind == 1 else self.expected_runs[2]
        so_far = (passes + prior * _RUN_PRIOR_WEIGHT) / (stretches + _RUN_PRIOR_WEIGHT)
        if kind == 2:
            return so_far
        first = self.acceptance()[0]
        return min(1.0 / max(1.0 - first, 1e-3), float(self.max_draft), so_far)

    def _kind(self) -> int:
        if self.match_class is None:
            return 0
        return 1 if self.match_class < len(MATCH_CLASSES) else 2

    def dense(self) -> bool:
        """Whether the answer so far is mostly what the lookup foresaw (a copy, an edited copy)."""
        if self._seen < COPY_START:
            # Optimism pays only where a plain start is no cheaper than a wide one (after a prefill a
            # GPU captures its graph anew either way); on a CPU every drafted token costs its share.
            return self.costs.switch is not None
        return self._n_copied >= COPY_DENSE * len(self._copied)

    def set_match(self, length: int) -> None:
        """The draft at hand is a lookup whose last `length` tokens matched its source."""
        match_class = max(0, sum(length >= m for m in MATCH_CLASSES) - 1)
        self.match_class = match_class + (0 if self.dense() else len(MATCH_CLASSES))

    def observe_foreseen(self, foreseen: list[bool]) -> None:
        """Per token the last step added: whether the lookup's draft (made or not) had it there."""
        for flag in foreseen:
            if len(self._copied) == COPY_WINDOW:
                self._n_copied -= self._copied[0]
            self._copied.append(flag)
            self._n_copied += flag
        self._seen += len(foreseen)

    def acceptance(self, state: int | None = None) -> list[float]:
        """Per position: the chance it is accepted once the ones before it were.

        A position seldom tried leans on the position before it, not on a flat prior: in a copied
        run every position is as likely as the first, so drafts grow as far as acceptance holds.
        """
        state = self.state if state is None else state
        if state < 2:
            prior = _PRIOR_ACCEPT
        elif state < 2 + len(MATCH_CLASSES):
            length = MATCH_CLASSES[state - 2]
            prior = length / (length + 1.0)
        else:
            length = MATCH_CLASSES[state - 2 - len(MATCH_CLASSES)]
            prior = length / (length + 2.0)
        out = []
        goes_on = self.goes_on()
        # where the answer's drafts have not gone on, a long match still may: m / (m + 2) for a match of m
        length = MATCH_CLASSES[(state - 2) % len(MATCH_CLASSES)] if state >= 2 else 0
        floor = length / (length + 2.0)
        for h, t in zip(self.hits[state], self.tries[state], strict=True):
            prior = (h + prior * _PRIOR_WEIGHT) / (t + _PRIOR_WEIGHT)
            out.append(prior)
            if 2 <= state < 2 + len(MATCH_CLASSES):
                prior = max(prior, goes_on) if goes_on >= _COPY_GOES_ON else max(goes_on, floor)
        return out

    def goes_on(self) -> float:
        """This answer's chance that a lookup's draft goes on once a position of it was kept."""
        kept, tried = self._goes_on
        return (kept + _COPY_GOES_ON * _GOES_ON_WEIGHT) / (tried + _GOES_ON_WEIGHT)

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
        plain = 1.0 / self._seconds(0)
        best_k, best_rate = 0, plain
        tokens, survive = 1.0, 1.0
        one_width = self._one_width(available)
        for k, a in enumerate(self.acceptance(), start=1):
            survive *= a if available is None or k <= available else 0.0
            tokens += survive
            if one_width and k < self.max_draft:
                continue
            rate = tokens / self._seconds(k)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k, best_rate / plain

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
        if self._grace:
            # An edited copy misses at each change and goes on right after it (the lookup resyncs on
            # the target's own token): one more draft at the width in use, instead of paying the way
            # out and back in.
            self._grace = False
            if self.width > 1:
                return self.width - 1
        k, gain = self.best(available)
        if k > 0 and gain >= _MIN_GAIN:
            self._probe_every = _FIRST_PROBE
            self._since_probe = 0
            self.last_reason = ""
            return k
        self.last_reason = (
            f"drafting would not pay here: best draft length {k} promises {gain:.2f}x a plain step "
            f"(verify cost ratio c({k + 1})/c(1) = {self._pass_seconds(k + 1) / self._pass_seconds(1):.2f}, "
            f"drafter {self.draft_cost_s * 1e3:.2f} ms/token)"
        )
        self._since_probe += 1
        if not probe or self._since_probe < self._probe_every:
            return 0
        # A short probe keeps the acceptance estimate fresh; backing off keeps its price small (and
        # that of asking the drafter what it would first have to read), and no probe is spent where
        # even a perfect draft would lose (a drafter too dear).
        self._since_probe = 0
        self._probe_every = min(self._probe_every * 2, 1024)
        return max(1, min(4, self.max_draft)) if self._probe_pays(catch_up_s, remaining) else 0

    def _age(self, state: int) -> None:
        self.hits[state] = [h * _DECAY for h in self.hits[state]]
        self.tries[state] = [t * _DECAY for t in self.tries[state]]

    def observe_position(self, position: int, hit: bool, state: int, last: bool = False) -> None:
        """One shadow observation of draft position `position` (0-based) given the ones before it matched.

        `state` is the state the shadow draft was made in; its outcome sets the state when it ends
        (a miss, or its last position).
        """
        if position == 0:
            self._age(state)
        if position < self.max_draft:
            self.hits[state][position] += 1.0 if hit else 0.0
            self.tries[state][position] += 1.0
        if (not hit or last) and state < 2:
            self.hot = int(hit and position >= _HOT_RUN - 1)

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        """One verified draft: positions up to the first rejection were tried, the first `accepted` hit."""
        if drafted == 0:
            return
        state = self.state
        self._age(state)
        for i in range(min(drafted, accepted + 1, self.max_draft)):
            self.hits[state][i] += 1.0 if i < accepted else 0.0
            self.tries[state][i] += 1.0
        if state >= 2:  # a lookup: the next draft's own match length says how it stands
            self._goes_on[0] += max(0, min(accepted, drafted) - 1)
            self._goes_on[1] += min(accepted, drafted - 1)
            return
        self._grace = state == 1 and accepted < drafted
        self.hot = int(accepted == drafted >= _HOT_RUN)  # a word or two in common is no run

    def observe(
        self, drafted: int, accepted: int, verify_s: float, host_s: float, width: int | None = None
    ) -> None:
        """One step in a pass of `width` tokens: `drafted` is the draft length chosen (a drafter that came
        up short counts as a miss at the position where it stopped: that is what the step gained);
        `accepted` counts real draft tokens only, never filler."""
        width = drafted + 1 if width is None else width
        self.observe_acceptance(drafted, accepted)
        self._run = self._run + 1 if width == self.width else 1
        if self.width == 0 or (width > 1) == (self.width > 1):
            if self.width == 0 and width > 1:  # a stretch that starts right after the prefill
                self._run_kind = self._kind()
            self._regime_run += 1
        else:
            if self.width > 1:  # a drafting stretch ended
                kind = self._run_kind
                if kind != 1:  # a copy's stretches are judged per answer only (`_expected_run`)
                    self.expected_runs[kind] += _RUN_EMA * (self._regime_run - self.expected_runs[kind])
                if kind > 0:
                    self._lookup_runs[kind - 1][0] += self._regime_run
                    self._lookup_runs[kind - 1][1] += 1
            else:
                self._run_kind = self._kind()
            self._regime_run = 1
        self.width = width
        # The first passes after a change of width carry its switch penalty, not the steady cost.
        if self.costs.switch is None or self._run >= 3:
            self.costs.observe(width, verify_s)
        self.host_s += _COST_EMA * (host_s - self.host_s)

    def observe_draft_cost(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0:
            self.draft_cost_s += _COST_EMA * (seconds / n_tokens - self.draft_cost_s)

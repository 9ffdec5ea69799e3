"""Draft sources: n-gram prompt lookup, a same-vocabulary drafter model, and any model across vocabularies."""

from __future__ import annotations

import bisect
import codecs
from dataclasses import dataclass, field
from typing import Protocol

# llama.cpp's own rule (common/speculative.cpp), shared with the header-only verdicts of app.catalog.pairing
from app.catalog.pairing import NON_TEXT_ARCHITECTURES, VOCAB_CHECK_START_ID, VOCAB_MAX_SIZE_DIFFERENCE
from app.engine.backends.base import Backend
from app.engine.errors import DrafterUnusable


class Drafter(Protocol):
    source: str  # ngram | model | cross-vocab
    cost_per_token_s: float  # measured cost of drafting one token (0 for lookups)
    prefill_cost_per_token_s: float  # measured cost of reading one context token in a batch
    # A lookup's last draft: how many tokens before it matched its source (None: not a lookup).
    match_len: int | None

    def catch_up_tokens(self, committed: list[int]) -> int:
        """Context tokens the drafter would have to read before its next draft."""
        ...

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        """A new generation starts from `prompt` (target tokens)."""
        ...

    def propose(self, committed: list[int], k: int) -> list[int]:
        """Up to k target-vocabulary tokens likely to follow `committed` (prompt + generated)."""
        ...

    def sync(self, committed: list[int]) -> None:
        """After a step: drop cached state beyond what `committed` confirms."""
        ...


# --- n-gram prompt lookup -----------------------------------------------------------------------------


class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the last n tokens and propose what followed.

    Which occurrence: an edited copy of a source goes through it in order. While the answer follows a
    source (the last lookup's continuation was taken, at least its first token), the lookup keeps a
    cursor where that source goes on, and an occurrence just after the cursor wins over a later one
    elsewhere: after an edit, a short key such as `):` and an indent repeats all over a file, and the
    latest repeat is seldom the place the copy was at. Otherwise the latest occurrence wins.

    An index from n-gram to its starts makes each lookup a bisection, not a scan of the history.
    """

    source = "ngram"
    cost_per_token_s = 0.0
    prefill_cost_per_token_s = 0.0

    MAX_MATCH = 64  # a match is measured back this far at most
    # How far past the cursor a key may end and still count as the copy going on, in tokens. Chosen
    # with scripts/policy-sim.py over bench/prompts.json: on the H200's costs edit-fix-offbyone went
    # from 4.45x to 5.23x and edit-rename from 4.94x to 5.23x; chat and code-writing unchanged.
    CURSOR_WINDOW = 12

    def __init__(self, n_min: int = 2, n_max: int = 6) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes {n_min}..{n_max}")
        self.n_min, self.n_max = n_min, n_max
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0  # tokens of the history already in the index
        self.match_len: int | None = 0
        self._last: tuple[int, int] | None = None  # history length at the last draft, its source start
        self._cursor: int | None = None  # where the followed source goes on (None: no source followed)

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        self._index.clear()
        self._indexed = 0
        self._last = self._cursor = None

    def _extend_index(self, history: list[int]) -> None:
        # Index every n-gram that ends before the last token, so a match always has a continuation.
        for end in range(max(self._indexed, 1), len(history)):
            for n in range(self.n_min, self.n_max + 1):
                start = end - n
                if start >= 0:
                    self._index.setdefault(tuple(history[start:end]), []).append(start)
        self._indexed = max(self._indexed, len(history))

    def _advance(self, committed: list[int]) -> None:
        """Move the cursor over what the target kept of the last draft's source."""
        if self._last is None:
            return
        at, follow = self._last
        kept = 0
        while (
            at + kept < len(committed)
            and follow + kept < at
            and committed[at + kept] == committed[follow + kept]
        ):
            kept += 1
        self._cursor = follow + kept if kept else None
        self._last = None

    def propose(self, committed: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        if len(committed) < self._indexed:  # history shrank: a new generation without begin()
            self.begin(committed, None)
        self._extend_index(committed)
        self._advance(committed)
        # A continuation that reaches the end of the history is looked up again from its own tail,
        # so a repeating pattern drafts as far as k.
        out: list[int] = []
        self.match_len = 0
        while len(out) < k:
            more = self._lookup(committed, out, k - len(out))
            if not more:
                break
            out += more
        return out

    def _lookup(self, committed: list[int], drafted: list[int], k: int) -> list[int]:
        tail = (committed[-self.n_max :] + drafted)[-self.n_max :] if drafted else committed[-self.n_max :]
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            if not drafted and len(committed) <= n:
                continue
            starts = self._index.get(tuple(tail[-n:]))
            if not starts:
                continue
            start = None
            if self._cursor is not None and not drafted:
                i = bisect.bisect_left(starts, self._cursor - n)
                if i < len(starts) and starts[i] + n - self._cursor <= self.CURSOR_WINDOW:
                    start = starts[i]
            if start is None:
                start = starts[-1]
            follow = start + n
            if not drafted:
                self.match_len = self._match_back(committed, follow)
                self._last = (len(committed), follow)
            return committed[follow : follow + k]
        return []

    def _match_back(self, committed: list[int], follow: int) -> int:
        """How many tokens before `follow` equal the last tokens of `committed`."""
        n, end = 0, len(committed)
        while n < min(self.MAX_MATCH, follow) and committed[follow - 1 - n] == committed[end - 1 - n]:
            n += 1
        return n

    def sync(self, committed: list[int]) -> None:
        pass

    def catch_up_tokens(self, committed: list[int]) -> int:
        return 0


# --- vocabulary compatibility -------------------------------------------------------------------------


@dataclass
class VocabVerdict:
    compatible: bool
    target_size: int
    drafter_size: int
    reasons: list[str] = field(default_factory=list)
    first_mismatch_id: int | None = None

    def summary(self) -> str:
        if self.compatible:
            return f"same vocabulary ({self.target_size} tokens): drafting on the token path"
        return "different vocabularies, drafting through text: " + "; ".join(self.reasons)


def check_vocab(target: Backend, drafter: Backend) -> VocabVerdict:
    """llama.cpp's compatibility rule for sharing draft tokens, with the reason when it fails."""
    tv, dv = target.vocab, drafter.vocab
    verdict = VocabVerdict(True, tv.n_tokens, dv.n_tokens)
    if tv.vocab_type != dv.vocab_type:
        verdict.reasons.append(f"tokenizer types differ (target {tv.vocab_type}, drafter {dv.vocab_type})")
    if tv.add_bos != dv.add_bos or tv.add_eos != dv.add_eos:
        verdict.reasons.append("BOS/EOS insertion differs")
    if tv.bos != dv.bos or tv.eos != dv.eos:
        verdict.reasons.append(f"BOS/EOS ids differ (target {tv.bos}/{tv.eos}, drafter {dv.bos}/{dv.eos})")
    diff = abs(tv.n_tokens - dv.n_tokens)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        verdict.reasons.append(
            f"vocabulary sizes differ by {diff} (target {tv.n_tokens}, drafter {dv.n_tokens}; at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE} allowed)"
        )
    for i in range(VOCAB_CHECK_START_ID, min(tv.n_tokens, dv.n_tokens)):
        if target.token_text(i) != drafter.token_text(i):
            verdict.first_mismatch_id = i
            verdict.reasons.append(
                f"token {i} differs: target {target.token_text(i)!r}, drafter {drafter.token_text(i)!r}"
            )
            break
    verdict.compatible = not verdict.reasons
    return verdict


def check_drafter_usable(drafter: Backend) -> None:
    arch = drafter.facts.architecture
    if arch in NON_TEXT_ARCHITECTURES:
        raise DrafterUnusable(
            f"{drafter.facts.name} is a {arch!r} model, not a text generator: it cannot draft"
        )
    if drafter.n_vocab <= 0:
        raise DrafterUnusable(f"{drafter.facts.name} has no vocabulary: it cannot draft")


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class _GreedyModel:
    """A drafter model's KV cache kept in step with a token context, drafting greedily."""

    def __init__(self, model: Backend) -> None:
        self.model = model

    def continue_from(self, context: list[int], k: int) -> list[int]:
        m = self.model
        keep = min(common_prefix(m.kv_tokens, context), len(context) - 1)
        m.rollback(keep)
        if len(context) + k > m.n_ctx:
            return []
        out = m.decode_argmax(context[keep:], len(context) - keep - 1)
        while len(out) < k:
            out += m.decode_argmax([out[-1]], 0)
        return out

    def sync(self, context: list[int]) -> None:
        self.model.rollback(common_prefix(self.model.kv_tokens, context))

    def catch_up_tokens(self, context: list[int]) -> int:
        return len(context) - common_prefix(self.model.kv_tokens, context)


class ModelDrafter:
    """A smaller model with the target's vocabulary drafts greedily on the token path."""

    match_len: int | None = None

    source = "model"

    def __init__(self, model: Backend, cost_per_token_s: float, prefill_cost_per_token_s: float) -> None:
        self.model = model
        self.cost_per_token_s = cost_per_token_s
        self.prefill_cost_per_token_s = prefill_cost_per_token_s
        self._greedy = _GreedyModel(model)

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        pass  # the KV cache is reused by common prefix

    def propose(self, committed: list[int], k: int) -> list[int]:
        return self._greedy.continue_from(committed, k) if k > 0 else []

    def sync(self, committed: list[int]) -> None:
        self._greedy.sync(committed)

    def catch_up_tokens(self, committed: list[int]) -> int:
        return self._greedy.catch_up_tokens(committed)


class CrossVocabDrafter:
    """Any text model drafts through text: its tokens are detokenized and re-tokenized for the target.

    The drafter reads its own rendering of the prompt (`draft_prompt`), followed by the text the target
    has generated; the target verifies every proposed token, so the output stays exact.
    """

    match_len: int | None = None

    source = "cross-vocab"

    def __init__(
        self,
        model: Backend,
        target: Backend,
        verdict: VocabVerdict,
        cost_per_token_s: float,
        prefill_cost_per_token_s: float,
    ) -> None:
        self.model = model
        self.target = target
        self.verdict = verdict
        self.cost_per_token_s = cost_per_token_s
        self.prefill_cost_per_token_s = prefill_cost_per_token_s
        self._greedy = _GreedyModel(model)
        self._prompt_tokens: list[int] = []
        self._generated = bytearray()
        self._prompt_len = 0
        self._seen = 0  # committed target tokens already turned into text
        self._context: list[int] = []

    def begin(self, prompt: list[int], draft_prompt: bytes | None) -> None:
        if draft_prompt is None:
            draft_prompt = self.target_text(prompt)
        self._prompt_tokens = self.model.tokenize(draft_prompt, True, True)
        self._generated.clear()
        self._prompt_len = self._seen = len(prompt)
        self._context = []

    def target_text(self, tokens: list[int]) -> bytes:
        return b"".join(self.target.token_bytes(t) for t in tokens)

    def _drafter_context(self, committed: list[int]) -> list[int]:
        """The drafter's tokens for its prompt plus the text of what the target generated so far."""
        if len(committed) < self._seen:
            # The answer ended inside the last step (at an end-of-generation token or a stop string):
            # the drafter saw the whole step, and only the committed tokens stay.
            self._generated = bytearray(self.target_text(committed[self._prompt_len :]))
            self._seen = len(committed)
            self._context = []
        if len(committed) == self._seen and self._context:
            return self._context
        self._generated += self.target_text(committed[self._seen :])
        self._seen = len(committed)
        text = bytes(self._generated)
        cut = _complete_utf8_prefix(text)
        self._context = self._prompt_tokens + (self.model.tokenize(text[:cut], False, False) if cut else [])
        return self._context

    def propose(self, committed: list[int], k: int) -> list[int]:
        if k <= 0:
            return []
        drafted = self._greedy.continue_from(self._drafter_context(committed), k)
        text = b"".join(self.model.token_bytes(t) for t in drafted)
        if not text:
            return []
        return self.target.tokenize(text, False, False)[:k]

    def sync(self, committed: list[int]) -> None:
        self._greedy.sync(self._drafter_context(committed))

    def catch_up_tokens(self, committed: list[int]) -> int:
        return self._greedy.catch_up_tokens(self._drafter_context(committed))


def _complete_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of data that ends on a UTF-8 character boundary."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data, final=False)
    pending, _ = decoder.getstate()
    return len(data) - len(pending)

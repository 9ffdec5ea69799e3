"""Pairing verdicts from GGUF headers: can this drafter share draft tokens with this target?

The rules are llama.cpp's (common_speculative_are_compatible) plus the chat template's special tokens,
each reported as passed or failed with its detail. A pair that fails is still usable through text
(cross-vocabulary drafting); only a drafter that is not a text model at all is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from app.catalog.gguf import GGUFHeader

VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_ID = 5
TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 3, 4
NON_TEXT_ARCHITECTURES = {
    "clip",
    "mmproj",
    "bert",
    "nomic-bert",
    "jina-bert-v2",
    "t5encoder",
    "wavtokenizer-dec",
}


@dataclass(frozen=True)
class Rule:
    name: str
    passed: bool
    detail: str


@dataclass
class Verdict:
    target: str
    drafter: str
    rules: list[Rule] = field(default_factory=list)
    first_mismatch_id: int | None = None
    usable: bool = True  # False: the drafter cannot draft at all (not a text model)

    @property
    def compatible(self) -> bool:
        """True when the drafter can draft on the token path (every rule passed)."""
        return self.usable and all(r.passed for r in self.rules)

    @property
    def mode(self) -> str:
        if not self.usable:
            return "refused"
        return "token" if self.compatible else "cross-vocab"

    def summary(self) -> str:
        if not self.usable:
            return f"{self.drafter} cannot draft: " + "; ".join(r.detail for r in self.rules if not r.passed)
        if self.compatible:
            return "compatible: drafting on the token path (same vocabulary)"
        failed = "; ".join(r.detail for r in self.rules if not r.passed)
        return (
            f"incompatible for token-level drafting ({failed}); offered instead: cross-vocabulary "
            "drafting through text, which works with any text drafter but pays only when the drafter "
            "step is far cheaper than the target step"
        )

    def as_dict(self) -> dict:
        return {
            "target": self.target,
            "drafter": self.drafter,
            "compatible": self.compatible,
            "mode": self.mode,
            "first_mismatch_id": self.first_mismatch_id,
            "rules": [{"rule": r.name, "passed": r.passed, "detail": r.detail} for r in self.rules],
            "summary": self.summary(),
        }


@dataclass(frozen=True)
class _Vocab:
    model: str
    tokens: list[str]
    types: list[int]
    bos: int | None
    eos: int | None
    add_bos: bool
    add_eos: bool
    template: str | None


def _vocab(h: GGUFHeader) -> _Vocab:
    m = h.metadata
    tokens = m.get("tokenizer.ggml.tokens") or []
    return _Vocab(
        model=str(m.get("tokenizer.ggml.model", "")),
        tokens=list(tokens),
        types=list(m.get("tokenizer.ggml.token_type") or []),
        bos=m.get("tokenizer.ggml.bos_token_id"),
        eos=m.get("tokenizer.ggml.eos_token_id"),
        # llama.cpp's defaults when the key is absent: SPM adds BOS, BPE (gpt2) does not
        add_bos=bool(m.get("tokenizer.ggml.add_bos_token", m.get("tokenizer.ggml.model") == "llama")),
        add_eos=bool(m.get("tokenizer.ggml.add_eos_token", False)),
        template=h.chat_template,
    )


def _template_specials(v: _Vocab) -> dict[str, int]:
    """Control/user-defined tokens of the vocabulary that the chat template writes out, text -> id."""
    if not v.template:
        return {}
    found = {}
    for i, text in enumerate(v.tokens):
        kind = v.types[i] if i < len(v.types) else 1
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED) and len(text) > 1 and text in v.template:
            found[text] = i
    return found


def _first_mismatch(a: list[str], b: list[str]) -> int | None:
    n = min(len(a), len(b))
    if a[VOCAB_CHECK_START_ID:n] == b[VOCAB_CHECK_START_ID:n]:
        return None
    return next(i for i in range(VOCAB_CHECK_START_ID, n) if a[i] != b[i])


def check_pair(
    target: GGUFHeader, drafter: GGUFHeader, target_name: str = "", drafter_name: str = ""
) -> Verdict:
    """Every pairing rule for a target and a drafter, from their headers alone."""
    verdict = Verdict(target_name or target.name or "target", drafter_name or drafter.name or "drafter")
    arch = drafter.architecture
    if arch in NON_TEXT_ARCHITECTURES or not drafter.get("tokenizer.ggml.tokens"):
        why = f"a {arch!r} model is not a text generator" if arch else "it has no vocabulary"
        verdict.usable = False
        verdict.rules.append(Rule("text model", False, why))
        return verdict
    t, d = _vocab(target), _vocab(drafter)
    rules = verdict.rules

    same_type = t.model == d.model
    rules.append(Rule("vocab type", same_type, f"tokenizers: target {t.model!r}, drafter {d.model!r}"))

    problems = []
    if t.add_bos != d.add_bos:
        problems.append(f"BOS insertion differs (target {t.add_bos}, drafter {d.add_bos})")
    elif t.add_bos and t.bos != d.bos:
        problems.append(f"BOS ids differ (target {t.bos}, drafter {d.bos})")
    if t.add_eos != d.add_eos:
        problems.append(f"EOS insertion differs (target {t.add_eos}, drafter {d.add_eos})")
    elif t.add_eos and t.eos != d.eos:
        problems.append(f"EOS ids differ (target {t.eos}, drafter {d.eos})")
    detail = "; ".join(problems) or f"same BOS/EOS handling (BOS {t.bos}, add {t.add_bos}; EOS {t.eos})"
    rules.append(Rule("BOS/EOS", not problems, detail))

    diff = abs(len(t.tokens) - len(d.tokens))
    rules.append(
        Rule(
            "vocab size",
            diff <= VOCAB_MAX_SIZE_DIFFERENCE,
            f"target {len(t.tokens):,} tokens, drafter {len(d.tokens):,} (difference {diff}, at most "
            f"{VOCAB_MAX_SIZE_DIFFERENCE})",
        )
    )

    mismatch = _first_mismatch(t.tokens, d.tokens)
    verdict.first_mismatch_id = mismatch
    if mismatch is None:
        text_detail = (
            f"token text identical from id {VOCAB_CHECK_START_ID} to {min(len(t.tokens), len(d.tokens)) - 1}"
        )
    else:
        text_detail = (
            f"token {mismatch} differs: target {t.tokens[mismatch]!r}, drafter {d.tokens[mismatch]!r}"
        )
    rules.append(Rule("token text", mismatch is None, text_detail))

    specials = _template_specials(t)
    wrong = [
        f"{text} (target id {i})" for text, i in specials.items() if i >= len(d.tokens) or d.tokens[i] != text
    ]
    if not t.template:
        special_detail = "the target has no chat template"
    elif wrong:
        special_detail = "chat template tokens missing or at other ids in the drafter: " + ", ".join(
            wrong[:5]
        )
    else:
        special_detail = f"the chat template's {len(specials)} special tokens have the same ids"
    rules.append(Rule("chat template tokens", not wrong, special_detail))
    return verdict


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([bm])\b", re.IGNORECASE)


def params_hint(name: str) -> float | None:
    """Parameters in billions read from a model name such as 'Qwen2.5-Coder-7B' or 'gemma-3-270m'."""
    m = _SIZE.search(name.replace("_", "-").replace("-", " "))
    if not m:
        return None
    value = float(m.group(1))
    return value if m.group(2).lower() == "b" else value / 1000

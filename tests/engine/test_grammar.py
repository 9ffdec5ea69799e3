"""Grammars on real vocabularies: JSON schemas and forced tool calls, and exact constrained speculation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cli.bench import NEAR_TIE
from app.engine import grammar
from app.engine.backends.tokenizer import Tokenizer as LlamaVocab
from app.engine.engine import Engine
from app.engine.generation import GenerationRequest
from app.engine.grammar import Grammar, GrammarError, GrammarState
from app.engine.sampling import Sampler, SamplingParams
from tests.support.helpers import settings

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
COLOURS = {
    "type": "object",
    "properties": {
        "colours": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}}
    },
    "required": ["colours"],
}
ORDER = {  # nested: an array of objects, an enum, required fields, a number
    "type": "object",
    "properties": {
        "customer": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "size": {"type": "string", "enum": ["S", "M", "L"]},
                    "quantity": {"type": "integer"},
                },
                "required": ["sku", "size", "quantity"],
            },
        },
        "express": {"type": "boolean"},
    },
    "required": ["customer", "items", "express"],
}


@pytest.fixture(scope="module")
def qwen_vocab(qwen_path: Path) -> Iterator[LlamaVocab]:
    vocab = LlamaVocab(qwen_path)
    yield vocab
    vocab.close()


def _tokens(vocab: LlamaVocab, text: str) -> list[int]:
    return vocab.tokenize(text.encode(), False, False)


def _walk(state: GrammarState, tokens: list[int]) -> list[bool]:
    """Whether each token was allowed where it came; allowed ones are taken."""
    allowed = []
    for token in tokens:
        ok = state.allows(token)
        allowed.append(ok)
        if not ok:
            break
        state.accept(token)
    return allowed


def test_a_schema_grammar_takes_valid_json_and_refuses_the_rest(qwen_vocab: LlamaVocab) -> None:
    g = grammar.json_schema(PERSON, "response_format").bound(grammar.vocab_pointer(qwen_vocab))
    valid = GrammarState(g, qwen_vocab.n_vocab)
    assert all(_walk(valid, _tokens(qwen_vocab, '{"name": "Ann", "age": 31}')))
    eos = qwen_vocab.vocab.eos
    assert valid.allows(eos)  # complete: the reply may end
    for wrong in ('{"name": 3', '{"age": 31}', '{"name": "Ann", "age": 31.5', "```json"):
        state = GrammarState(g, qwen_vocab.n_vocab)
        assert not all(_walk(state, _tokens(qwen_vocab, wrong))), wrong
    early = GrammarState(g, qwen_vocab.n_vocab)
    _walk(early, _tokens(qwen_vocab, '{"name": "Ann"'))
    assert not early.allows(eos)  # not complete: no end of generation
    # a raw newline inside a string is not JSON (the converter's own string rule would take it)
    inside = GrammarState(g, qwen_vocab.n_vocab)
    _walk(inside, _tokens(qwen_vocab, '{"name": "A'))
    assert not inside.allows(_tokens(qwen_vocab, "\n")[0])


def test_the_allowed_mask_agrees_with_single_token_checks(qwen_vocab: LlamaVocab) -> None:
    g = grammar.json_object("response_format").bound(grammar.vocab_pointer(qwen_vocab))
    state = GrammarState(g, qwen_vocab.n_vocab)
    _walk(state, _tokens(qwen_vocab, '{"a'))
    mask = state.allowed()
    assert mask.shape == (qwen_vocab.n_vocab,)
    assert 100 < mask.sum() < qwen_vocab.n_vocab  # inside a string: most text, no control tokens
    rng = np.random.default_rng(0)
    sample = rng.choice(qwen_vocab.n_vocab, 64, replace=False)
    np.testing.assert_array_equal(state.allowed(sample), mask[sample])
    assert [state.allows(int(t)) for t in sample] == mask[sample].tolist()


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": "abc"},  # patterns need ^...$
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"$ref": "https://example.com/schema.json"},  # nothing is fetched
        {"type": "wizard"},
    ],
    ids=["pattern", "missing-ref", "remote-ref", "unknown-type"],
)
def test_a_schema_the_converter_cannot_follow_is_refused_by_name(schema: dict[str, Any]) -> None:
    with pytest.raises(GrammarError, match="cannot be turned into a grammar") as caught:
        grammar.json_schema(schema, "response_format.json_schema.schema")
    assert caught.value.param == "response_format.json_schema.schema"


def test_a_grammar_llama_cpp_cannot_parse_is_refused_by_name(qwen_vocab: LlamaVocab) -> None:
    with pytest.raises(GrammarError, match="cannot parse") as caught:
        Grammar("root ::= (", "text.format").bound(grammar.vocab_pointer(qwen_vocab))
    assert caught.value.param == "text.format"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},  # no parameters: any object
]


def test_a_required_call_grammar_takes_only_offered_names(qwen_vocab: LlamaVocab) -> None:
    g = grammar.tool_call(TOOLS, None).bound(grammar.vocab_pointer(qwen_vocab))

    def walks(text: str) -> bool:
        return all(_walk(GrammarState(g, qwen_vocab.n_vocab), _tokens(qwen_vocab, text)))

    # what follows forced_prefill("required"): the name's rest, the arguments, the block's end
    assert walks('get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    assert walks('get_time", "arguments": {"zone": "CET"}}\n</tool_call>')
    assert not walks('greet", "arguments": {}}')  # never offered
    assert not walks('get_weather", "arguments": {"town": "Paris"}}')  # not its schema
    named = grammar.tool_call(TOOLS, "get_weather").bound(grammar.vocab_pointer(qwen_vocab))
    assert all(
        _walk(
            GrammarState(named, qwen_vocab.n_vocab), _tokens(qwen_vocab, ' {"city": "Oslo"}}\n</tool_call>')
        )
    )


def test_a_constrained_sampled_top_k_draws_from_the_allowed_top_k(qwen_vocab: LlamaVocab) -> None:
    """The fast path (the best tokens first) gives the distribution of the whole masked row."""
    g = grammar.json_schema(COLOURS, "response_format").bound(grammar.vocab_pointer(qwen_vocab))
    rng = np.random.default_rng(7)
    prefix = _tokens(qwen_vocab, '{"colours": ["')
    for top_k in (1, 5, 40):
        params = SamplingParams(temperature=0.8, top_k=top_k, top_p=0.95, grammar=g)
        row = rng.standard_normal(qwen_vocab.n_vocab).astype(np.float32) * 4
        sampler = Sampler(params, qwen_vocab.n_vocab)
        for token in prefix:
            sampler.grammar.accept(token)
        ids, probs = sampler.distribution(row, [])
        mask = sampler.grammar.allowed()
        masked = np.where(mask, row, -np.inf)
        want = np.argsort(-masked, kind="stable")[: min(top_k, int(mask.sum()))]
        assert set(ids) <= set(want)
        assert mask[ids].all()
        assert probs.sum() == pytest.approx(1.0)


# --- exact speculation under a grammar ----------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen_ngram(qwen_path: Path) -> Iterator[Engine]:
    with Engine(qwen_path, None, settings("ngram", max_draft=8)) as engine:
        yield engine


def _run(engine: Engine, prompt: list[int], g: Grammar, speculative: bool) -> tuple[list[int], str, Any]:
    engine.target.rollback(0)
    params = SamplingParams(grammar=g)
    tokens, text, stats = [], "", None
    request = GenerationRequest(prompt=prompt, params=params, max_tokens=120, speculative=speculative)
    for chunk in engine.generate(request):
        tokens += chunk.tokens
        text += chunk.text
        stats = chunk.stats or stats
    return tokens, text, stats


def _allowed_margin(engine: Engine, g: Grammar, prompt: list[int], prefix: list[int]) -> float:
    """The plain run's top-2 logit margin among the tokens the grammar allows after `prefix`."""
    state = GrammarState(g, engine.target.n_vocab)
    for token in prefix:
        state.accept(token)
    engine.target.rollback(0)
    context = prompt + prefix
    row = np.array(engine.target.decode(context, len(context) - 1)[0], copy=True)
    engine.target.rollback(0)
    top = np.sort(row[state.allowed()])[-2:]
    return float(top[1] - top[0])


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        return False
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(k in value for k in schema.get("required", []))
            and all(_valid(v, props[k]) for k, v in value.items() if k in props)
            and (schema.get("additionalProperties", True) or set(value) <= set(props))
        )
    if kind == "array":
        return isinstance(value, list) and all(_valid(v, schema["items"]) for v in value)
    checks = {"string": str, "integer": int, "boolean": bool}
    return isinstance(value, checks[kind]) and (kind == "boolean" or not isinstance(value, bool))


CASES = [
    (PERSON, "Write the JSON record of Ann Lee, aged 31. The record: name Ann Lee, age 31."),
    (COLOURS, "List the colours of the French flag that appear in: red, green, blue, blue, red. As JSON."),
    (
        ORDER,
        "Order for customer Bo Berg, express: two shirts sku SH-1 size M, two shirts sku SH-1 size L, "
        "one hat sku HT-9 size S. Write it as JSON with items sku, size, quantity.",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("schema", "question"), CASES, ids=["flat", "enum-array", "nested"])
def test_constrained_speculation_equals_constrained_plain_decoding(
    qwen_ngram: Engine, schema: dict[str, Any], question: str
) -> None:
    g = grammar.json_schema(schema, "response_format").bound(grammar.vocab_pointer(qwen_ngram.target))
    prompt = qwen_ngram.render_chat([{"role": "user", "content": question}]).tokens
    plain, plain_text, _ = _run(qwen_ngram, prompt, g, speculative=False)
    spec, spec_text, stats = _run(qwen_ngram, prompt, g, speculative=True)
    assert stats.drafted > 0, "n-gram drafting never drafted: the test would show nothing"
    diff = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b), None)
    if diff is None:
        assert spec == plain
        assert spec_text == plain_text
    else:
        margin = _allowed_margin(qwen_ngram, g, prompt, plain[:diff])
        assert margin < NEAR_TIE, f"constrained outputs part at token {diff}, margin {margin:.3f}"
    for text in (plain_text, spec_text) if diff is None else (plain_text,):
        assert _valid(json.loads(text), schema), text
    print(f"\n{schema.get('required')}: drafted {stats.drafted}, accepted {stats.accepted}: {spec_text}")


def test_a_sampler_with_a_grammar_never_takes_the_device_argmax() -> None:
    params = SamplingParams(grammar=Grammar('root ::= "x"', "p"))
    assert not params.plain_greedy
    assert replace(params, grammar=None).plain_greedy

"""Output grammars: JSON schemas and tool calls as GBNF, and llama.cpp's grammar sampler holding the state."""

from __future__ import annotations

import ctypes
import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_grammar

from app.engine.backends.base import Backend
from app.engine.errors import InvalidRequest
from app.engine.tools import CLOSE

log = logging.getLogger("foresight.grammar")

# The Python port's string characters admit raw control characters, which JSON forbids (json.loads
# refuses them); llama.cpp's own converter excludes them, as here.
_PORT_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
# What json_schema_to_gbnf raises on schemas it cannot convert (it asserts on most of them).
_CONVERTER_ERRORS = (AssertionError, ValueError, KeyError, TypeError, IndexError, RecursionError)
_PROBE = 256  # tokens checked at once against the grammar in the probe buffer


class GrammarError(InvalidRequest):
    """A schema or grammar that cannot constrain the reply; `param` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar the reply must follow, the request field it came from, and the vocabulary it runs on."""

    gbnf: str
    param: str
    root: str = "root"
    vocab: Any = field(default=None, compare=False, repr=False)  # llama_vocab pointer, bound by the engine

    def bound(self, vocab: Any) -> Grammar:
        """This grammar on a model's vocabulary; GrammarError naming `param` if llama.cpp cannot parse it."""
        grammar = replace(self, vocab=vocab)
        sampler = grammar._new_sampler()
        llama_cpp.llama_sampler_free(sampler)
        return grammar

    def _new_sampler(self) -> Any:
        if self.vocab is None:
            raise ValueError("the grammar is not bound to a vocabulary")
        sampler = llama_cpp.llama_sampler_init_grammar(self.vocab, self.gbnf.encode(), self.root.encode())
        if not sampler:  # llama.cpp logs the parse error; the request is told which field it came from
            raise GrammarError("llama.cpp cannot parse the grammar made from it", self.param)
        return sampler


def vocab_pointer(backend: Backend) -> Any:
    """The llama_vocab pointer of a backend's tokenizer (llama.cpp's model, or the native backend's copy)."""
    vocab = backend.llama_vocab
    if vocab is None:
        raise InvalidRequest("this backend has no llama.cpp vocabulary: grammars are not available")
    return vocab


def json_object(param: str) -> Grammar:
    """Any JSON object (response_format json_object)."""
    return Grammar(llama_grammar.JSON_GBNF, param)


def json_schema(schema: Mapping[str, Any], param: str) -> Grammar:
    """A JSON value following `schema`; GrammarError naming `param` where the converter cannot follow it."""
    converter = _converter()
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        converter.visit(resolved, "")
        text = converter.format_grammar()
    except _CONVERTER_ERRORS as exc:
        raise GrammarError(f"this JSON schema cannot be turned into a grammar: {exc}", param) from None
    return Grammar(text.replace(_PORT_CHAR, _JSON_CHAR), param)


def tool_call(tools: Sequence[Mapping[str, Any]], name: str | None, param: str = "tool_choice") -> Grammar:
    """The rest of a `<tool_call>` block after tools.forced_prefill: one of the offered functions (or the
    named one) with arguments that follow its parameters schema, then the block's end.

    A schema the converter cannot follow still gets a JSON object for its arguments (the name stays exact).
    """
    converter = _converter()
    calls = []
    for i, tool in enumerate(tools):
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        arguments = _arguments_rule(converter, function.get("parameters"), f"args{i}", function["name"])
        end = f'space "}}" "\\n"? {_literal(CLOSE)}'
        if name is None:
            head = _literal(function["name"] + '"') + ' space "," space ' + _literal('"arguments"')
            calls.append(f'{head} space ":" space {arguments} {end}')
        else:
            calls.append(f"space {arguments} {end}")
    converter._add_rule("root", " | ".join(f"({c})" for c in calls))
    converter._add_rule("space", '" "?')
    return Grammar(converter.format_grammar().replace(_PORT_CHAR, _JSON_CHAR), param)


def _arguments_rule(converter: Any, parameters: Any, rule: str, function: str) -> str:
    schema = parameters if isinstance(parameters, Mapping) and parameters else {"type": "object"}
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        return converter.visit(resolved, rule)
    except _CONVERTER_ERRORS as exc:
        log.info("tool %s: parameters not followed by the grammar (%s); any JSON object", function, exc)
        return converter.visit({"type": "object"}, rule + "-any")


def _converter() -> Any:
    return llama_grammar.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _literal(text: str) -> str:
    return json.dumps(text)


class GrammarState:
    """llama.cpp's grammar sampler for one reply: which tokens it allows next, and the tokens taken so far."""

    def __init__(self, grammar: Grammar, n_vocab: int) -> None:
        self._sampler = grammar._new_sampler()
        self._free = weakref.finalize(self, llama_cpp.llama_sampler_free, self._sampler)
        self.param = grammar.param
        self._rows = (llama_cpp.llama_token_data * n_vocab)()
        self._view = np.ctypeslib.as_array(self._rows)  # fields id, logit, p
        self._one = (llama_cpp.llama_token_data * 1)()
        self._probe = (llama_cpp.llama_token_data * _PROBE)()
        self._probe_view = np.ctypeslib.as_array(self._probe)

    def allows(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit = token, 0.0
        self._apply(self._one, 1)
        return bool(np.isfinite(self._one[0].logit))

    def allowed(self, ids: np.ndarray | None = None) -> np.ndarray:
        """Booleans over ids (default: the whole vocabulary): may the token come next?"""
        if ids is not None and len(ids) <= _PROBE:
            rows, view = self._probe, self._probe_view
        else:
            rows, view = self._rows, self._view
        n = len(view) if ids is None else len(ids)
        view["id"][:n] = np.arange(n) if ids is None else ids
        view["logit"][:n] = 0.0
        self._apply(rows, n)
        return np.isfinite(view["logit"][:n])

    def accept(self, token: int) -> None:
        """Advance past a token the grammar allowed (llama.cpp aborts the process on any other)."""
        llama_cpp.llama_sampler_accept(self._sampler, token)

    def _apply(self, rows: Any, n: int) -> None:
        array = llama_cpp.llama_token_data_array(rows, n, -1, False)
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))

    def close(self) -> None:
        self._free()

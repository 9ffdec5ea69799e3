"""The llama.cpp backend: batches, logits rows, device argmax, rollback, tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.config import EngineSettings
from app.engine.backends.llama import LlamaBackend


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LlamaBackend]:
    with LlamaBackend(gemma_path, EngineSettings(n_ctx=512, n_batch=64, n_threads=2)) as backend:
        yield backend


def test_device_argmax_equals_the_host_argmax(gemma: LlamaBackend) -> None:
    tokens = gemma.tokenize(b"The quick brown fox jumps over the lazy dog. The quick brown", True, False)
    gemma.rollback(0)
    host = np.array(gemma.decode(tokens, 0)).argmax(axis=1).tolist()
    gemma.rollback(0)
    assert gemma.supports_device_argmax
    assert gemma.decode_argmax(tokens, 0) == host
    gemma.rollback(0)
    assert gemma.decode_argmax(tokens, len(tokens) - 3) == host[-3:]
    gemma.rollback(0)  # and back to host logits
    assert np.array(gemma.decode(tokens, len(tokens) - 1)).argmax(axis=1).tolist() == host[-1:]


def test_long_prompts_are_split_into_batches_and_rolled_back(gemma: LlamaBackend) -> None:
    tokens = gemma.tokenize(b"one two three four five six seven eight nine ten " * 20, True, False)
    assert len(tokens) > 2 * gemma.n_batch
    gemma.rollback(0)
    last = gemma.decode(tokens, len(tokens) - 1)
    assert last.shape == (1, gemma.n_vocab)
    assert gemma.kv_tokens == tokens
    assert gemma.kv_pos_max() == len(tokens) - 1
    gemma.rollback(10)
    assert gemma.kv_tokens == tokens[:10]
    assert gemma.kv_pos_max() == 9
    gemma.rollback(0)
    assert gemma.kv_pos_max() == -1
    gemma.rollback(0)
    host_last = int(np.array(gemma.decode(tokens, len(tokens) - 2)).argmax(axis=1)[-1])
    gemma.rollback(0)
    assert gemma.decode_argmax(tokens, len(tokens) - 2)[-1] == host_last  # rows of the last batch
    with pytest.raises(ValueError, match="before the last batch"):
        gemma.decode(tokens, 0)


def test_tokens_round_trip(gemma: LlamaBackend) -> None:
    text = "Grüße, 世界! def f(x): return x"
    tokens = gemma.tokenize(text.encode(), False, False)
    assert gemma.detokenize(tokens).decode() == text
    assert gemma.is_eog(gemma.vocab.eos)
    assert gemma.facts.architecture == "gemma3"
    assert gemma.facts.weights_bytes > 100_000_000
    assert gemma.facts.kv_bytes_per_token > 0

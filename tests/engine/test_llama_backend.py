"""The llama.cpp backend: batches, logits rows, device argmax, rollback, tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.config import EngineSettings
from app.engine import grammar
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


def test_the_protocol_s_sequence_vocabulary_and_feed(gemma: LlamaBackend) -> None:
    """What the core reads without asking which backend it has: one sequence, no remote layers, the
    llama_vocab pointer; feed leaves no logits and counts whole passes from position 0 as aligned."""
    assert (gemma.n_seq, gemma.devices_key) == (1, "")
    assert gemma.llama_vocab is not None
    assert grammar.vocab_pointer(gemma) == gemma.llama_vocab
    tokens = gemma.tokenize(b"one two three four five six seven eight nine ten " * 12, True, False)
    assert len(tokens) > gemma.n_batch + 1
    gemma.rollback(0)
    gemma.feed(tokens)
    assert gemma.kv_tokens == tokens
    assert gemma.aligned_prefix() == len(tokens) // gemma.n_batch * gemma.n_batch
    gemma.rollback(gemma.n_batch + 1)
    assert gemma.aligned_prefix() == gemma.n_batch
    gemma.rollback(0)
    assert gemma.aligned_prefix() == 0


def test_a_drafter_loads_whole_on_its_own_device_in_passes_of_at_most_512(gemma_path: Path) -> None:
    """role="draft": draft_device, every layer (gpu_layers and tensor_split are the target's), n_batch
    capped at 512; the target's role keeps its own n_batch and its sequences."""
    es = EngineSettings(n_ctx=512, n_batch=1024, n_threads=2, device="gpu:7", draft_device="cpu")
    with LlamaBackend(gemma_path, es, role="draft") as drafter:
        assert drafter.n_batch == 512
        assert (drafter.facts.device, drafter.facts.gpu_layers, drafter.tensor_split) == ("cpu", 0, None)
        assert drafter.device_reason == "CPU requested"
        assert drafter.n_seq == 1
    with LlamaBackend(gemma_path, es.model_copy(update={"device": "cpu"}), n_seq=2) as target:
        assert (target.n_batch, target.n_seq, target.n_ctx) == (1024, 2, 512)

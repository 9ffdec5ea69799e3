"""The backend interface every engine backend implements (DESIGN.md §4)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.catalog import gguf
from app.engine.errors import ContextLengthExceeded, ModelLoadError


@dataclass(frozen=True)
class VocabInfo:
    """What decides whether two models can share draft tokens (as llama.cpp's compatibility check)."""

    vocab_type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


@dataclass(frozen=True)
class ModelFacts:
    path: str
    architecture: str
    name: str
    n_params: int
    weights_bytes: int
    kv_bytes_per_token: int
    n_ctx_train: int
    n_layer: int
    device: str  # what the model actually runs on: "cpu" or "gpu"
    gpu_layers: int


UNPLACED_N_CTX = 4096  # the context of a model loaded without a placement's size (tests, scripts)


def read_model_header(path: Path) -> gguf.GGUFHeader:
    """A model file's GGUF header; a missing or unreadable file is a ModelLoadError."""
    try:
        return gguf.read_file(path)
    except FileNotFoundError as exc:
        raise ModelLoadError(str(exc)) from None
    except (gguf.GGUFError, OSError) as exc:
        raise ModelLoadError(f"{path.name} is not a usable GGUF model file: {exc}") from None


def plan_decode(n: int, logits_from: int, start: int, n_ctx: int, batch: int) -> int:
    """Check a decode of n tokens after `start` cached ones; returns where its last batch starts.

    Logits come from the last batch only, so logits_from must lie in it.
    """
    if n == 0 or not 0 <= logits_from < n:
        raise ValueError(f"decode of {n} tokens with logits from row {logits_from}")
    if start + n > n_ctx:
        raise ContextLengthExceeded(f"{start + n} tokens do not fit the context of {n_ctx} tokens")
    last = (n - 1) // batch * batch
    if logits_from < last:
        raise ValueError(f"logits requested for row {logits_from}, before the last batch at {last}")
    return last


class Backend(Protocol):
    """What the engine asks of a backend: everything it reads, so the engine never asks which one it has."""

    backend_name: str  # "llama" (llama.cpp) or "native" (our kernels), as /props reports it
    path: Path
    facts: ModelFacts
    vocab: VocabInfo
    n_vocab: int
    n_ctx: int
    n_batch: int  # the widest pass; longer inputs go through in passes of this many tokens
    n_threads: int  # CPU threads (0: the backend runs on a GPU and uses none of its own)
    main_gpu: int
    tensor_split: list[float] | None
    device_reason: str  # why the model runs where it runs, in words
    kv_tokens: list[int]  # tokens whose K/V sit at positions 0..len-1 of the sequence in use (see llama.py)
    chat_template: str | None
    # decode_topk's widest k taken on the device (0: none; speculative.sampled_rows then takes rows)
    device_topk_max: int
    n_seq: int  # KV sequences the backend holds (more than one: it is a BatchingBackend)
    devices_key: str  # the RPC devices part of the verify-cost cache key ("" when no layer is remote)

    @property
    def llama_vocab(self) -> Any:
        """llama.cpp's `llama_vocab` pointer that grammar samplers bind to (None: the backend has none)."""
        ...

    @property
    def supports_device_argmax(self) -> bool:
        """Whether decode_argmax takes the argmax on the device (only token ids come back)."""
        ...

    def decode(self, tokens: list[int], logits_from: int) -> np.ndarray:
        """Append tokens at positions len(kv_tokens)...; rows from logits_from on get logits.

        Returns a float32 view [len(tokens) - logits_from, n_vocab], valid until the next decode.
        """
        ...

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        """Like decode, but only the argmax token of each row (on the device where the backend can)."""
        ...

    def decode_topk(self, tokens: list[int], logits_from: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Like decode, but the k best logits of each row, best first (ties to the lower id): values
        [rows, k] float32 and ids [rows, k] int32. Taken on the device for k <= device_topk_max."""
        ...

    def feed(self, tokens: list[int]) -> None:
        """Append tokens at positions len(kv_tokens)... with no logits (a prompt before its last token)."""
        ...

    def aligned_prefix(self) -> int:
        """How much of the cached prefix a reproducible request may keep (see generation.reproducible)."""
        ...

    def rollback(self, n_keep: int) -> None:
        """Drop every cached position >= n_keep."""
        ...

    def kv_pos_max(self) -> int:
        """Highest position the backend's own cache holds for the sequence in use (-1 when empty)."""
        ...

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]: ...

    def token_bytes(self, token: int) -> bytes: ...

    def token_text(self, token: int) -> str:
        """The vocabulary's own text of a token (as stored in the model), for vocabulary comparisons."""
        ...

    def is_eog(self, token: int) -> bool: ...

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) ids for fill-in-the-middle prompts; None when the vocabulary lacks one."""
        ...

    def close(self) -> None: ...


class BatchingBackend(Backend, Protocol):
    """A backend of several sequences (n_seq > 1) that decodes rows of them in one pass (continuous batching).

    The Backend calls act on the selected sequence; these name theirs."""

    def select(self, seq: int) -> None:
        """Make `seq` the sequence that decode, rollback and kv_tokens act on."""
        ...

    def seq_tokens(self, seq: int) -> list[int]:
        """The tokens sequence `seq` keeps (its kv_tokens)."""
        ...

    def seq_cells(self, seq: int) -> tuple[int, int]:
        """(lowest, highest) position the backend's cache holds for `seq`; (-1, -1) when it holds none."""
        ...

    def rollback_seq(self, seq: int, n_keep: int) -> None:
        """Drop every position >= n_keep that sequence `seq` caches."""
        ...

    def decode_batch(self, parts: list[tuple[int, list[int], int]]) -> np.ndarray:
        """One pass over several sequences: each part (seq, tokens, logits_from) appends tokens after that
        sequence's cache, and its rows from logits_from on get logits (len(tokens): none). Returns float32
        [rows with logits, n_vocab], parts in order, valid until the next decode."""
        ...

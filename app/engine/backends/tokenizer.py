"""A model file's tokenizer through llama.cpp: tokens to bytes and back, special tokens, end of generation.

`Vocabulary` is the token access of any llama.cpp model handle (the llama backend's full model is one);
`Tokenizer` loads a file's vocabulary alone, no weights, for a backend that runs the weights itself.
"""

from __future__ import annotations

# llama_cpp comes before NumPy: the other order was seen to segfault with a CUDA build.
import llama_cpp  # isort: skip

import ctypes
from pathlib import Path
from typing import Any

from app.engine.backends.base import VocabInfo
from app.engine.backends.llama_library import ensure_backend, native_errors
from app.engine.errors import ModelLoadError


class Vocabulary:
    """Tokenizer access shared by a full model and a vocabulary-only one: needs `_vocab_p`."""

    _vocab_p: Any
    _tok_buf: Any
    _piece_buf: Any
    _pieces: dict[int, bytes]

    def _init_vocabulary(self) -> None:
        self._tok_buf = (llama_cpp.llama_token * 4096)()
        self._piece_buf = ctypes.create_string_buffer(256)
        self._pieces = {}

    @property
    def llama_vocab(self) -> Any:
        """The `llama_vocab` pointer (grammar samplers bind to it)."""
        return self._vocab_p

    def _vocab_info(self, n_tokens: int) -> VocabInfo:
        vt = self._vocab_p
        return VocabInfo(
            vocab_type=int(llama_cpp.llama_vocab_type(vt)),
            n_tokens=n_tokens,
            bos=int(llama_cpp.llama_vocab_bos(vt)),
            eos=int(llama_cpp.llama_vocab_eos(vt)),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(vt)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(vt)),
        )

    # --- tokens ---------------------------------------------------------------------------------------
    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        while True:
            n = llama_cpp.llama_tokenize(
                self._vocab_p, text, len(text), self._tok_buf, len(self._tok_buf), add_special, parse_special
            )
            if n >= 0:
                return list(self._tok_buf[:n])
            self._tok_buf = (llama_cpp.llama_token * (-n + 16))()

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            buf = self._piece_buf
            n = llama_cpp.llama_token_to_piece(self._vocab_p, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab_p, token, buf, len(buf), 0, False)
            piece = buf.raw[:n]
            self._pieces[token] = piece
        return piece

    def detokenize(self, tokens: list[int]) -> bytes:
        return b"".join(self.token_bytes(t) for t in tokens)

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab_p, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab_p, token))

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) ids for fill-in-the-middle prompts; None when the vocabulary lacks one."""
        vt = self._vocab_p
        pre, suf, mid = (
            int(llama_cpp.llama_vocab_fim_pre(vt)),
            int(llama_cpp.llama_vocab_fim_suf(vt)),
            int(llama_cpp.llama_vocab_fim_mid(vt)),
        )
        return (pre, suf, mid) if min(pre, suf, mid) >= 0 else None


class Tokenizer(Vocabulary):
    """A model file's tokenizer alone (llama.cpp loads the vocabulary and no weights): for backends that
    run the weights themselves."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        mparams.n_gpu_layers = 0
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not read the vocabulary of {self.path.name}: "
                f"{native_errors() or 'no reason'}"
            )
        self._vocab_p = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab_p))
        if self.n_vocab <= 0:
            self.close()
            raise ModelLoadError(f"{self.path.name} has no vocabulary: not a text model")
        self._init_vocabulary()
        self.vocab = self._vocab_info(self.n_vocab)

    def close(self) -> None:
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

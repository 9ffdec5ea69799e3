"""A llama_batch made once per context: tokens, positions, logits flags and sequences written in place."""

from __future__ import annotations

# llama_cpp comes before NumPy: the other order was seen to segfault with a CUDA build.
import llama_cpp  # isort: skip

import ctypes
from typing import Any

import numpy as np


class Batch:
    """n_batch rows over llama.cpp's own arrays; a row's sequence is written only when it changes."""

    def __init__(self, n_batch: int) -> None:
        self.c: Any = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.tokens = np.ctypeslib.as_array(self.c.token, shape=(n_batch,))
        self.pos = np.ctypeslib.as_array(self.c.pos, shape=(n_batch,))
        self.logits = np.ctypeslib.as_array(
            ctypes.cast(self.c.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n_batch,)
        )
        for i in range(n_batch):
            self.c.n_seq_id[i] = 1
            self.c.seq_id[i][0] = 0
        self._row_seq = np.zeros(n_batch, dtype=np.int32)  # what each row's seq_id holds now
        self._arange = np.arange(n_batch, dtype=np.int32)

    def put(self, row: int, tokens: list[int], start: int, logits_from: int) -> None:
        """Rows row.. take `tokens` at positions start..; those from tokens[logits_from] on get logits."""
        m = len(tokens)
        self.tokens[row : row + m] = tokens
        np.add(self._arange[:m], start, out=self.pos[row : row + m])
        self.logits[row : row + logits_from] = 0
        self.logits[row + logits_from : row + m] = 1

    def set_seqs(self, seqs: np.ndarray) -> None:
        """Rows 0..len(seqs)-1 belong to these sequences."""
        rows = self._row_seq[: len(seqs)]
        for i in np.flatnonzero(rows != seqs).tolist():
            self.c.seq_id[i][0] = int(seqs[i])
        rows[:] = seqs

    def ready(self, n: int) -> Any:
        """The llama_batch holding its first n rows, for llama_decode."""
        self.c.n_tokens = n
        return self.c

    def outputs(self, n: int) -> int:
        """Rows of the first n that get logits."""
        return int(self.logits[:n].sum())

    def free(self) -> None:
        llama_cpp.llama_batch_free(self.c)

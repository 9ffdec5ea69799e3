"""llama.cpp backend through llama-cpp-python's low-level API: batch decode, rows of logits, KV rollback.

One context holds `n_seq` sequences (KV slots) over one unified cache of n_ctx cells: the Backend calls
(decode, rollback, kv_tokens) act on the selected sequence, and `decode_batch` runs rows of several
sequences in one llama_decode (continuous batching).
"""

from __future__ import annotations

# llama_cpp comes before NumPy: the other order was seen to segfault with a CUDA build.
import llama_cpp  # isort: skip

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from app.catalog import gguf
from app.config import EngineSettings
from app.engine.backends.base import UNPLACED_N_CTX, ModelFacts, plan_decode, read_model_header
from app.engine.backends.llama_batch import Batch
from app.engine.backends.llama_library import add_rpc_servers as add_rpc_servers  # app.devices adds them
from app.engine.backends.llama_library import devices_key, ensure_backend, model_devices
from app.engine.backends.llama_library import ggml_library as ggml_library  # app.devices reads it here
from app.engine.backends.llama_library import local_gpus as local_gpus  # and reads what stays here
from app.engine.backends.llama_library import native_errors as _native_errors
from app.engine.backends.tokenizer import Vocabulary as _Vocabulary
from app.engine.errors import ContextLengthExceeded, DecodeError, ModelLoadError

log = logging.getLogger("foresight.llama")


def gpu_offload_supported() -> bool:
    ensure_backend()
    return bool(llama_cpp.llama_supports_gpu_offload())


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def _resolve_device(device: str, gpu_layers: int) -> tuple[str, int, int, str]:
    """(device, n_gpu_layers, main_gpu, reason) for a requested device: auto, cpu, gpu or gpu:N / cuda:N."""
    device = device.strip().lower()
    if device == "cpu":
        return "cpu", 0, 0, "CPU requested"
    index = 0
    if ":" in device:
        name, _, num = device.partition(":")
        if not num.isdigit() or name not in ("gpu", "cuda", "rocm", "hip", "vulkan", "metal"):
            raise ModelLoadError(f"unknown device {device!r}: use auto, cpu, gpu or gpu:N")
        index, device = int(num), "gpu"
    elif device not in ("auto", "gpu", "cuda", "rocm", "hip", "vulkan", "metal"):
        raise ModelLoadError(f"unknown device {device!r}: use auto, cpu, gpu or gpu:N")
    if not gpu_offload_supported():
        if device == "auto":
            return "cpu", 0, 0, "this llama.cpp build has no GPU backend"
        raise ModelLoadError("a GPU device was requested but this llama.cpp build has no GPU backend")
    return "gpu", gpu_layers, index, "GPU backend available"


def _kv_bytes_per_token(header: gguf.GGUFHeader) -> int:
    n_layer = int(header.get("{arch}.block_count", 0))
    n_embd = int(header.get("{arch}.embedding_length", 0))
    n_head = int(header.get("{arch}.attention.head_count", 1)) or 1
    n_head_kv = header.get("{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head_kv, list):  # per-layer counts
        n_head_kv = max(n_head_kv)
    key = int(header.get("{arch}.attention.key_length", n_embd // n_head))
    value = int(header.get("{arch}.attention.value_length", n_embd // n_head))
    return n_layer * int(n_head_kv) * (key + value) * 2  # f16 K and V


_FLASH_ATTN = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}

Role = Literal["target", "draft"]


@dataclass(frozen=True)
class _Placed:
    """A llama_model loaded where the settings place it, and why there."""

    model: Any  # the llama_model pointer
    device: str  # "cpu" or "gpu"
    gpu_layers: int
    main_gpu: int
    reason: str
    devices_key: str  # the devices named, where RPC workers joined (their verify costs differ)
    arrays: tuple[Any, ...]  # ctypes arrays the model's params point into, kept as long as the model


def _load_model(path: Path, device: str, gpu_layers: int, tensor_split: list[float] | None) -> _Placed:
    used, n_gpu_layers, main_gpu, reason = _resolve_device(device, gpu_layers)
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    mparams.main_gpu = main_gpu
    if used == "gpu" and ":" in device and not tensor_split:
        # gpu:N pins the whole model to that GPU; plain "gpu" lets llama.cpp spread layers over all
        mparams.split_mode = llama_cpp.LLAMA_SPLIT_MODE_NONE
        reason += f"; pinned to GPU {main_gpu}"
    if used == "gpu" and n_gpu_layers >= 0:
        reason += f"; {n_gpu_layers} layers offloaded, the rest on the CPU"
    arrays: list[Any] = []
    key = ""
    chosen = model_devices(used, pinned=":" in device and not tensor_split)
    if chosen is not None:  # RPC workers joined: name the devices (the drafter keeps to this machine)
        pointers, names = chosen
        key = devices_key(names)
        arrays.append((ctypes.c_void_p * (len(pointers) + 1))(*pointers, None))
        mparams.devices = ctypes.cast(arrays[-1], ctypes.c_void_p)
        remote = any(n.startswith("RPC") for n in names)
        reason += "; " + (
            f"layers over {', '.join(names)} (workers first)" if remote else "this machine only"
        )
    if tensor_split:
        n_dev = llama_cpp.llama_max_devices()
        arrays.append((ctypes.c_float * n_dev)(*tensor_split[:n_dev]))
        mparams.tensor_split = arrays[-1]
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise ModelLoadError(f"llama.cpp could not load {path.name}: {_native_errors() or 'no reason'}")
    return _Placed(model, used, n_gpu_layers, main_gpu, reason, key, tuple(arrays))


def _context_params(settings: EngineSettings, n_ctx: int, n_batch: int, n_seq: int, threads: int) -> Any:
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_batch
    cparams.n_seq_max = n_seq
    # One cache for all sequences: each may grow to n_ctx, together they hold n_ctx cells.
    cparams.kv_unified = True
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.flash_attn_type = _FLASH_ATTN[settings.flash_attn]
    cparams.swa_full = True  # rollback needs the whole sliding window kept (gemma3)
    cparams.no_perf = True
    cparams.n_outputs_max_per_seq = n_batch  # backend sampling of a whole verify batch
    return cparams


class _GreedyOnDevice:
    """llama.cpp's backend sampling with a greedy chain on one sequence: decodes then hand over token ids
    instead of [rows, n_vocab] logits. A chain is initialised for the backend once, so each switch-on
    attaches a fresh one."""

    def __init__(self, wanted: bool) -> None:
        self.enabled = wanted  # off where not wanted, or where llama.cpp refused it
        self.on = False
        self._chain: Any = None
        self._seq = 0  # the sequence it sits on

    def attach(self, ctx: Any, seq: int) -> None:
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        if not llama_cpp.llama_set_sampler(ctx, seq, chain):
            llama_cpp.llama_sampler_free(chain)
            log.warning("llama.cpp refused backend sampling; the argmax stays on the host")
            self.enabled = False
            return
        self._chain, self._seq, self.on = chain, seq, True

    def detach(self, ctx: Any) -> None:
        llama_cpp.llama_set_sampler(ctx, self._seq, None)
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        self.on = False


class LlamaBackend(_Vocabulary):
    """One llama.cpp model and context with n_seq sequences; the Backend calls act on `seq`."""

    backend_name = "llama"
    device_topk_max = 0  # llama.cpp hands over whole rows; decode_topk picks from them on the host

    def __init__(
        self,
        path: str | Path,
        settings: EngineSettings | None = None,
        *,
        role: Role = "target",
        n_seq: int = 1,
    ) -> None:
        """The model as `settings` place it in `role`: a drafter goes whole (gpu_layers and tensor_split
        are the target's) on settings.draft_device, in passes of at most 512 tokens. n_ctx 0: the
        context of an unplaced model."""
        es = settings or EngineSettings()
        if role == "draft":
            device, gpu_layers, tensor_split, n_batch = es.draft_device, -1, None, min(es.n_batch, 512)
        else:
            device, gpu_layers, tensor_split, n_batch = es.device, es.gpu_layers, es.tensor_split, es.n_batch
        self.path = Path(path)
        self.header = read_model_header(self.path)
        if not self.header.architecture:
            raise ModelLoadError(f"{self.path.name} has no general.architecture: not a model file")
        ensure_backend()
        placed = _load_model(self.path, device, gpu_layers, tensor_split)
        self._model, self._arrays = placed.model, placed.arrays
        self.device_reason, self.devices_key, self.main_gpu = (
            placed.reason,
            placed.devices_key,
            placed.main_gpu,
        )
        self.tensor_split = list(tensor_split) if tensor_split else None
        self._ctx = None
        self._batch: Batch | None = None
        self._greedy = _GreedyOnDevice(es.device_argmax)
        try:
            threads = es.n_threads or default_threads()
            cparams = _context_params(es, es.n_ctx or UNPLACED_N_CTX, n_batch, n_seq, threads)
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
            if not self._ctx:
                raise ModelLoadError(
                    f"llama.cpp could not create a context for {self.path.name} with n_ctx={cparams.n_ctx}: "
                    f"{_native_errors() or 'out of memory?'}"
                )
            self._mem = llama_cpp.llama_get_memory(self._ctx)
            self._vocab_p = llama_cpp.llama_model_get_vocab(self._model)
            self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
            self.n_batch = n_batch
            self.n_threads = threads
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab_p))
            if self.n_vocab <= 0:
                raise ModelLoadError(f"{self.path.name} has no vocabulary: not a text model")
            self._batch = Batch(n_batch)
        except BaseException:
            self.close()
            raise
        self._init_vocabulary()
        self.n_seq = n_seq
        self.seq = 0  # the sequence decode, rollback and kv_tokens act on
        self._kv: list[list[int]] = [[] for _ in range(n_seq)]
        # per sequence: the prefix fed in whole n_batch passes from position 0 while no other sequence held
        # a cell, so each pass and cell as a cold prefill into an empty cache makes them (see aligned_prefix)
        self._aligned = [0] * n_seq
        self.chat_template = self.header.chat_template
        self.vocab = self._vocab_info(self.n_vocab)
        self.facts = ModelFacts(
            path=str(self.path),
            architecture=self.header.architecture,
            name=self.header.name or self.path.stem,
            n_params=int(llama_cpp.llama_model_n_params(self._model)),
            weights_bytes=int(llama_cpp.llama_model_size(self._model)),
            kv_bytes_per_token=_kv_bytes_per_token(self.header),
            n_ctx_train=int(llama_cpp.llama_model_n_ctx_train(self._model)),
            n_layer=int(llama_cpp.llama_model_n_layer(self._model)),
            device=placed.device,
            gpu_layers=placed.gpu_layers,
        )
        log.info(
            "loaded %s (%s, %.0f MB) on %s, n_ctx=%d, threads=%d",
            self.path.name,
            self.facts.architecture,
            self.facts.weights_bytes / 1e6,
            placed.device,
            self.n_ctx,
            threads,
        )

    # --- sequences -----------------------------------------------------------------------------------
    @property
    def kv_tokens(self) -> list[int]:
        """Tokens whose K/V sit at positions 0..len-1 of the selected sequence."""
        return self._kv[self.seq]

    def select(self, seq: int) -> None:
        """Make `seq` the sequence that decode, rollback and kv_tokens act on."""
        if not 0 <= seq < self.n_seq:
            raise ValueError(f"sequence {seq} of {self.n_seq}")
        if seq != self.seq and self._greedy.on:
            self._greedy.detach(self._ctx)  # the greedy chain sits on one sequence
        self.seq = seq

    def seq_tokens(self, seq: int) -> list[int]:
        """The tokens sequence `seq` keeps (its kv_tokens)."""
        return self._kv[seq]

    def seq_cells(self, seq: int) -> tuple[int, int]:
        """(lowest, highest) position llama.cpp's cache holds for `seq`; (-1, -1) when it holds none."""
        return (
            int(llama_cpp.llama_memory_seq_pos_min(self._mem, seq)),
            int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq)),
        )

    # --- decoding -------------------------------------------------------------------------------------
    def decode(self, tokens: list[int], logits_from: int) -> np.ndarray:
        if self._greedy.on:
            self._greedy.detach(self._ctx)
        self._decode(tokens, logits_from)
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(len(tokens) - logits_from, self.n_vocab))

    def decode_batch(self, parts: list[tuple[int, list[int], int]]) -> np.ndarray:
        """One llama_decode over several sequences: each part (seq, tokens, logits_from) appends tokens
        after that sequence's cache, and its rows from logits_from on get logits (len(tokens): none).

        Returns float32 [rows with logits, n_vocab], parts in order, valid until the next decode. The
        parts together take at most n_batch tokens, one part per sequence."""
        batch = self._open_batch()
        if self._greedy.on and any(logits_from < len(tokens) for _, tokens, logits_from in parts):
            self._greedy.detach(self._ctx)
        n = sum(len(tokens) for _, tokens, _ in parts)
        if not 0 < n <= self.n_batch or len({seq for seq, _, _ in parts}) != len(parts):
            raise ValueError(f"a batch of {n} tokens over {len(parts)} parts (one per sequence)")
        seqs = np.empty(n, dtype=np.int32)
        row = 0
        for seq, tokens, logits_from in parts:
            m, start = len(tokens), len(self._kv[seq])
            if not 0 <= logits_from <= m:
                raise ValueError(f"logits from row {logits_from} of a part of {m} tokens")
            if start + m > self.n_ctx:
                raise ContextLengthExceeded(f"{start + m} tokens do not fit the context of {self.n_ctx}")
            batch.put(row, tokens, start, logits_from)
            seqs[row : row + m] = seq
            row += m
        batch.set_seqs(seqs)
        ret = llama_cpp.llama_decode(self._ctx, batch.ready(n))
        if ret != 0:
            for seq, _, _ in parts:
                llama_cpp.llama_memory_seq_rm(self._mem, seq, len(self._kv[seq]), -1)
            raise DecodeError(f"llama_decode failed with code {ret}: {_native_errors() or 'no KV slot'}")
        for seq, tokens, _ in parts:
            self._kv[seq].extend(tokens)
        n_out = batch.outputs(n)
        if n_out == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self._ctx), shape=(n_out, self.n_vocab))

    def feed(self, tokens: list[int]) -> None:
        """Append tokens to the selected sequence's cache with no logits (a prompt before its last token),
        in passes of n_batch."""
        seq, nb = self.seq, self.n_batch
        alone = not any(kept for other, kept in enumerate(self._kv) if other != seq)
        for chunk in range(0, len(tokens), nb):
            part = tokens[chunk : chunk + nb]
            start = len(self._kv[seq])
            self.decode_batch([(seq, part, len(part))])
            if alone and start == self._aligned[seq] and len(part) == nb:
                self._aligned[seq] += nb

    def aligned_prefix(self) -> int:
        """How much of the selected sequence was fed in whole n_batch passes from position 0 into an
        otherwise empty cache: fed on from there, alone in the cache, a prompt that shares it computes
        every row as a cold prefill does (llama.cpp's rows round by the pass they sit in, and by where the
        cache keeps the cells around them: other sequences' cells moved gemma-3-270m's logits by 0.67)."""
        return self._aligned[self.seq]

    def decode_topk(self, tokens: list[int], logits_from: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        rows = self.decode(tokens, logits_from)
        ids = np.argsort(-rows, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(rows, ids, axis=1), ids.astype(np.int32)

    @property
    def supports_device_argmax(self) -> bool:
        return self._greedy.enabled

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        """Like decode, but returns the argmax token of each row with logits, computed on the device."""
        if not self._greedy.enabled:
            rows = self.decode(tokens, logits_from)
            return rows.argmax(axis=1).tolist()
        if not self._greedy.on:
            self._greedy.attach(self._ctx, self.seq)
        self._decode(tokens, logits_from)
        last_chunk = (len(tokens) - 1) // self.n_batch * self.n_batch  # indices count in the last batch
        get = llama_cpp.llama_get_sampled_token_ith
        out = [int(get(self._ctx, i - last_chunk)) for i in range(logits_from, len(tokens))]
        if min(out) < 0:
            raise DecodeError("llama.cpp sampled no token for a requested row")
        return out

    def _open_batch(self) -> Batch:
        if not self._ctx or self._batch is None:
            raise DecodeError(f"{self.path.name} is closed")
        return self._batch

    def _decode(self, tokens: list[int], logits_from: int) -> None:
        batch = self._open_batch()
        n = len(tokens)
        start = len(self.kv_tokens)
        nb = self.n_batch
        last_chunk = plan_decode(n, logits_from, start, self.n_ctx, nb)
        batch.set_seqs(np.full(min(n, nb), self.seq, dtype=np.int32))
        for chunk in range(0, n, nb):
            part = tokens[chunk : chunk + nb]
            batch.put(0, part, start + chunk, logits_from - chunk if chunk == last_chunk else len(part))
            ret = llama_cpp.llama_decode(self._ctx, batch.ready(len(part)))
            if ret != 0:
                llama_cpp.llama_memory_seq_rm(self._mem, self.seq, start + chunk, -1)
                self.rollback(start)
                raise DecodeError(f"llama_decode failed with code {ret}: {_native_errors() or 'no KV slot'}")
            self.kv_tokens.extend(part)

    def decode_external(
        self, n_positions: int, placeholder: int, run: Callable[[Any, int, int], int]
    ) -> None:
        """Positions the backend does not decode itself (an image's embeddings, through libmtmd).

        `run(llama_context, n_past, seq)` fills n_positions positions of sequence `seq` from n_past on and
        returns the next position; kv_tokens records them as `placeholder`, which no prompt token equals.
        """
        if not self._ctx:
            raise DecodeError(f"{self.path.name} is closed")
        start = len(self.kv_tokens)
        if start + n_positions > self.n_ctx:
            raise ContextLengthExceeded(
                f"{start + n_positions} positions do not fit the context of {self.n_ctx} tokens"
            )
        if self._greedy.on:  # no sampler may sit on the sequence while embeddings are decoded
            self._greedy.detach(self._ctx)
        try:
            end = run(self._ctx, start, self.seq)
        except BaseException:
            llama_cpp.llama_memory_seq_rm(self._mem, self.seq, start, -1)
            raise
        if end != start + n_positions:
            llama_cpp.llama_memory_seq_rm(self._mem, self.seq, start, -1)
            raise DecodeError(f"an external decode filled positions {start}..{end}, not {n_positions}")
        self.kv_tokens.extend([placeholder] * n_positions)

    @property
    def llama_model(self) -> Any:
        """The llama_model pointer (a vision projector is loaded against it)."""
        return self._model

    def rollback(self, n_keep: int) -> None:
        self.rollback_seq(self.seq, n_keep)

    def rollback_seq(self, seq: int, n_keep: int) -> None:
        """Drop every position >= n_keep that sequence `seq` caches."""
        if not self._ctx:
            raise DecodeError(f"{self.path.name} is closed")
        kept = self._kv[seq]
        if n_keep < len(kept):
            if not llama_cpp.llama_memory_seq_rm(self._mem, seq, n_keep, -1):
                raise DecodeError(f"this model's cache cannot roll back to position {n_keep}")
            del kept[n_keep:]
            self._aligned[seq] = min(self._aligned[seq], n_keep // self.n_batch * self.n_batch)

    def kv_pos_max(self) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, self.seq))

    # --- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._greedy.on and self._ctx:
            self._greedy.detach(self._ctx)
        if self._batch is not None:
            self._batch.free()
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LlamaBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

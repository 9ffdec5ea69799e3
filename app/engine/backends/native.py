"""Native backend: one model on one GPU, run by our kernels as reference.py specifies the model.

The pass itself (buffers, launches, a CUDA graph per width) is native_forward.ForwardPass; here the model is
checked and loaded, passes are planned over the cache (only the argmax ids, the rows of logits or the top-k
asked for are copied out after one), and the tokenizer is tokenizer.Tokenizer (llama.cpp reads the file's
vocabulary and no weights).
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from app.catalog import gguf
from app.config import EngineSettings
from app.engine.backends.base import ModelFacts, VocabInfo, plan_decode, read_model_header
from app.engine.backends.native_forward import ForwardPass
from app.engine.backends.native_profile import pass_profile
from app.engine.backends.native_weights import DeviceWeights
from app.engine.errors import DecodeError, ModelLoadError
from app.engine.kernels import attention, quant
from app.engine.kernels.hparams import ModelConfig
from app.engine.kernels.ops import cupy_module
from app.engine.kernels.runtime import is_hip
from app.engine.kernels.weights import ModelWeights

log = logging.getLogger("foresight.native")

GEMV_KERNELS = ("reference", "fast")  # EngineSettings.native_gemv

# Widest pass: a verify of 16 drafts is 17 tokens (the widths the kernels are tested at); prompts go
# through in passes of this many tokens.
MAX_WIDTH = 17


def gpu_available() -> str | None:
    """None when CuPy sees a GPU, else why not."""
    try:
        cupy = cupy_module()
    except ImportError:
        return "CuPy is not installed (pip install 'foresight[cuda12]', cuda13 or rocm)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # a driver without a device raises a CUDA error
        return f"CuPy finds no GPU: {exc}"
    return None if count > 0 else "CuPy finds no GPU"


def native_support(path: str | Path, header: gguf.GGUFHeader | None = None) -> str | None:
    """None when the native backend can run this model file here, else the reason it cannot."""
    reason = gpu_available()
    if reason:
        return reason
    try:
        header = header or read_model_header(Path(path))
        config = ModelConfig.from_header(header)
    except (ModelLoadError, ValueError) as exc:
        return str(exc)
    if any("ffn_gate_inp" in t.name or len(t.shape) > 2 for t in header.tensors):
        return "mixture-of-experts layers"
    if config.head_dim not in attention.ATTN_HEAD_DIMS:
        return f"head size {config.head_dim} (the attention kernels take {attention.ATTN_HEAD_DIMS})"
    if config.logit_softcap:
        return "final logit softcapping"
    for t in header.tensors:
        if len(t.shape) == 2 and t.type_id not in quant.TYPES:
            return f"tensor {t.name} is {quant.type_name(t.type_id)}, which the kernels do not read"
    return None


class NativeBackend:
    """One model on one GPU, run by our kernels; a single sequence, as LlamaBackend.

    tokenizer=False: token ids only (no llama.cpp needed), for kernel work on a machine without it.
    gemv: "reference" (gemv.cu, float activations) or "fast" (mmvq.cu where the weight type allows);
    None: the setting's default.
    """

    backend_name = "native"

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 4096,
        max_width: int = MAX_WIDTH,
        graphs: bool = True,
        tokenizer: bool = True,
        gemv: str | None = None,
    ):
        self.gemv = gemv or EngineSettings.model_fields["native_gemv"].default
        if self.gemv not in GEMV_KERNELS:
            raise ValueError(f"gemv {self.gemv!r}: one of {', '.join(GEMV_KERNELS)}")
        self.path = Path(path)
        self.header = read_model_header(self.path)
        reason = native_support(self.path, self.header)
        if reason:
            raise ModelLoadError(f"the native backend cannot run {self.path.name}: {reason}")
        cupy = cupy_module()
        try:
            c = self.config = ModelConfig.from_header(self.header)
        except ValueError as exc:  # what the reference does not implement, named
            raise ModelLoadError(f"the native backend cannot run {self.path.name}: {exc}") from exc
        self.tensors = ModelWeights(self.path, self.header)
        self.n_ctx = int(n_ctx)
        self.n_batch = self.max_width = int(max_width)
        self.n_threads = 0
        self.main_gpu = int(cupy.cuda.Device().id)
        self.tensor_split = None
        self.supports_device_argmax = True
        self.n_seq = 1  # one sequence: the engine batches nothing over it
        self.devices_key = ""  # no layer on an RPC worker
        self.n_vocab = c.n_vocab
        self._vocab: Any = None
        if tokenizer:
            from app.engine.backends.tokenizer import Tokenizer  # llama.cpp reads the vocabulary, no weights

            self._vocab = Tokenizer(self.path)
            self.vocab: VocabInfo = self._vocab.vocab
        self.chat_template = self.header.chat_template
        self.kv_tokens: list[int] = []
        try:
            uploaded = DeviceWeights(self.tensors, self.header, c, self.gemv)
            self.weights_bytes = uploaded.nbytes
            self.forward = ForwardPass(
                c, uploaded, self.n_ctx, self.max_width, self.gemv, graphs and not is_hip()
            )
            self.device_topk_max = self.forward.topk_max
            # One pass now: the kernels compile here (NVRTC), so a compiler that fails is a load error
            # (and `auto` can still take llama.cpp), not the first request's.
            self.decode_argmax([0], 0)
            self.rollback(0)
        except Exception as exc:  # a kernel, the compiler, the device or a tensor it did not expect
            self.close()
            raise ModelLoadError(f"the native backend could not load {self.path.name}: {exc}") from exc
        n_params = sum(math.prod(t.shape) for t in self.header.tensors)
        self.facts = ModelFacts(
            path=str(self.path),
            architecture=c.architecture,
            name=self.header.name or self.path.stem,
            n_params=int(n_params),
            weights_bytes=self.weights_bytes,
            kv_bytes_per_token=c.n_layer * c.n_head_kv * c.head_dim * 2 * 2,  # f16 K and V
            n_ctx_train=int(self.header.get("{arch}.context_length", 0) or 0),
            n_layer=c.n_layer,
            device="gpu",
            gpu_layers=c.n_layer,
        )
        gpu_name = cupy.cuda.runtime.getDeviceProperties(self.main_gpu)["name"].decode()
        self.device_reason = f"native kernels on GPU {self.main_gpu} ({gpu_name})"
        if self.gemv == "fast":
            self.device_reason += "; GEMV on int8 activations (dp4a)"
        log.info(
            "loaded %s natively (%s, %.0f MB), n_ctx=%d",
            self.path.name,
            c.architecture,
            self.weights_bytes / 1e6,
            self.n_ctx,
        )

    def _decode(self, tokens: list[int], logits_from: int, fetch: Any) -> Any:
        """Run tokens through the model; returns fetch(first row, rows) of the last pass's output rows
        logits_from.. (a copy to the host, made on our stream before it is synchronised)."""
        n = len(tokens)
        start = len(self.kv_tokens)
        w = self.max_width
        last = plan_decode(n, logits_from, start, self.n_ctx, w)
        row = logits_from - last
        try:
            for chunk in range(0, n, w):
                self.forward.run(tokens[chunk : chunk + w], start + chunk, logits=chunk == last)
            with self.forward.stream:
                out = fetch(row, n - logits_from)
            self.forward.stream.synchronize()
        except Exception as exc:  # a kernel refused, or the device failed: nothing is committed
            self.forward.graphs.clear()
            raise DecodeError(f"native pass failed: {exc}") from exc
        self.kv_tokens.extend(tokens)
        return out

    def decode(self, tokens: list[int], logits_from: int) -> np.ndarray:
        fp = self.forward
        return self._decode(tokens, logits_from, lambda r, m: fp.logits[r : r + m].get(stream=fp.stream))

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        fp = self.forward
        best = self._decode(tokens, logits_from, lambda r, m: fp.best[r : r + m].get(stream=fp.stream))
        return best.tolist()

    def decode_topk(self, tokens: list[int], logits_from: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best logits of rows logits_from.. (values, ids; best first), taken on the device."""
        if not 1 <= k <= self.device_topk_max:
            raise ValueError(f"top-{k}: the device top-k takes 1..{self.device_topk_max}")

        def fetch(r: int, m: int) -> tuple[np.ndarray, np.ndarray]:
            val, idx = self.forward.top_k(r, m, k)
            return val.get(stream=self.forward.stream), idx.get(stream=self.forward.stream)

        return self._decode(tokens, logits_from, fetch)

    def feed(self, tokens: list[int]) -> None:
        """Tokens into the KV with no logits wanted: decoded, and the one row of logits dropped."""
        self.decode(tokens, len(tokens) - 1)

    def aligned_prefix(self) -> int:
        """None of the cached prefix is kept for a reproducible request: the prompt is fed anew."""
        return 0

    def profile(self, width: int = 1, repeats: int = 20) -> dict[str, Any]:
        """Where a pass of `width` tokens spends its time (native_profile.pass_profile). The cache must hold
        a prefix; nothing is kept."""
        n_keep = len(self.kv_tokens)
        tokens = (self.kv_tokens or [0])[-width:] * (width // max(n_keep, 1) + 1)
        self.decode_argmax(tokens[:width], 0)  # records the graph of this width
        self.rollback(n_keep)
        return pass_profile(self.forward, width, repeats)

    def rollback(self, n_keep: int) -> None:
        # Attention reads no cached row past a query's own position, so later passes store over the rest.
        if n_keep < len(self.kv_tokens):
            del self.kv_tokens[max(n_keep, 0) :]

    def kv_pos_max(self) -> int:
        return len(self.kv_tokens) - 1

    def close(self) -> None:
        if hasattr(self, "forward"):  # the weights, the cache and every buffer on the device go with it
            self.forward.graphs.clear()
            del self.forward
        if hasattr(self, "tensors"):
            del self.tensors
        # CuPy's pool keeps freed blocks: hand them back, so llama.cpp (a fallback) can have them
        with contextlib.suppress(ImportError):
            cupy_module().get_default_memory_pool().free_all_blocks()
        if getattr(self, "_vocab", None) is not None:
            self._vocab.close()
            self._vocab = None

    # --- tokens (llama.cpp's tokenizer of the same file) -------------------------------------------------
    @property
    def llama_vocab(self) -> Any:
        """The tokenizer's `llama_vocab` pointer (grammar samplers bind to it); None without a tokenizer."""
        return None if self._vocab is None else self._vocab.llama_vocab

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        return self._vocab.tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self._vocab.token_bytes(token)

    def detokenize(self, tokens: list[int]) -> bytes:
        return self._vocab.detokenize(tokens)

    def token_text(self, token: int) -> str:
        return self._vocab.token_text(token)

    def is_eog(self, token: int) -> bool:
        return self._vocab.is_eog(token)

    def fim_tokens(self) -> tuple[int, int, int] | None:
        return self._vocab.fim_tokens()

    def __enter__(self) -> NativeBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

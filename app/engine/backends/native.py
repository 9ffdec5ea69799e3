"""Native backend: app.engine.kernels.reference's forward pass on our kernels (native/), a CUDA graph a step.

The model runs as reference.py specifies it: GGUF blocks are read straight by the GEMV kernels (projections
of one input and one weight type stacked into one matrix, one launch; gemv="fast": kernels.mmvq's int8
kernels where the type allows, each input quantised once), the q/k norms, RoPE and KV store are one launch,
as are Gemma's output norm, residual add and next input norm; the KV cache is f16 (as llama.cpp's), and a
pass of width n (1..max_width tokens) is recorded once as a CUDA graph and replayed: only the token ids and
positions are copied in before a replay, and the argmax ids (or the rows of logits asked for) copied out
after. On HIP the same launches run without a graph.
The weights come from the file through kernels.weights (as the reference reads them); the tokenizer from
tokenizer.Tokenizer (llama.cpp reads the file's vocabulary and no weights).
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
from app.engine.backends.native_weights import ATTN_IN, DeviceWeights, Matrix, Projection
from app.engine.errors import DecodeError, ModelLoadError
from app.engine.kernels import mmvq, ops, qmatmul
from app.engine.kernels.reference import ModelConfig
from app.engine.kernels.runtime import is_hip
from app.engine.kernels.weights import ModelWeights

log = logging.getLogger("foresight.native")

GEMV_KERNELS = ("reference", "fast")  # EngineSettings.native_gemv

# Widest pass: a verify of 16 drafts is 17 tokens (the widths the kernels are tested at); prompts go
# through in passes of this many tokens.
MAX_WIDTH = 17


def _cupy() -> Any:
    import cupy

    return cupy


def gpu_available() -> str | None:
    """None when CuPy sees a GPU, else why not."""
    try:
        cupy = _cupy()
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
    if config.head_dim not in ops.ATTN_HEAD_DIMS:
        return f"head size {config.head_dim} (the attention kernels take {ops.ATTN_HEAD_DIMS})"
    if config.logit_softcap:
        return "final logit softcapping"
    for t in header.tensors:
        if len(t.shape) == 2 and t.type_id not in qmatmul.TYPES:
            return f"tensor {t.name} is {qmatmul.type_name(t.type_id)}, which the kernels do not read"
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
        cupy = _cupy()
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
        self._graphs_on = graphs and not is_hip()
        self.n_vocab = c.n_vocab
        self._vocab: Any = None
        if tokenizer:
            from app.engine.backends.tokenizer import Tokenizer  # llama.cpp reads the vocabulary, no weights

            self._vocab = Tokenizer(self.path)
            self.vocab: VocabInfo = self._vocab.vocab
        self.chat_template = self.header.chat_template
        self.kv_tokens: list[int] = []
        self._graphs: dict[tuple[int, bool], Any] = {}
        try:
            uploaded = DeviceWeights(self.tensors, self.header, c, self.gemv)
            self.weights, self.vectors, self.layers = uploaded.matrices, uploaded.vectors, uploaded.layers
            self.output, self.weights_bytes = uploaded.output, uploaded.nbytes
            self._allocate()
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

    # --- load ------------------------------------------------------------------------------------------
    def _allocate(self) -> None:
        cupy = _cupy()
        c, w = self.config, self.max_width
        f32 = cupy.float32
        self.ids = cupy.zeros(w, dtype=cupy.int32)
        self.pos = cupy.zeros(w, dtype=cupy.int32)
        self.x = cupy.zeros((w, c.n_embd), dtype=f32)  # the residual stream
        self.h = cupy.zeros((w, c.n_embd), dtype=f32)
        self.o = cupy.zeros((w, c.n_embd), dtype=f32)
        self.q = cupy.zeros((w, c.n_head * c.head_dim), dtype=f32)
        # A layer's projections write one buffer per matrix (at most three: q, k, v of three types).
        proj_width = max(c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim, 2 * c.n_ff)
        self.proj = [cupy.zeros(w * proj_width, dtype=f32) for _ in range(len(ATTN_IN))]
        self.attn = cupy.zeros((w, c.n_head * c.head_dim), dtype=f32)
        self.gate = cupy.zeros((w, c.n_ff), dtype=f32)
        self.logits = cupy.zeros((w, c.n_vocab), dtype=f32)
        self.best = cupy.zeros(w, dtype=cupy.int32)
        self.cache = ops.KVCache(c.n_layer, self.n_ctx, c.n_head_kv, c.head_dim)
        self.workspace = ops.Workspace(max_rows=w, n_head=c.n_head, head_dim=c.head_dim, vocab=c.n_vocab)
        self.device_topk_max = self.workspace.topk_max
        self.topk_val = cupy.zeros(w * self.device_topk_max, dtype=f32)  # [rows, k] for the k asked
        self.topk_idx = cupy.zeros(w * self.device_topk_max, dtype=cupy.int32)
        self._host_in = np.zeros(2 * w, dtype=np.int32)
        self._arange = np.arange(w, dtype=np.int32)

        # The GEMV inputs quantised for mmvq.cu: h (by the norms that write it), the attention output (a
        # launch of its own) and the gated activation (by the kernel that writes it).
        def quantized(width: int) -> mmvq.QuantizedRows | None:
            return mmvq.QuantizedRows(w, width) if self.gemv == "fast" and width % mmvq.X_BLOCK == 0 else None

        self._qh, self._qattn, self._qgate = (quantized(k) for k in (c.n_embd, c.n_head * c.head_dim, c.n_ff))
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # The uploads and zero fills above ran on the default stream; ours does not wait for it.
        cupy.cuda.Device().synchronize()

    # --- the forward pass ------------------------------------------------------------------------------
    def _matmul(
        self, x: Any, weight: Matrix, out: Any, bias: Any, accumulate: bool, qx: Any, done: bool
    ) -> None:
        """out (+)= x . W^T (+ bias) by the weight's kernel: mmvq.cu reads x as qx holds it, quantised by
        the kernel that wrote x (done) or here."""
        if isinstance(weight, mmvq.PackedWeight):
            if not done:
                mmvq.quantize(x, qx)
            mmvq.matmul(qx, weight, out, bias, accumulate)
        else:
            qmatmul.matmul(x, weight, out, bias, accumulate)

    def _project(self, h: Any, projections: list[Projection]) -> dict[str, Any]:
        """Run a layer's projections of h (quantised by the norm that wrote it); role -> its [n, rows] view of
        the output buffers."""
        n = h.shape[0]
        views = {}
        for buffer, p in zip(self.proj, projections, strict=False):
            out = buffer[: n * p.weight.n_out].reshape(n, p.weight.n_out)
            self._matmul(h, p.weight, out, p.bias, False, self._qh, True)
            col = 0
            for role, rows in zip(p.roles, p.rows, strict=True):
                views[role] = out[:, col : col + rows]
                col += rows
        return views

    def _sublayer_out(
        self, src: Any, name: str, post_norm: str, next_norm: str, n: int, q_src: Any, src_done: bool
    ) -> None:
        """x += a sublayer's output projection of src (quantised in q_src), then h = the next sublayer's
        input norm of x. Gemma norms the projection first (post_norm): one launch does that norm, the add
        and the next."""
        c, x, h = self.config, self.x[:n], self.h[:n]
        weight, bias = self.weights[f"{name}.weight"], self.vectors.get(f"{name}.bias")
        if not c.post_norms:  # the residual add fused into the GEMV
            self._matmul(src, weight, x, bias, True, q_src, src_done)
            ops.rms_norm(x, self.vectors[next_norm], h, c.rms_eps, q8=self._qh)
            return
        o = self.o[:n]
        self._matmul(src, weight, o, bias, False, q_src, src_done)
        w_post, w_next = self.vectors[post_norm], self.vectors[next_norm]
        ops.rms_norm_add_rms_norm(o, w_post, x, w_next, h, c.rms_eps, q8=self._qh)

    def _forward(self, n: int, logits: bool) -> None:
        """One pass over ids[:n] at positions pos[:n]: KV stored, then logits (or nothing) for every row."""
        c, vec = self.config, self.vectors
        hd = c.head_dim
        ids, pos = self.ids[:n], self.pos[:n]
        x, h = self.x[:n], self.h[:n]
        q = self.q[:n].reshape(n, c.n_head, hd)
        attn = self.attn[:n]
        gate = self.gate[:n]
        factors = vec.get("rope_freqs.weight")
        qmatmul.get_rows(self.weights["token_embd.weight"], ids, x)
        if c.embed_scale != 1.0:
            ops.scale(x, c.embed_scale, x)
        ops.rms_norm(x, vec["blk.0.attn_norm.weight"], h, c.rms_eps, q8=self._qh)
        for il, (attn_in, ffn_in) in enumerate(self.layers):
            p = f"blk.{il}"
            qkv = self._project(h, attn_in)
            base, scale = c.rope_for(il)
            ops.qk_norm_rope_store(
                qkv["attn_q"],
                qkv["attn_k"],
                qkv["attn_v"],
                pos,
                base,
                c.rope_neox,
                q,
                self.cache.k[il],
                self.cache.v[il],
                q_norm=vec[f"{p}.attn_q_norm.weight"] if c.qk_norm else None,
                k_norm=vec[f"{p}.attn_k_norm.weight"] if c.qk_norm else None,
                eps=c.rms_eps,
                freq_scale=scale,
                n_rot=c.n_rot,
                freq_factors=factors,
            )
            if il + 1 == c.n_layer and not logits:
                break  # the rest of the last layer feeds only the logits; its K and V are stored
            window = c.sliding_window if c.swa_layers[il] else 0
            ops.attention(
                q,
                self.cache.k[il],
                self.cache.v[il],
                pos,
                c.attn_scale,
                attn.reshape(n, c.n_head, hd),
                self.workspace,
                window,
            )
            post, ffn_norm = f"{p}.post_attention_norm.weight", f"{p}.ffn_norm.weight"
            self._sublayer_out(attn, f"{p}.attn_output", post, ffn_norm, n, self._qattn, False)
            ffn = self._project(h, ffn_in)
            act = ops.gelu_tanh_gate if c.gelu else ops.silu_gate
            act(ffn["ffn_gate"], ffn["ffn_up"], gate, q8=self._qgate)
            last = il + 1 == c.n_layer
            next_norm = "output_norm.weight" if last else f"blk.{il + 1}.attn_norm.weight"
            self._sublayer_out(
                gate, f"{p}.ffn_down", f"{p}.post_ffw_norm.weight", next_norm, n, self._qgate, True
            )
        if logits:
            self._matmul(h, self.output, self.logits[:n], None, False, self._qh, True)
            ops.argmax(self.logits[:n], self.best[:n], self.workspace)

    def _run(self, tokens: list[int], start: int, logits: bool) -> None:
        """Copy ids and positions in, then replay (or record) the pass of this width on our stream."""
        n = len(tokens)
        host = self._host_in
        host[:n] = tokens
        np.add(self._arange[:n], start, out=host[n : 2 * n])
        with self.stream:
            self.ids[:n].set(host[:n], stream=self.stream)
            self.pos[:n].set(host[n : 2 * n], stream=self.stream)
            key = (n, logits)
            graph = self._graphs.get(key)
            if graph is not None:
                graph.launch(self.stream)
                return
            # The first pass of a width runs the launches themselves (compiling what is new), then the
            # same launches are recorded for every later pass of that width.
            self._forward(n, logits)
            if self._graphs_on:
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self._forward(n, logits)
                finally:
                    self._graphs[key] = self.stream.end_capture()

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
                self._run(tokens[chunk : chunk + w], start + chunk, logits=chunk == last)
            with self.stream:
                out = fetch(row, n - logits_from)
            self.stream.synchronize()
        except Exception as exc:  # a kernel refused, or the device failed: nothing is committed
            self._graphs.clear()
            raise DecodeError(f"native pass failed: {exc}") from exc
        self.kv_tokens.extend(tokens)
        return out

    def decode(self, tokens: list[int], logits_from: int) -> np.ndarray:
        return self._decode(tokens, logits_from, lambda r, m: self.logits[r : r + m].get(stream=self.stream))

    def decode_argmax(self, tokens: list[int], logits_from: int) -> list[int]:
        best = self._decode(tokens, logits_from, lambda r, m: self.best[r : r + m].get(stream=self.stream))
        return best.tolist()

    def decode_topk(self, tokens: list[int], logits_from: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best logits of rows logits_from.. (values, ids; best first), taken on the device."""
        if not 1 <= k <= self.device_topk_max:
            raise ValueError(f"top-{k}: the device top-k takes 1..{self.device_topk_max}")

        def fetch(r: int, m: int) -> tuple[np.ndarray, np.ndarray]:
            val, idx = self.topk_val[: m * k].reshape(m, k), self.topk_idx[: m * k].reshape(m, k)
            ops.top_k(self.logits[r : r + m], k, val, idx, self.workspace)
            return val.get(stream=self.stream), idx.get(stream=self.stream)

        return self._decode(tokens, logits_from, fetch)

    def profile(self, width: int = 1, repeats: int = 20) -> dict[str, Any]:
        """Where a pass of `width` tokens spends its time (native_profile.pass_profile)."""
        from app.engine.backends.native_profile import pass_profile

        return pass_profile(self, width, repeats)

    def rollback(self, n_keep: int) -> None:
        # Attention reads no cached row past a query's own position, so later passes store over the rest.
        if n_keep < len(self.kv_tokens):
            del self.kv_tokens[max(n_keep, 0) :]

    def kv_pos_max(self) -> int:
        return len(self.kv_tokens) - 1

    def close(self) -> None:
        self._graphs.clear()
        buffers = ("logits", "best", "topk_val", "topk_idx", "ids", "pos", "x", "h", "o", "q", "proj", "attn")
        buffers = (*buffers, "gate", "layers", "_qh", "_qattn", "_qgate")
        for name in ("weights", "vectors", "output", "tensors", "cache", "workspace", *buffers):
            if hasattr(self, name):
                delattr(self, name)
        # CuPy's pool keeps freed blocks: hand them back, so llama.cpp (a fallback) can have them
        with contextlib.suppress(ImportError):
            _cupy().get_default_memory_pool().free_all_blocks()
        if getattr(self, "_vocab", None) is not None:
            self._vocab.close()
            self._vocab = None

    # --- tokens (llama.cpp's tokenizer of the same file) -------------------------------------------------
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

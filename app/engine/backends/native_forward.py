"""The native forward pass: a model's device buffers, its launches in reference.py's order, a graph per width.

GGUF blocks are read straight by the GEMV kernels (projections of one input and one weight type stacked into
one matrix, one launch; gemv="fast": kernels.mmvq's int8 kernels where the type allows, each input quantised
once), the q/k norms, RoPE and KV store are one launch, as are Gemma's output norm, residual add and next
input norm; the KV cache is f16 (as llama.cpp's), and a pass of width n (1..max_width tokens) is recorded once
as a CUDA graph and replayed: only the token ids and positions are copied in before a replay.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.engine.backends.native_weights import ATTN_IN, DeviceWeights, Matrix, Projection
from app.engine.kernels import activation, attention, gemv, mmvq, norm, qkv, sample
from app.engine.kernels.hparams import ModelConfig
from app.engine.kernels.ops import cupy_module


class ForwardPass:
    """One model's pass over up to max_width tokens on our stream: the buffers it uses, allocated once, and a
    CUDA graph per (width, logits) once it ran (graphs=False: the launches every time, as on HIP).

    After `run`, `logits` [n, n_vocab] and `best` [n] hold every row's logits and argmax (when asked for).
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: DeviceWeights,
        n_ctx: int,
        max_width: int,
        gemv_kind: str,
        graphs: bool,
    ) -> None:
        self.config = config
        self.matrices, self.vectors, self.layers = weights.matrices, weights.vectors, weights.layers
        self.output = weights.output
        self.graphs_on = graphs
        self.graphs: dict[tuple[int, bool], Any] = {}
        cupy = cupy_module()
        c, w = config, max_width
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
        self.cache = attention.KVCache(c.n_layer, n_ctx, c.n_head_kv, c.head_dim)
        self.attention_workspace = attention.AttentionWorkspace(
            max_rows=w, n_head=c.n_head, head_dim=c.head_dim
        )
        self.sample_workspace = sample.SampleWorkspace(max_rows=w, vocab=c.n_vocab)
        self.topk_max = self.sample_workspace.topk_max
        self.topk_val = cupy.zeros(w * self.topk_max, dtype=f32)  # [rows, k] for the k asked
        self.topk_idx = cupy.zeros(w * self.topk_max, dtype=cupy.int32)
        self._host_in = np.zeros(2 * w, dtype=np.int32)
        self._arange = np.arange(w, dtype=np.int32)

        # The GEMV inputs quantised for mmvq.cu: h (by the norms that write it), the attention output (a
        # launch of its own) and the gated activation (by the kernel that writes it).
        def quantized(width: int) -> mmvq.QuantizedRows | None:
            return mmvq.QuantizedRows(w, width) if gemv_kind == "fast" and width % mmvq.X_BLOCK == 0 else None

        self._qh, self._qattn, self._qgate = (quantized(k) for k in (c.n_embd, c.n_head * c.head_dim, c.n_ff))
        self.stream = cupy.cuda.Stream(non_blocking=True)
        # The uploads and zero fills above ran on the default stream; ours does not wait for it.
        cupy.cuda.Device().synchronize()

    def run(self, tokens: list[int], start: int, logits: bool) -> None:
        """Copy ids and positions in, then replay (or record) the pass of this width on our stream."""
        n = len(tokens)
        host = self._host_in
        host[:n] = tokens
        np.add(self._arange[:n], start, out=host[n : 2 * n])
        with self.stream:
            self.ids[:n].set(host[:n], stream=self.stream)
            self.pos[:n].set(host[n : 2 * n], stream=self.stream)
            key = (n, logits)
            graph = self.graphs.get(key)
            if graph is not None:
                graph.launch(self.stream)
                return
            # The first pass of a width runs the launches themselves (compiling what is new), then the
            # same launches are recorded for every later pass of that width.
            self.enqueue(n, logits)
            if self.graphs_on:
                self.stream.synchronize()
                self.stream.begin_capture()
                try:
                    self.enqueue(n, logits)
                finally:
                    self.graphs[key] = self.stream.end_capture()

    def top_k(self, first: int, rows: int, k: int) -> tuple[Any, Any]:
        """The k best logits of rows first.. of the last pass, taken on the current stream: values [rows, k]
        and ids [rows, k] on the device (views of buffers the next call overwrites)."""
        val, idx = self.topk_val[: rows * k].reshape(rows, k), self.topk_idx[: rows * k].reshape(rows, k)
        sample.top_k(self.logits[first : first + rows], k, val, idx, self.sample_workspace)
        return val, idx

    def enqueue(self, n: int, logits: bool) -> None:
        """One pass's launches over ids[:n] at positions pos[:n] on the current stream: KV stored, then logits
        (or nothing) for every row."""
        c, vec = self.config, self.vectors
        hd = c.head_dim
        ids, pos = self.ids[:n], self.pos[:n]
        x, h = self.x[:n], self.h[:n]
        q = self.q[:n].reshape(n, c.n_head, hd)
        attn = self.attn[:n]
        gate = self.gate[:n]
        factors = vec.get("rope_freqs.weight")
        gemv.get_rows(self.matrices["token_embd.weight"], ids, x)
        if c.embed_scale != 1.0:
            activation.scale(x, c.embed_scale, x)
        norm.rms_norm(x, vec["blk.0.attn_norm.weight"], h, c.rms_eps, q8=self._qh)
        for il, (attn_in, ffn_in) in enumerate(self.layers):
            p = f"blk.{il}"
            proj = self._project(h, attn_in)
            base, freq_scale = c.rope_for(il)
            qkv.qk_norm_rope_store(
                proj["attn_q"],
                proj["attn_k"],
                proj["attn_v"],
                pos,
                base,
                c.rope_neox,
                q,
                self.cache.k[il],
                self.cache.v[il],
                q_norm=vec[f"{p}.attn_q_norm.weight"] if c.qk_norm else None,
                k_norm=vec[f"{p}.attn_k_norm.weight"] if c.qk_norm else None,
                eps=c.rms_eps,
                freq_scale=freq_scale,
                n_rot=c.n_rot,
                freq_factors=factors,
            )
            if il + 1 == c.n_layer and not logits:
                break  # the rest of the last layer feeds only the logits; its K and V are stored
            window = c.sliding_window if c.swa_layers[il] else 0
            attention.attention(
                q,
                self.cache.k[il],
                self.cache.v[il],
                pos,
                c.attn_scale,
                attn.reshape(n, c.n_head, hd),
                self.attention_workspace,
                window,
            )
            post, ffn_norm = f"{p}.post_attention_norm.weight", f"{p}.ffn_norm.weight"
            self._sublayer_out(attn, f"{p}.attn_output", post, ffn_norm, n, self._qattn, False)
            ffn = self._project(h, ffn_in)
            act = activation.gelu_tanh_gate if c.gelu else activation.silu_gate
            act(ffn["ffn_gate"], ffn["ffn_up"], gate, q8=self._qgate)
            last = il + 1 == c.n_layer
            next_norm = "output_norm.weight" if last else f"blk.{il + 1}.attn_norm.weight"
            self._sublayer_out(
                gate, f"{p}.ffn_down", f"{p}.post_ffw_norm.weight", next_norm, n, self._qgate, True
            )
        if logits:
            self._matmul(h, self.output, self.logits[:n], None, False, self._qh, True)
            sample.argmax(self.logits[:n], self.best[:n], self.sample_workspace)

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
            gemv.matmul(x, weight, out, bias, accumulate)

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
        weight, bias = self.matrices[f"{name}.weight"], self.vectors.get(f"{name}.bias")
        if not c.post_norms:  # the residual add fused into the GEMV
            self._matmul(src, weight, x, bias, True, q_src, src_done)
            norm.rms_norm(x, self.vectors[next_norm], h, c.rms_eps, q8=self._qh)
            return
        o = self.o[:n]
        self._matmul(src, weight, o, bias, False, q_src, src_done)
        w_post, w_next = self.vectors[post_norm], self.vectors[next_norm]
        norm.rms_norm_add_rms_norm(o, w_post, x, w_next, h, c.rms_eps, q8=self._qh)

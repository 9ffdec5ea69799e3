"""A model's weights on the device as the native GEMVs read them: matrices, norm and bias vectors, the head.

Projections of one input (q, k, v; gate, up) whose weights share a type are stacked into one matrix, read by
one GEMV launch. With gemv="fast" a matrix of a type kernels.mmvq reads is packed for it (mmvq.PackedWeight),
any other stays GGUF blocks for gemv.cu (gemv.DeviceWeight); the token embedding always does (get_rows
reads it), and a tied output head is then packed once more beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.catalog.gguf import GGUFHeader
from app.engine.kernels import gemv, mmvq
from app.engine.kernels.hparams import ModelConfig
from app.engine.kernels.weights import ModelWeights

ATTN_IN = ("attn_q", "attn_k", "attn_v")
FFN_IN = ("ffn_gate", "ffn_up")
Matrix = gemv.DeviceWeight | mmvq.PackedWeight  # a GEMV weight: GGUF blocks (gemv.cu), packed (mmvq.cu)


@dataclass(frozen=True)
class Projection:
    """One GEMV of a layer: a matrix that holds the projections `roles` (`rows` each), rows stacked."""

    weight: Matrix
    bias: Any
    roles: tuple[str, ...]
    rows: tuple[int, ...]


class DeviceWeights:
    """Every tensor of the model uploaded: `matrices` by name (fused ones by their joined names), `vectors`
    (norms, biases), per layer its (attention input, FFN input) projections, the `output` head, `nbytes`."""

    def __init__(
        self, tensors: ModelWeights, header: GGUFHeader, config: ModelConfig, gemv_kind: str
    ) -> None:
        import cupy

        self.tensors, self.gemv_kind = tensors, gemv_kind
        c = config
        self.matrices: dict[str, Matrix] = {}
        self.vectors: dict[str, Any] = {}
        types = {t.name: t.type_id for t in header.tensors}
        projections = {f"blk.{il}.{role}" for il in range(c.n_layer) for role in (*ATTN_IN, *FFN_IN)}
        for t in header.tensors:
            if t.name.removesuffix(".weight").removesuffix(".bias") in projections:
                continue  # uploaded below, fused where they can be
            raw, ggml_type, shape = tensors.raw(t.name)
            if t.name == "token_embd.weight":  # get_rows reads GGUF blocks
                self.matrices[t.name] = gemv.DeviceWeight(raw, ggml_type, (shape[0], shape[1]), t.name)
            elif len(shape) == 2:
                self.matrices[t.name] = self._matrix(raw, ggml_type, (shape[0], shape[1]), t.name)
            else:
                self.vectors[t.name] = cupy.asarray(tensors.weight(t.name), dtype=cupy.float32)
        self.layers = [
            (self._projections(il, ATTN_IN, types), self._projections(il, FFN_IN, types))
            for il in range(c.n_layer)
        ]
        self.output = self.matrices["token_embd.weight" if c.tied_output else "output.weight"]
        if c.tied_output and gemv_kind == "fast" and mmvq.supported(self.output.ggml_type):
            raw, ggml_type, shape = tensors.raw("token_embd.weight")
            self.output = self.matrices["output"] = mmvq.PackedWeight(raw, ggml_type, shape, "output")
        self.nbytes = sum(w.nbytes for w in self.matrices.values()) + sum(
            int(v.nbytes) for v in self.vectors.values()
        )

    def _matrix(self, raw: Any, ggml_type: int, shape: tuple[int, int], name: str) -> Matrix:
        """A weight that GEMVs read: packed for mmvq.cu with gemv="fast" where its type allows."""
        if self.gemv_kind == "fast" and mmvq.supported(ggml_type):
            return mmvq.PackedWeight(raw, ggml_type, shape, name)
        return gemv.DeviceWeight(raw, ggml_type, shape, name)

    def _projections(self, il: int, roles: tuple[str, ...], types: dict[str, int]) -> list[Projection]:
        """The projections of one input (q, k, v; or gate, up) as few matrices as their weight types allow:
        a run of roles of one type becomes one matrix, its rows one after the other, read by one GEMV."""
        import cupy

        runs: list[list[str]] = []
        for role in roles:
            if runs and types[f"blk.{il}.{runs[-1][-1]}.weight"] == types[f"blk.{il}.{role}.weight"]:
                runs[-1].append(role)
            else:
                runs.append([role])
        out = []
        for run in runs:
            names = [f"blk.{il}.{role}" for role in run]
            raws = [self.tensors.raw(f"{name}.weight") for name in names]
            blocks = np.concatenate([np.asarray(r[0]) for r in raws]) if len(raws) > 1 else raws[0][0]
            rows = [shape[0] for _, _, shape in raws]
            label = "+".join(names)
            weight = self._matrix(blocks, raws[0][1], (sum(rows), raws[0][2][1]), label)
            self.matrices[label] = weight
            bias = None
            if any(f"{name}.bias" in types for name in names):
                parts = [
                    self.tensors.weight(f"{name}.bias")
                    if f"{name}.bias" in types
                    else np.zeros(r, np.float32)
                    for name, r in zip(names, rows, strict=True)
                ]
                bias = self.vectors[f"{label}.bias"] = cupy.asarray(np.concatenate(parts), np.float32)
            out.append(Projection(weight, bias, tuple(run), tuple(rows)))
        return out

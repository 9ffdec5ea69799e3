"""The memory model: bytes a target/drafter pair needs on a device (weights, KV cache, mmproj, margin)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.catalog import gguf

GIB = 1 << 30
MARGIN_FRACTION = 0.10
MARGIN_MIN = 2 * GIB
MARGIN_MAX = 4 * GIB
KV_BYTES_PER_ELEMENT = 2  # f16 K and V, llama.cpp's default cache type


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about one GGUF model."""

    weight_bytes: int
    n_layer: int
    n_head_kv: int
    key_length: int
    value_length: int
    context_length: int = 0  # the model's trained maximum; 0 when unknown

    @property
    def kv_bytes_per_token(self) -> int:
        return self.n_layer * self.n_head_kv * (self.key_length + self.value_length) * KV_BYTES_PER_ELEMENT

    def kv_bytes(self, n_ctx: int) -> int:
        return self.kv_bytes_per_token * n_ctx


def shape_from_header(header: gguf.GGUFHeader) -> ModelShape:
    """A ModelShape from a GGUF header.

    Approximations (they overestimate, which is the safe side): per-layer KV head counts are taken at
    their maximum, and sliding-window layers (Gemma 2/3) are counted as if they cached the whole context.
    """
    n_layer = int(header.get("{arch}.block_count", 0))
    n_embd = int(header.get("{arch}.embedding_length", 0))
    n_head = header.get("{arch}.attention.head_count", 1)
    n_head = int(max(n_head) if isinstance(n_head, list) else n_head) or 1
    n_head_kv = header.get("{arch}.attention.head_count_kv", n_head)
    n_head_kv = int(max(n_head_kv) if isinstance(n_head_kv, list) else n_head_kv)
    return ModelShape(
        weight_bytes=header.tensor_bytes,
        n_layer=n_layer,
        n_head_kv=n_head_kv,
        key_length=int(header.get("{arch}.attention.key_length", n_embd // n_head)),
        value_length=int(header.get("{arch}.attention.value_length", n_embd // n_head)),
        context_length=int(header.get("{arch}.context_length", 0)),
    )


def read_shape(path: str | Path) -> ModelShape:
    """Read a GGUF file's header (never its weights) into a ModelShape; raises GGUFError/FileNotFoundError."""
    return shape_from_header(gguf.read_file(path))


def margin(total: int) -> int:
    """Headroom for compute buffers and fragmentation: 10% of the need, clamped to 2-4 GiB."""
    return min(MARGIN_MAX, max(MARGIN_MIN, int(total * MARGIN_FRACTION)))


@dataclass(frozen=True)
class PairNeed:
    """Bytes a target (and optional drafter and mmproj) need at one context length."""

    target: ModelShape
    drafter: ModelShape | None = None
    mmproj_bytes: int = 0

    def target_bytes(self, n_ctx: int) -> int:
        return self.target.weight_bytes + self.target.kv_bytes(n_ctx) + self.mmproj_bytes

    def drafter_bytes(self, n_ctx: int) -> int:
        if self.drafter is None:
            return 0
        return self.drafter.weight_bytes + self.drafter.kv_bytes(n_ctx)

    def with_margin(self, n_bytes: int) -> int:
        return n_bytes + margin(n_bytes)

    def total(self, n_ctx: int) -> int:
        """Everything on one device, margin included."""
        return self.with_margin(self.target_bytes(n_ctx) + self.drafter_bytes(n_ctx))

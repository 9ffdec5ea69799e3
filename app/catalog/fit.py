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
# bytes per cached element for llama.cpp's KV cache types (block size accounted)
KV_TYPES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32, "q4_1": 20 / 32, "q4_0": 18 / 32,
}  # fmt: skip
CONTEXT_TIERS = (131072, 65536, 32768, 16384, 8192, 4096, 2048)


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

    def kv_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        per_element = KV_TYPES[kv_type] / KV_BYTES_PER_ELEMENT
        return int(self.kv_bytes_per_token * n_ctx * per_element)


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
    kv_type: str = "f16"

    def __post_init__(self) -> None:
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {self.kv_type!r}: use one of {', '.join(KV_TYPES)}")

    def target_bytes(self, n_ctx: int) -> int:
        return self.target.weight_bytes + self.target.kv_bytes(n_ctx, self.kv_type) + self.mmproj_bytes

    def drafter_bytes(self, n_ctx: int) -> int:
        if self.drafter is None:
            return 0
        return self.drafter.weight_bytes + self.drafter.kv_bytes(n_ctx, self.kv_type)

    def with_margin(self, n_bytes: int) -> int:
        return n_bytes + margin(n_bytes)

    def total(self, n_ctx: int) -> int:
        """Everything on one device, margin included."""
        return self.with_margin(self.target_bytes(n_ctx) + self.drafter_bytes(n_ctx))


@dataclass(frozen=True)
class DeviceFit:
    """Whether a pair fits one device's free memory, and the largest context tier that does."""

    device: str
    free_bytes: int
    need_bytes: int  # at the asked context, margin included
    n_ctx: int
    largest_ctx: int  # 0: not even the smallest tier fits

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.free_bytes

    def summary(self) -> str:
        head = f"{self.device}: needs {self.need_bytes / GIB:.1f} GiB at {self.n_ctx:,} tokens, "
        head += f"{self.free_bytes / GIB:.1f} GiB free"
        if self.largest_ctx:
            return head + f"; fits up to {self.largest_ctx:,} tokens"
        return head + "; does not fit even at the smallest context"


def context_tiers(need: PairNeed) -> list[int]:
    """The context tiers up to the target's trained context, largest first."""
    limit = need.target.context_length or CONTEXT_TIERS[0]
    return [c for c in CONTEXT_TIERS if c <= limit] or [limit]


def fit_on(need: PairNeed, device: str, free_bytes: int, n_ctx: int) -> DeviceFit:
    """The pair (target, drafter, mmproj, KV for both at n_ctx, margin) on one device."""
    largest = next((c for c in context_tiers(need) if need.total(c) <= free_bytes), 0)
    return DeviceFit(device, free_bytes, need.total(n_ctx), n_ctx, largest)

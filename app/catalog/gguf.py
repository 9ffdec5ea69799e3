"""GGUF header reading: metadata and tensor table from any seekable byte source, never the weights."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip

# GGUF value type id -> struct format (scalars only); 8 = string, 9 = array
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# Sanity bounds: a corrupt count must fail cleanly, not allocate gigabytes.
_MAX_COUNT = 1 << 26
_MAX_STRING = 1 << 26


class GGUFError(ValueError):
    """The bytes are not a readable GGUF file (wrong magic, unsupported version, truncated, corrupt)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, (f"type{self.type_id}", 1, 0))[0]

    @property
    def n_bytes(self) -> int:
        if self.type_id not in GGML_TYPES:
            raise GGUFError(f"tensor {self.name!r} has unknown ggml type {self.type_id}")
        _, block, size = GGML_TYPES[self.type_id]
        n = 1
        for d in self.shape:
            n *= d
        if self.shape and self.shape[0] % block:
            raise GGUFError(f"tensor {self.name!r}: row of {self.shape[0]} is not a multiple of {block}")
        return n // block * size


@dataclass
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_offset: int
    file_size: int | None = None
    array_lengths: dict[str, int] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name", ""))

    @property
    def chat_template(self) -> str | None:
        value = self.metadata.get("tokenizer.chat_template")
        return value if isinstance(value, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        """Metadata lookup with the architecture prefix filled in: get("{arch}.context_length")."""
        return self.metadata.get(key.replace("{arch}", self.architecture), default)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def quant_types(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        return counts

    def check_complete(self) -> None:
        """Raise GGUFError when the file is shorter than its tensor table says."""
        if self.file_size is None:
            return
        end = max((self.data_offset + t.offset + t.n_bytes for t in self.tensors), default=self.data_offset)
        if end > self.file_size:
            raise GGUFError(
                f"truncated: the tensor data ends at byte {end:,} but the file has {self.file_size:,} bytes"
            )


class _Reader:
    """Sequential reads over a binary stream with a read-ahead buffer that doubles on each refill.

    Doubling keeps remote reads (one HTTP Range request per refill) few, and small files cheap.
    """

    def __init__(self, stream: BinaryIO, chunk: int = 1 << 20, max_chunk: int = 8 << 20) -> None:
        self._stream = stream
        self._chunk = chunk
        self._max_chunk = max(chunk, max_chunk)
        self._buf = b""
        self._pos = 0  # position of _buf[0] in the stream
        self._off = 0  # read position inside _buf

    @property
    def tell(self) -> int:
        return self._pos + self._off

    def read(self, n: int) -> bytes:
        if self._off + n > len(self._buf):
            rest = self._buf[self._off :]
            more = self._stream.read(max(self._chunk, n - len(rest)))
            self._chunk = min(self._chunk * 2, self._max_chunk)
            self._pos += self._off
            self._buf, self._off = rest + more, 0
            if n > len(self._buf):
                raise GGUFError(f"truncated: header ends at byte {self._pos + len(self._buf):,}")
        out = self._buf[self._off : self._off + n]
        self._off += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.unpack("<Q")
        if n > _MAX_STRING:
            raise GGUFError(f"corrupt: string of {n:,} bytes at byte {self.tell:,}")
        return self.read(n).decode("utf-8", errors="replace")


def _value(r: _Reader, vtype: int, key: str, lengths: dict[str, int]) -> Any:
    if vtype in _SCALARS:
        return r.unpack(_SCALARS[vtype])
    if vtype == _STRING:
        return r.string()
    if vtype == _ARRAY:
        etype, count = r.unpack("<I"), r.unpack("<Q")
        if count > _MAX_COUNT:
            raise GGUFError(f"corrupt: array {key!r} claims {count:,} items")
        lengths[key] = count
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            size = struct.calcsize(fmt)
            raw = r.read(size * count)
            return list(struct.unpack(f"<{count}{fmt[1]}", raw)) if count else []
        if etype == _STRING:
            return [r.string() for _ in range(count)]
        if etype == _ARRAY:
            return [_value(r, _ARRAY, key, {}) for _ in range(count)]
        raise GGUFError(f"corrupt: array {key!r} has unknown item type {etype}")
    raise GGUFError(f"corrupt: key {key!r} has unknown value type {vtype}")


def read_header(stream: BinaryIO, file_size: int | None = None, first_read: int = 1 << 20) -> GGUFHeader:
    """Parse a GGUF header from a stream positioned at the file start (reads only the header's bytes,
    rounded up to the read-ahead)."""
    r = _Reader(stream, first_read)
    try:
        magic = r.read(4)
    except GGUFError:
        raise GGUFError("not a GGUF file: shorter than its magic number") from None
    if magic != MAGIC:
        raise GGUFError(f"not a GGUF file: starts with {magic!r}, expected {MAGIC!r}")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise GGUFError(f"unsupported GGUF version {version}")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
        raise GGUFError(f"corrupt: {n_tensors:,} tensors and {n_kv:,} metadata keys")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = _value(r, r.unpack("<I"), key, lengths)
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("<I")
        if n_dims > 8:
            raise GGUFError(f"corrupt: tensor {name!r} has {n_dims} dimensions")
        shape = tuple(r.unpack("<Q") for _ in range(n_dims))
        tensors.append(TensorInfo(name, shape, r.unpack("<I"), r.unpack("<Q")))
    align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_offset = (r.tell + align - 1) // align * align
    return GGUFHeader(version, metadata, tensors, data_offset, file_size, lengths)


def read_file(path: str | Path) -> GGUFHeader:
    """Read and check the header of a local GGUF file; raise FileNotFoundError or GGUFError."""
    path = Path(path)
    if path.is_dir():
        raise GGUFError(f"{path} is a folder, not a model file")
    if not path.exists():
        raise FileNotFoundError(f"no such model file: {path}")
    with path.open("rb") as stream:
        header = read_header(stream, path.stat().st_size)
    header.check_complete()
    return header

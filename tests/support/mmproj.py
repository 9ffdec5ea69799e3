"""A tiny random-weight gemma3-type vision projector (mmproj GGUF) for any text model, and test images.

The layout is the SigLIP-shaped one llama.cpp's clip loader reads for projector type gemma3 (as
globalmm's build_mmproj writes it): one 56x56 input of 14-pixel patches (4x4) pooled 2x2, so every
image is 4 tokens in the language model, whatever its size.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import gguf
import numpy as np

IMAGE_SIZE, PATCH, POOL = 56, 14, 2
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH // POOL) ** 2  # 4


def write_tiny_mmproj(out: Path, n_embd: int, seed: int = 0, projection_scale: float = 1.0) -> Path:
    """Write the projector; n_embd must be the text model's embedding width (640: gemma-3-270m).

    Small random weights everywhere but the last projection, whose scale sets how loud the image's
    embeddings are next to the text's: at 0.02 the model hardly notices them.
    """
    width = 64
    rng = np.random.default_rng(seed)
    patch = (rng.standard_normal((width, 3, PATCH, PATCH)) * 0.02).astype(np.float32)
    projection = (rng.standard_normal((width, n_embd)) * projection_scale).astype(np.float32)
    return _write(out, n_embd, width, patch, projection, rng=rng)


def _write(
    out: Path,
    n_embd: int,
    width: int,
    patch: np.ndarray,
    projection: np.ndarray,
    rng: np.random.Generator | None = None,
    zero_block: bool = False,
) -> Path:
    """The projector file: `patch` and `projection` as given; the rest small random weights (`rng`),
    or, with `zero_block`, a transformer block that adds nothing to its input."""
    ffn, layers, heads = 128, 1, 4

    def rand(*shape: int) -> np.ndarray:
        if zero_block or rng is None:
            return np.zeros(shape, np.float32)
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(str(out), "clip")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", False)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_uint32("clip.vision.embedding_length", width)
    w.add_uint32("clip.vision.feed_forward_length", ffn)
    w.add_uint32("clip.vision.projection_dim", n_embd)
    w.add_uint32("clip.vision.block_count", layers)
    w.add_uint32("clip.vision.attention.head_count", heads)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.projector.scale_factor", POOL)
    w.add_tensor("v.patch_embd.weight", patch)
    w.add_tensor("v.patch_embd.bias", rand(width))
    w.add_tensor("v.position_embd.weight", rand((IMAGE_SIZE // PATCH) ** 2, width))
    ones, zeros = np.ones(width, np.float32), np.zeros(width, np.float32)
    for i in range(layers):
        for norm in ("ln1", "ln2"):
            w.add_tensor(f"v.blk.{i}.{norm}.weight", ones)
            w.add_tensor(f"v.blk.{i}.{norm}.bias", zeros)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"v.blk.{i}.{name}.weight", rand(width, width))
            w.add_tensor(f"v.blk.{i}.{name}.bias", rand(width))
        w.add_tensor(f"v.blk.{i}.ffn_up.weight", rand(ffn, width))
        w.add_tensor(f"v.blk.{i}.ffn_up.bias", rand(ffn))
        w.add_tensor(f"v.blk.{i}.ffn_down.weight", rand(width, ffn))
        w.add_tensor(f"v.blk.{i}.ffn_down.bias", rand(width))
    w.add_tensor("v.post_ln.weight", ones)
    w.add_tensor("v.post_ln.bias", zeros)
    w.add_tensor("mm.input_projection.weight", projection)
    w.add_tensor("mm.soft_emb_norm.weight", ones)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _token_rows(text_model: Path, words: list[str]) -> np.ndarray:
    """The text model's input embeddings of `words` (each one token, with its leading space)."""
    reader = gguf.GGUFReader(str(text_model))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
    ids = []
    for word in words:
        for spelled in ("\u0120" + word, "\u2581" + word):  # GPT-2 style and SentencePiece style space
            if spelled in tokens:
                ids.append(tokens.index(spelled))
                break
        else:
            raise ValueError(f"{word!r} is not one token of {text_model.name}")
    table = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = gguf.quants.dequantize(table.data, table.tensor_type)
    return np.asarray(rows[ids], dtype=np.float32)


def colour_code(rgb: tuple[int, int, int]) -> np.ndarray:
    """What the colour projector's vision tower makes of a solid `rgb` image, after its norms."""
    x = np.zeros(64, np.float32)
    for c, value in enumerate(rgb):
        m = (value / 255 - 0.5) / 0.5  # the projector's image_mean and image_std
        x[2 * c], x[2 * c + 1] = m, -m
    return x / np.sqrt(np.mean(x * x))


def write_colour_mmproj(
    out: Path, text_model: Path, colours: dict[str, tuple[int, int, int]], embedding_scale: float = 1.0
) -> Path:
    """A projector built, not trained, so that a solid-colour image reads as that colour's word.

    The vision tower passes each channel's mean through as a pair (+m, -m) (zero mean, so its layer
    norms keep the direction): the patch embedding averages each channel, the transformer block adds
    nothing (its output projections are zero), and the pooling averages the patches. The last
    projection is solved by least squares so that each colour's code lands on the text model's own
    embedding of its name (times `embedding_scale`: Gemma scales text embeddings by sqrt(n_embd) on
    input, and image embeddings go in as they are).
    """
    width = 64
    targets = _token_rows(text_model, list(colours)) * embedding_scale
    codes = np.stack([colour_code(rgb) for rgb in colours.values()])
    projection = np.linalg.lstsq(codes, targets, rcond=None)[0].astype(np.float32)  # (width, n_embd)
    patch = np.zeros((width, 3, PATCH, PATCH), np.float32)
    for c in range(3):
        patch[2 * c, c] = 1 / PATCH**2
        patch[2 * c + 1, c] = -1 / PATCH**2
    return _write(out, targets.shape[1], width, patch, projection, zero_block=True)


def png(width: int, height: int, pixel: tuple[int, int, int] | None = None) -> bytes:
    """An RGB PNG: one colour, or (pixel None) a gradient."""

    def row(y: int) -> bytes:
        if pixel is not None:
            return b"\x00" + bytes(pixel) * width
        return b"\x00" + b"".join(bytes((x * 255 // width, y * 255 // height, 128)) for x in range(width))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    raw = b"".join(row(y) for y in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height, with no pixel data after it (a bomb's header)."""
    return png(1, 1)[:16] + struct.pack(">II", width, height) + png(1, 1)[24:33]


def jpeg_header_only(width: int, height: int) -> bytes:
    """A JPEG start with a baseline frame header claiming width x height, and nothing decodable after."""
    frame = struct.pack(">BHHB", 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", len(frame) + 2) + frame

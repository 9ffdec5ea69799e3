"""Images in prompts: the target's projector (libmtmd), OpenAI image parts checked and decoded, their KV."""

from __future__ import annotations

# llama_cpp comes before NumPy: the other order was seen to segfault with a CUDA build.
import llama_cpp  # isort: skip
import llama_cpp.mtmd_cpp as mtmd  # isort: skip

import base64
import binascii
import ctypes
import re
import struct
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.backends.llama import LlamaBackend
from app.engine.errors import DecodeError, InvalidRequest, ModelLoadError

IMAGE_POSITION = -1  # the token id kept for a position an image fills: never a real token, never reused
IMAGE_PART_TYPES = ("image_url", "input_image")


class ImageError(InvalidRequest):
    """An image part that cannot be used; `param` names it (messages[i].content[j])."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class NoVision(InvalidRequest):
    code = "model_has_no_vision"

    def __init__(self, param: str) -> None:
        super().__init__(
            "the loaded model has no vision: it cannot read images (load it with its vision projector, "
            "or ask without the image)"
        )
        self.param = param


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    max_images: int
    allow_remote: bool = False


# --- image parts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImagePart:
    param: str  # messages[i].content[j]
    data: bytes
    kind: str  # png | jpeg | gif | bmp
    width: int
    height: int


_DATA_URI = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*?);base64,", re.IGNORECASE)


def image_parts(messages: Sequence[Mapping[str, Any]]) -> list[tuple[int, int, Mapping[str, Any]]]:
    """(message index, part index, part) of every image part, in prompt order."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            out += [
                (i, j, part)
                for j, part in enumerate(content)
                if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES
            ]
    return out


def _url_of(part: Mapping[str, Any]) -> Any:
    url = part.get("image_url")
    if isinstance(url, Mapping):  # chat completions: {"image_url": {"url": ...}}; responses: a string
        url = url.get("url")
    return url


def read_image_part(part: Mapping[str, Any], param: str, limits: ImageLimits) -> ImagePart:
    """The part's image bytes, checked from the header before anything decodes them (size, format, pixels)."""
    url = _url_of(part)
    if not isinstance(url, str) or not url:
        raise ImageError("an image part needs image_url.url (a data: URI)", param)
    if url.lower().startswith(("http://", "https://")):
        if not limits.allow_remote:
            raise ImageError("image URLs are not fetched: send the image inline as a data: URI", param)
        raise ImageError("fetching image URLs is not supported yet: send a data: URI", param)
    match = _DATA_URI.match(url)
    if match is None:
        raise ImageError("the image must be a base64 data: URI (data:image/png;base64,...)", param)
    encoded = url[match.end() :]
    if len(encoded) * 3 // 4 > limits.max_bytes + 2:
        raise ImageError(f"the image is over the limit of {limits.max_bytes} bytes", param)
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data: URI is not valid base64", param) from None
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image is over the limit of {limits.max_bytes} bytes", param)
    kind, width, height = image_header(data, param)
    if width <= 0 or height <= 0:
        raise ImageError(f"the {kind} header gives an empty image ({width}x{height})", param)
    if width * height > limits.max_pixels:
        raise ImageError(
            f"the image is {width}x{height} pixels, over the limit of {limits.max_pixels} pixels", param
        )
    return ImagePart(param, data, kind, width, height)


def image_header(data: bytes, param: str) -> tuple[str, int, int]:
    """(format, width, height) from the file header; formats libmtmd (stb_image) cannot decode are refused."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ImageError("the PNG is truncated (no IHDR header)", param)
        width, height = struct.unpack(">II", data[16:24])
        return "png", width, height
    if data.startswith(b"\xff\xd8"):
        return ("jpeg", *_jpeg_size(data, param))
    if data[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 10:
            raise ImageError("the GIF is truncated", param)
        return ("gif", *struct.unpack("<HH", data[6:10]))
    if data.startswith(b"BM"):
        if len(data) < 26:
            raise ImageError("the BMP is truncated", param)
        width, height = struct.unpack("<ii", data[18:26])
        return "bmp", abs(width), abs(height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise ImageError("WebP images are not supported: send PNG or JPEG", param)
    if data[4:12] in (b"ftypheic", b"ftypheix", b"ftypavif", b"ftypmif1"):
        raise ImageError("HEIC/AVIF images are not supported: send PNG or JPEG", param)
    raise ImageError("not an image, or an unsupported format (PNG, JPEG, GIF and BMP are read)", param)


_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes, param: str) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise ImageError("the JPEG is corrupt (no marker where one belongs)", param)
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        if marker == 0xDA or length < 2:  # scan data before any frame header
            break
        at += 2 + length
    raise ImageError("the JPEG is truncated or has no frame header", param)


# --- the projector ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """A stretch of the prompt's positions: text tokens, or one image's embeddings (evaluated by libmtmd)."""

    start: int
    end: int
    chunk: int | None  # the image chunk (mtmd_input_chunk pointer); None for text


class MediaPrompt:
    """A tokenized prompt with images: its positions (IMAGE_POSITION where images sit) and their chunks."""

    def __init__(self, vision: Vision, chunks: Any, tokens: list[int], segments: list[Segment]) -> None:
        self.vision = vision
        self.tokens = tokens
        self.segments = segments
        self.images = sum(1 for s in segments if s.chunk is not None)
        self.image_tokens = sum(s.end - s.start for s in segments if s.chunk is not None)
        self._free = weakref.finalize(self, mtmd.mtmd_input_chunks_free, chunks)

    @property
    def first_image(self) -> int:
        return next(s.start for s in self.segments if s.chunk is not None)

    def prefill(self, target: LlamaBackend, reuse: int) -> None:
        """Put positions [reuse, len(tokens) - 1) in the target's KV: the last token is left to the caller,
        whose decode gives the first reply token. The KV must hold exactly tokens[:reuse] on entry."""
        end = len(self.tokens) - 1
        for seg in self.segments:
            start, stop = max(seg.start, reuse), min(seg.end, end)
            if start >= stop:
                continue
            if seg.chunk is None:
                target.decode(self.tokens[start:stop], stop - start - 1)
            else:
                self.vision.evaluate(target, seg.chunk, seg.end - seg.start)

    def close(self) -> None:
        self._free()


class Vision:
    """A vision projector (mmproj GGUF) loaded through libmtmd against the target's llama model."""

    def __init__(self, path: str | Path, target: LlamaBackend) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"no such projector file: {self.path}")
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = target.facts.device == "gpu"
        params.n_threads = target.n_threads
        params.print_timings = False
        params.warmup = False
        ctx = mtmd.mtmd_init_from_file(str(self.path).encode(), target.llama_model, params)
        if not ctx:
            raise ModelLoadError(
                f"{self.path.name} is not a vision projector for {target.path.name} (libmtmd refused it: "
                "a different model's projector, or not an mmproj file)"
            )
        self._ctx = ctx
        self._free = weakref.finalize(self, mtmd.mtmd_free, ctx)
        if not mtmd.mtmd_support_vision(ctx):
            self.close()
            raise ModelLoadError(f"{self.path.name} has no vision encoder (an audio-only projector?)")
        if mtmd.mtmd_decode_use_mrope(ctx):
            # M-RoPE (Qwen2-VL family) gives each token several positions; the backend's decode places
            # text at one position per token, so text after an image would sit at the wrong positions.
            self.close()
            raise ModelLoadError(f"{self.path.name} needs M-RoPE positions, which this engine lacks yet")
        self.marker = mtmd.mtmd_default_marker().decode()
        self.target = target

    def tokenize(self, text: str, images: Sequence[ImagePart]) -> MediaPrompt:
        """The prompt text with one marker per image, tokenized by libmtmd (images decoded here)."""
        bitmaps = []
        try:
            for image in images:
                buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
                bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(image.data), False)
                if not bitmap:
                    raise ImageError(
                        f"the {image.kind} image cannot be decoded (truncated or corrupt)", image.param
                    )
                bitmaps.append(bitmap)
            raw = text.encode("utf-8")
            piece = mtmd.mtmd_input_text()
            piece.text, piece.text_len, piece.add_special, piece.parse_special = raw, len(raw), True, True
            chunks = mtmd.mtmd_input_chunks_init()
            array = (mtmd.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
            rc = mtmd.mtmd_tokenize(self._ctx, chunks, ctypes.byref(piece), array, len(bitmaps))
            if rc != 0:
                mtmd.mtmd_input_chunks_free(chunks)
                # 1: markers and images disagree (the text itself held the marker); 2: preprocessing failed
                reason = "the text holds an image marker of its own" if rc == 1 else f"libmtmd code {rc}"
                raise InvalidRequest(f"the images could not be placed in the prompt ({reason})")
            return self._read_chunks(chunks)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _read_chunks(self, chunks: Any) -> MediaPrompt:
        tokens: list[int] = []
        segments: list[Segment] = []
        n_text = ctypes.c_size_t(0)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            start = len(tokens)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n_text))
                tokens += ptr[: n_text.value]
                segments.append(Segment(start, len(tokens), None))
            elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                tokens += [IMAGE_POSITION] * int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
                segments.append(Segment(start, len(tokens), chunk))
            else:
                mtmd.mtmd_input_chunks_free(chunks)
                raise InvalidRequest("only images are read (this projector gave another kind of input)")
        return MediaPrompt(self, chunks, tokens, segments)

    def evaluate(self, target: LlamaBackend, chunk: Any, n_positions: int) -> None:
        """Encode one image chunk and decode its embeddings into the target's KV at the next positions."""

        def run(lctx: Any, n_past: int, seq: int) -> int:
            new_n_past = llama_cpp.llama_pos(0)
            rc = mtmd.mtmd_helper_eval_chunk_single(
                self._ctx, lctx, chunk, n_past, seq, target.n_batch, False, ctypes.byref(new_n_past)
            )
            if rc != 0:  # the server's trouble (memory, batch size), not the request's
                raise DecodeError(f"libmtmd could not evaluate the image (code {rc})")
            return int(new_n_past.value)

        target.decode_external(n_positions, IMAGE_POSITION, run)

    def info(self) -> dict[str, Any]:
        return {"path": str(self.path), "marker": self.marker}

    def close(self) -> None:
        self._free()

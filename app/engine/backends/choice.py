"""The backend `auto` runs a model on: both timed on the model's own shapes, chosen by a pure rule over the
timings (`decide`), the timings cached by the file's SHA-256, the device and the settings.

The choice is per model, not per request. Sending a long prompt's prefill to llama.cpp and the decoding to
our kernels would need both to hold the weights and a KV cache handed from one to the other between two
passes; instead one typical request is weighed (a long prompt, then decoding passes: plain steps, or
verify passes of k + 1 tokens when drafting), and the backend that serves it sooner serves them all.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.catalog.digests import sha256_of
from app.engine.backends.base import Backend
from app.engine.errors import ModelLoadError

log = logging.getLogger("foresight.choice")

# The request weighed: a coding or chat prompt of this many tokens, then this many decoding passes.
PROMPT_TOKENS = 512
DECODE_PASSES = 256
CACHE_VERSION = "v1"
# the text timed passes read (code, as the weighed request's prompt; verify-cost calibration reads it too)
FILLER = b"def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"


@dataclass(frozen=True)
class Timings:
    """Seconds of one backend's passes on one model: medians, each after untimed passes of its shape."""

    prefill_s: float  # a prompt of prompt_tokens tokens, in one call
    prompt_tokens: int
    step_s: float  # one token after that prompt
    verify_s: float  # `width` tokens in one pass after that prompt (width 1: a step)
    width: int

    def request_s(self, drafting: bool) -> float:
        """The weighed request: PROMPT_TOKENS of prefill, then DECODE_PASSES passes."""
        pass_s = self.verify_s if drafting else self.step_s
        return self.prefill_s / self.prompt_tokens * PROMPT_TOKENS + DECODE_PASSES * pass_s

    def as_ms(self) -> dict[str, Any]:
        return {
            "prefill_ms_per_token": round(self.prefill_s / self.prompt_tokens * 1e3, 4),
            "step_ms": round(self.step_s * 1e3, 4),
            "verify_ms": round(self.verify_s * 1e3, 4),
            "width": self.width,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timings:
        return cls(
            prefill_s=float(data["prefill_s"]),
            prompt_tokens=int(data["prompt_tokens"]),
            step_s=float(data["step_s"]),
            verify_s=float(data["verify_s"]),
            width=int(data["width"]),
        )


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "native" (our kernels) or "llama" (llama.cpp)
    reason: str
    native: Timings | None
    llama: Timings | None
    speedup: float | None  # llama.cpp's request time over ours: > 1 where our kernels are faster
    cached: bool = False  # the timings came from the cache (measured at an earlier load)

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "native_speedup": self.speedup,
            "cached": self.cached,
            "native": self.native.as_ms() if self.native else None,
            "llama": self.llama.as_ms() if self.llama else None,
            "weighed": {"prompt_tokens": PROMPT_TOKENS, "decode_passes": DECODE_PASSES},
        }


def _faster(ours: float, theirs: float) -> str:
    return "on our kernels" if ours < theirs else "on llama.cpp"


def decide(native: Timings, llama: Timings, drafting: bool) -> BackendChoice:
    """Our kernels where they serve the weighed request sooner than llama.cpp, else llama.cpp (a tie too)."""
    ours, theirs = native.request_s(drafting), llama.request_s(drafting)
    speedup = round(theirs / ours, 3)
    passes = f"{DECODE_PASSES} verify passes of {native.width}" if drafting else f"{DECODE_PASSES} steps"
    n, ll = native.as_ms(), llama.as_ms()
    parts = [f"prefill {n['prefill_ms_per_token']} vs {ll['prefill_ms_per_token']} ms/token"]
    parts.append(f"step {n['step_ms']} vs {ll['step_ms']} ms")
    if drafting:
        parts.append(f"verify of {native.width} {n['verify_ms']} vs {ll['verify_ms']} ms")
    decode_pass = (native.verify_s, llama.verify_s) if drafting else (native.step_s, llama.step_s)
    split = ""
    prefill_on, decode_on = _faster(native.prefill_s, llama.prefill_s), _faster(*decode_pass)
    if prefill_on != decode_on:
        split = f"; decoding is faster {decode_on}, prefill {prefill_on}"
    weighed = (
        f"a {PROMPT_TOKENS}-token prompt and {passes} take {ours * 1e3:.0f} ms on our kernels, "
        f"{theirs * 1e3:.0f} ms on llama.cpp ({', '.join(parts)}){split}; chosen per model"
    )
    if ours < theirs:
        reason = f"our kernels, {speedup:.2f}x llama.cpp's speed here: {weighed}"
        return BackendChoice("native", reason, native, llama, speedup)
    reason = f"llama.cpp: our kernels reach {speedup:.2f}x its speed here: {weighed}"
    return BackendChoice("llama", reason, native, llama, speedup)


def measure(model: Backend, width: int, prompt_tokens: int = PROMPT_TOKENS, repeats: int = 7) -> Timings:
    """Time `model`'s prefill of a prompt, a step and a verify pass of `width` tokens after it."""
    filler = model.tokenize(FILLER, True, False)
    n = max(1, min(prompt_tokens, model.n_ctx - width - 8))
    prompt = (filler * (n // len(filler) + 1))[:n]

    def timed(tokens: list[int], keep: int, logits_from: int) -> float:
        model.rollback(keep)
        t0 = time.perf_counter()
        model.decode_argmax(tokens, logits_from)
        return time.perf_counter() - t0

    def median_of(tokens: list[int], keep: int, logits_from: int, count: int) -> float:
        for _ in range(2):  # the first passes of a shape build (or capture) it
            timed(tokens, keep, logits_from)
        return statistics.median(timed(tokens, keep, logits_from) for _ in range(count))

    try:
        prefill = median_of(prompt, 0, n - 1, max(1, repeats // 2))
        model.rollback(0)
        model.decode_argmax(prompt, n - 1)
        step = median_of(prompt[-1:], n, 0, repeats)
        verify = median_of(prompt[:width], n, 0, repeats) if width > 1 else step
    finally:
        model.rollback(0)
    return Timings(prefill, n, step, verify, width)


def default_cache() -> Path:
    return paths.cache_dir() / "backend-timings.json"


def _cache_read(cache: Path, key: str) -> tuple[Timings, Timings] | None:
    try:
        entry = json.loads(cache.read_text()).get(key)
        if entry:
            return Timings.from_dict(entry["native"]), Timings.from_dict(entry["llama"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring unreadable backend timings %s", cache)
    return None


def _cache_write(cache: Path, key: str, native: Timings, llama: Timings) -> None:
    try:
        data = json.loads(cache.read_text()) if cache.exists() else {}
    except (OSError, ValueError):
        data = {}
    data[key] = {"native": asdict(native), "llama": asdict(llama)}
    try:
        paths.write_atomic(cache, json.dumps(data, indent=1, sort_keys=True))
    except OSError as exc:
        log.warning("could not keep the backend timings in %s: %s", cache, exc)


def cache_key(path: Path, device: str, width: int, settings: str, prompt_tokens: int = PROMPT_TOKENS) -> str:
    """The model file by content (SHA-256, cached per file version), where it runs, and what is timed."""
    return f"{CACHE_VERSION}:{sha256_of(path)}:{device}:w{width}:p{prompt_tokens}:{settings}"


def cached_choice(cache: Path, key: str, drafting: bool) -> BackendChoice | None:
    """The decision over timings measured at an earlier load (None: not measured yet)."""
    found = _cache_read(cache, key)
    if found is None:
        return None
    choice = decide(*found, drafting)
    return BackendChoice(choice.backend, choice.reason, choice.native, choice.llama, choice.speedup, True)


def choose_backend(
    native: Backend,
    load_native: Callable[[], Backend],
    load_llama: Callable[[], Backend],
    *,
    width: int,
    settings: str,
    cache: Path | None = None,
    prompt_tokens: int = PROMPT_TOKENS,
    repeats: int = 7,
) -> tuple[Backend, BackendChoice]:
    """The faster of our kernels (`native`, loaded) and llama.cpp on this model, loaded, and the choice.

    Timed once per model file, device, width and settings; afterwards the cached timings decide and the
    other backend is not loaded at all. The two are never loaded together: each is timed alone, so a model
    that fits the GPU once is compared too; the winner is loaded again where it was closed for the other.
    """
    cache = cache or default_cache()
    drafting = width > 1
    key = cache_key(native.path, native.device_reason, width, settings, prompt_tokens)
    choice = cached_choice(cache, key, drafting)
    if choice is not None:
        if choice.backend == "native":
            return native, choice
        native.close()
        return load_llama(), choice
    ours = measure(native, width, prompt_tokens, repeats)
    device = native.facts.device
    native.close()
    try:
        llama = load_llama()
    except ModelLoadError as exc:
        reason = f"our kernels: llama.cpp could not load the model to compare ({exc})"
        return load_native(), BackendChoice("native", reason, ours, None, None)
    try:
        if llama.facts.device != device:  # a llama.cpp build without a GPU backend: no contest
            where = f"{llama.facts.device} ({llama.device_reason})"
            reason = f"our kernels: llama.cpp would run the model on the {where}"
            llama.close()
            return load_native(), BackendChoice("native", reason, ours, None, None)
        theirs = measure(llama, width, prompt_tokens, repeats)
    except BaseException:
        llama.close()
        raise
    _cache_write(cache, key, ours, theirs)
    choice = decide(ours, theirs, drafting)
    log.info("backend for %s: %s", native.path.name, choice.reason)
    if choice.backend == "llama":
        return llama, choice
    llama.close()
    return load_native(), choice

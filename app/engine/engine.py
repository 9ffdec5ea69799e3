"""A loaded target (and drafter) with its chat format and draft policy: what bench, CLI and server drive."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import paths
from app.config import ConfigError, Settings
from app.engine.backends.base import Backend
from app.engine.backends.choice import BackendChoice, choose_backend
from app.engine.backends.llama import LlamaBackend
from app.engine.backends.native import MAX_WIDTH as NATIVE_MAX_WIDTH
from app.engine.backends.native import NativeBackend, native_support
from app.engine.batching import Scheduler
from app.engine.calibration import VerifyCosts, cost_key, measure_token_cost, measure_verify_costs
from app.engine.chat import ChatFormat
from app.engine.draft_choice import DraftChoice
from app.engine.drafters import (
    CrossVocabDrafter,
    Drafter,
    ModelDrafter,
    NgramDrafter,
    VocabVerdict,
    check_drafter_usable,
    check_vocab,
)
from app.engine.drafting import Speculation
from app.engine.errors import DrafterUnusable, InvalidRequest, ModelLoadError
from app.engine.generation import Chunk, GenerationRequest, StepHook, Stream, generate, reproducible
from app.engine.policy import TRIAL_STEPS, DraftPolicy
from app.engine.props import engine_props
from app.engine.slots import Slots
from app.engine.vision import (
    IMAGE_POSITION,
    ImageError,
    ImageLimits,
    MediaPrompt,
    NoVision,
    Vision,
    image_parts,
    read_image_part,
)

log = logging.getLogger("foresight.engine")


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    text: str
    draft_prompt: bytes | None  # the drafter's own rendering, for cross-vocabulary drafting
    media: MediaPrompt | None = None  # images: tokens holds IMAGE_POSITION where they sit

    def close(self) -> None:
        if self.media is not None:
            self.media.close()


def _native_refusal(
    path: Path, choice: str, setting: str, device: str, limit: str | None = None
) -> str | None:
    """Why the native backend cannot run this model as the settings place it (None: it can). `choice` is
    the backend setting (auto, llama, native), `device` the device setting named `setting`, `limit` a
    reason the caller's other settings give."""
    place = device.strip().lower()
    if choice == "llama":
        return "not asked for"
    if place == "cpu":
        return "the settings ask for the CPU"
    if ":" in place:
        return f"{setting} {device!r}: the native backend runs on the current GPU only"
    return limit or native_support(path)


def _native_or_why_not(
    path: Path, choice: str, refusal: str | None, n_ctx: int
) -> tuple[NativeBackend | None, str]:
    """The model on our kernels where `choice` and `refusal` allow, with the reason to report; or None and
    why llama.cpp runs it. Where native was asked for and cannot run, ModelLoadError says why."""
    if choice == "native" and refusal:
        raise ModelLoadError(f"the native backend cannot run {path.name}: {refusal}")
    if choice != "llama" and not refusal:
        try:
            return NativeBackend(path, n_ctx=n_ctx), "our kernels run this model on this GPU"
        except ModelLoadError as exc:
            if choice == "native":
                raise
            refusal = str(exc)
    return None, "llama.cpp, as the settings ask" if choice == "llama" else f"llama.cpp: {refusal}"


UNPLACED_N_CTX = 4096  # the context of an Engine built without a placement (tests, scripts)


def check_settings(settings: Settings) -> None:
    """Settings that cannot work together, refused before anything loads."""
    es, ds = settings.engine, settings.draft
    if ds.mode != "none" and es.n_batch < ds.max_draft + 1:
        raise ConfigError(
            f"engine.n_batch {es.n_batch} is smaller than draft.max_draft + 1 = {ds.max_draft + 1}: a verify "
            "pass takes a draft and the token before it at once; raise n_batch or lower max_draft"
        )


class Engine:
    """The one owner of the loaded models; call it from one thread at a time."""

    def __init__(
        self,
        target: str | Path,
        draft: str | Path | None = None,
        settings: Settings | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """`progress` hears each stage by name (loading target, loading projector, loading drafter,
        calibrating); it may raise to abandon the load, and what was loaded is closed.
        settings.engine.slots: KV slots of a llama.cpp target (our kernels keep one sequence).

        The vision projector is settings.engine.mmproj (None: the target reads no images)."""
        self.settings = settings or Settings()
        if self.settings.engine.n_ctx == 0:  # not sized by an engine process's placement
            engine = self.settings.engine.model_copy(update={"n_ctx": UNPLACED_N_CTX})
            self.settings = self.settings.model_copy(update={"engine": engine})
        self.placement: dict[str, Any] | None = None  # where the engine process placed the pair, and why
        es, ds = self.settings.engine, self.settings.draft
        check_settings(self.settings)
        report = progress or (lambda stage: None)
        report("loading target")
        self.backend_reason = ""
        self.backend_choice: BackendChoice | None = None  # auto's measured choice for the target
        # a step verifies every stream's draft in one pass of at most n_batch tokens
        width = ds.max_draft + 1 if ds.mode != "none" else 1
        self._n_seq = max(1, min(es.slots, es.n_batch // width))
        self.one_slot_reason = ""  # why a llama.cpp target keeps one sequence (our kernels always do)
        if es.slots == 1:
            self.one_slot_reason = "engine.slots is 1"
        elif self._n_seq == 1:
            self.one_slot_reason = (
                f"engine.n_batch {es.n_batch} holds one stream's verify pass of {width} tokens"
            )
        self.target = self._load_target(Path(target))
        self.slots = Slots(self.target)
        self.scheduler = Scheduler(self.target, self.slots)
        self._shared_stream: Stream | None = None  # the open stream that drafts with the engine's drafter
        self.draft_model: Backend | None = None
        self.draft_backend_reason = ""
        self.draft_chat: ChatFormat | None = None
        self.vocab_verdict: VocabVerdict | None = None
        self.drafter: Drafter | None = None
        self.policy: DraftPolicy | None = None
        self.choice = DraftChoice()
        self.costs: VerifyCosts | None = None
        self.vision: Vision | None = None
        try:  # whatever fails from here on, the loaded target is freed
            self.chat = ChatFormat(self.target.chat_template, self.target.facts.architecture)
            if es.mmproj:
                report("loading projector")
                self.vision = Vision(es.mmproj, self.target)
            mode = ds.mode
            if mode == "auto":
                mode = "model" if draft else "ngram"
            if mode == "model":
                if not draft:
                    raise DrafterUnusable("draft mode 'model' needs a drafter model file")
                report("loading drafter")
                self.drafter = self._load_drafter(Path(draft))
            elif mode == "ngram":
                self.drafter = NgramDrafter(ds.ngram_min, max(ds.ngram_min, ds.ngram_max))
            if self.drafter is not None:
                report("calibrating")
                self.costs = measure_verify_costs(
                    self.target,
                    ds.max_draft + 1,
                    paths.cache_dir() / "verify-costs.json",
                    cost_key(self.target, es.flash_attn),
                    shape_sensitive=self.target.facts.device == "gpu",
                )
                model = self.drafter.source != "ngram"
                self.policy = DraftPolicy(
                    self.costs,
                    ds.max_draft,
                    self.drafter.cost_per_token_s,
                    ds.adaptive,
                    trial_steps=TRIAL_STEPS if model else 0,
                )
                if model and ds.adaptive:  # where the drafter model's trial fails, lookups draft
                    lookup = NgramDrafter(ds.ngram_min, max(ds.ngram_min, ds.ngram_max))
                    self.choice = DraftChoice(Speculation(lookup, DraftPolicy(self.costs, ds.max_draft, 0.0)))
        except BaseException:
            self.close()
            raise

    def _load_target(self, path: Path) -> Backend:
        """The target on the backend the settings ask for; `auto` takes the native one where it can run."""
        es = self.settings.engine
        native, self.backend_reason = _native_or_why_not(
            path, es.backend, self._native_refusal(path), es.n_ctx
        )

        def llama() -> Backend:
            return LlamaBackend(
                path,
                n_ctx=es.n_ctx,
                n_batch=es.n_batch,
                n_threads=es.n_threads,
                device=es.device,
                gpu_layers=es.gpu_layers,
                tensor_split=es.tensor_split,
                device_argmax=es.device_argmax,
                flash_attn=es.flash_attn,
                n_seq=self._n_seq,
            )

        if native is None:
            return llama()
        if es.backend == "native":
            return native
        # auto: our kernels only where they serve this model sooner than llama.cpp, as timed on this device
        ds = self.settings.draft
        model, self.backend_choice = choose_backend(
            native,
            lambda: NativeBackend(path, n_ctx=es.n_ctx),
            llama,
            width=ds.max_draft + 1 if ds.mode != "none" else 1,
            settings=f"b{es.n_batch}:fa-{es.flash_attn}:argmax-{es.device_argmax}",
        )
        self.backend_reason = self.backend_choice.reason
        return model

    def _native_refusal(self, path: Path) -> str | None:
        """Why the native backend cannot take this target with these settings (None: it can)."""
        es, ds = self.settings.engine, self.settings.draft
        if ds.mode != "none" and ds.max_draft + 1 > NATIVE_MAX_WIDTH:
            limit = f"drafts of {ds.max_draft} tokens: its passes take at most {NATIVE_MAX_WIDTH} tokens"
        elif es.mmproj:
            limit = "images go through libmtmd, which needs the model in llama.cpp"
        elif es.tensor_split or es.gpu_layers != -1:
            limit = "a split or partial offload of the model"
        else:
            limit = None
        return _native_refusal(path, es.backend, "device", es.device, limit)

    def _load_draft_model(self, path: Path) -> Backend:
        """The drafter on the backend the settings ask for; `auto` takes the native one where it can run."""
        es = self.settings.engine
        refusal = _native_refusal(path, es.draft_backend, "draft device", es.draft_device)
        native, self.draft_backend_reason = _native_or_why_not(
            path, es.draft_backend, refusal, self.target.n_ctx
        )
        if native is not None:
            return native
        return LlamaBackend(
            path,
            n_ctx=self.target.n_ctx,
            n_batch=min(es.n_batch, 512),
            n_threads=es.n_threads,
            device=es.draft_device,
            gpu_layers=-1,  # gpu_layers is the target's partial offload; a drafter on a GPU goes whole
            device_argmax=es.device_argmax,
            flash_attn=es.flash_attn,
        )

    def _load_drafter(self, path: Path) -> Drafter:
        try:
            model = self._load_draft_model(path)
        except ModelLoadError as exc:
            raise DrafterUnusable(f"the drafter cannot be used: {exc}") from exc
        self.draft_model = model
        check_drafter_usable(model)
        self.vocab_verdict = check_vocab(self.target, model)
        cost, prefill = measure_token_cost(model)
        log.info("drafter %s: %s", path.name, self.vocab_verdict.summary())
        if self.vocab_verdict.compatible:
            return ModelDrafter(model, cost, prefill)
        self.draft_chat = ChatFormat(model.chat_template, model.facts.architecture)
        return CrossVocabDrafter(model, self.target, self.vocab_verdict, cost, prefill)

    # --- prompts --------------------------------------------------------------------------------------
    def tokenize_text(self, text: str) -> list[int]:
        return self.target.tokenize(text.encode("utf-8"), True, False)

    def render_text(self, text: str) -> Prompt:
        """Raw text to complete as is, without the chat template."""
        return Prompt(self.tokenize_text(text), text, None)

    def render_fim(self, prefix: str, suffix: str) -> Prompt:
        """Fill-in-the-middle: the text before and after the gap, framed by the model's FIM tokens.

        A model without FIM tokens refuses a suffix; an empty one leaves a plain completion of the prefix.
        """
        fim = self.target.fim_tokens()
        if fim is None:
            if suffix:
                raise InvalidRequest("model does not support fill-in-the-middle (suffix)")
            return self.render_text(prefix)
        pre, suf, mid = fim
        t = self.target
        before, after = (t.tokenize(s.encode("utf-8"), False, False) for s in (prefix, suffix))
        tokens = [pre, *before, suf, *after, mid]
        if t.vocab.add_bos:
            tokens.insert(0, t.vocab.bos)
        text = f"{t.token_text(pre)}{prefix}{t.token_text(suf)}{suffix}{t.token_text(mid)}"
        return Prompt(tokens, text, None)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        prefill: str = "",
    ) -> Prompt:
        """The chat template's prompt; `prefill` is assistant text the reply is made to begin with.

        Image parts become the projector's marker in the text, and libmtmd tokenizes the images there.
        """
        images = image_parts(messages)
        if images:
            return self._render_with_images(messages, images, tools, prefill)
        text = self.chat.render(messages, tools) + prefill
        tokens = self.target.tokenize(text.encode("utf-8"), True, True)
        draft_prompt = None
        if self.draft_chat is not None:
            draft_prompt = (self.draft_chat.render(messages) + prefill).encode("utf-8")
        return Prompt(tokens, text, draft_prompt)

    def _render_with_images(
        self,
        messages: Sequence[Mapping[str, Any]],
        images: list[tuple[int, int, Mapping[str, Any]]],
        tools: Sequence[Mapping[str, Any]] | None,
        prefill: str,
    ) -> Prompt:
        first_i, first_j, _ = images[0]
        if self.vision is None:
            raise NoVision(f"messages[{first_i}].content[{first_j}]")
        es = self.settings.engine
        if len(images) > es.max_images:
            i, j, _ = images[es.max_images]
            raise ImageError(
                f"at most {es.max_images} images are taken per request", f"messages[{i}].content[{j}]"
            )
        limits = ImageLimits(es.max_image_bytes, es.max_image_pixels, es.max_images)
        read = [read_image_part(part, f"messages[{i}].content[{j}]", limits) for i, j, part in images]
        # the images of one request are decoded at once: their pixels together stay under the limit
        if sum(r.width * r.height for r in read) > es.max_image_pixels:
            raise ImageError(
                f"the images hold more than {es.max_image_pixels} pixels together", read[-1].param
            )
        marker = {"type": "text", "text": self.vision.marker}
        at = {(i, j) for i, j, _ in images}
        templated = [
            dict(m, content=[marker if (i, j) in at else p for j, p in enumerate(m["content"])])
            if isinstance(m.get("content"), list)
            else m
            for i, m in enumerate(messages)
        ]
        text = self.chat.render(templated, tools) + prefill
        if text.count(self.vision.marker) != len(read):
            raise InvalidRequest(f"the text of the messages holds the image marker {self.vision.marker!r}")
        media = self.vision.tokenize(text, read)
        if media.tokens[-1] == IMAGE_POSITION:  # the answer starts after a text token, never an image
            media.close()
            raise InvalidRequest("the prompt ends on an image: put text (or the assistant's turn) after it")
        return Prompt(media.tokens, text, None, media)

    # --- generation -----------------------------------------------------------------------------------
    @property
    def speculation(self) -> Speculation | None:
        """What the next generation drafts with (None: plain decoding only)."""
        return self.choice.speculation(self.drafter, self.policy)

    def generate(
        self,
        request: GenerationRequest,
        cancel: threading.Event | None = None,
        on_step: StepHook | None = None,
        client: str = "",
    ) -> Iterator[Chunk]:
        """One generation in the KV slot of `client` (see slots.py) whose prefix its prompt shares most."""
        if request.stop and not all(isinstance(s, str) for s in request.stop):
            raise InvalidRequest("stop must be a list of strings")
        req = dataclasses.replace(request, stop=[*request.stop, *self.chat.stop])
        if request.speculative:
            self.choice.next_generation(self.policy)
        slot = self.slots.acquire(client, list(request.prompt), self.room_needed(request))
        try:
            if reproducible(request):
                self.slots.empty_others(slot)
            self.slots.select(slot)
            yield from self.choice.tallied(generate(self.target, req, self.speculation, cancel, on_step))
        finally:
            self.slots.release(slot)

    # --- streams, batched (the server's worker) --------------------------------------------------------
    def open_stream(
        self, request: GenerationRequest, cancel: threading.Event | None, client: str, tag: Any
    ) -> Stream | None:
        """A generation that joins the batch at the next step (None: no slot or KV room for it yet, try
        again when a stream has ended). A stream that opens while others run drafts by its own n-gram
        lookup: the engine's drafter (a model, with one cache) and policy serve one stream at a time."""
        if request.stop and not all(isinstance(s, str) for s in request.stop):
            raise InvalidRequest("stop must be a list of strings")
        need = self.room_needed(request)
        if not self.slots.fits(need) or not self._may_join(request):
            return None
        req = dataclasses.replace(request, stop=[*request.stop, *self.chat.stop])
        shared = not self.scheduler.entries
        if shared and request.speculative:
            self.choice.next_generation(self.policy)
        slot = self.slots.acquire(client, list(request.prompt), need)
        try:
            if reproducible(request):
                self.slots.empty_others(slot)
            self.slots.select(slot)
            stream = Stream(self.target, req, self.speculation if shared else self._own_lookup(), cancel)
        except BaseException:
            self.slots.release(slot)
            raise
        if shared:
            self._shared_stream = stream
        self.scheduler.add(stream, slot, tag)
        return stream

    def _may_join(self, request: GenerationRequest) -> bool:
        """A reproducible request (seeded, sampled) runs alone from an emptied cache: it waits for the open
        streams to end, and streams opened after it wait for its end (see generation.reproducible)."""
        entries = self.scheduler.entries
        if not entries:
            return True
        return not reproducible(request) and not any(reproducible(e.stream.request) for e in entries)

    def _own_lookup(self) -> Speculation | None:
        """A stream's own n-gram lookup and policy, for a stream that runs beside others."""
        if self.costs is None:
            return None
        ds = self.settings.draft
        lookup = NgramDrafter(ds.ngram_min, max(ds.ngram_min, ds.ngram_max))
        return Speculation(lookup, DraftPolicy(self.costs, ds.max_draft, 0.0, ds.adaptive))

    def step_streams(self) -> list[tuple[Any, Chunk | Exception]]:
        """One step of every open stream: (its tag, a chunk to send or the error that ended it)."""
        out = []
        for entry, outcome in self.scheduler.step():
            ended = isinstance(outcome, Exception) or outcome.finish_reason is not None
            if ended and entry.stream is self._shared_stream:
                self._shared_stream = None
                stats = outcome.stats if isinstance(outcome, Chunk) else None
                if stats is not None and stats.draft_source != "none":
                    self.choice.gained.add(stats)
            out.append((entry.tag, outcome))
        return out

    def room_needed(self, request: GenerationRequest) -> int:
        """Cells a generation may hold at most: its prompt, its reply and a draft past it."""
        ds = self.settings.draft
        draft = ds.max_draft + 1 if self.drafter is not None else 1
        return min(self.target.n_ctx, len(request.prompt) + request.max_tokens + draft)

    def props(self) -> dict[str, Any]:
        """What /props reports: the models, where they run and why, drafting, vision, batching."""
        return engine_props(self)

    def close(self) -> None:
        if getattr(self, "vision", None) is not None:
            self.vision.close()
            self.vision = None
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None
        if getattr(self, "target", None) is not None:
            self.target.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

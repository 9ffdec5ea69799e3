"""A loaded target (and drafter) running generations: alone, or as streams batched step by step."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.config import Settings
from app.engine.batching import Scheduler
from app.engine.drafting.policy import DraftPolicy
from app.engine.drafting.step import Speculation
from app.engine.errors import InvalidRequest
from app.engine.generation import Chunk, GenerationRequest, StepHook, Stream, generate, reproducible
from app.engine.loading import load_pair, lookup, sized
from app.engine.prompts import Prompt, Prompts
from app.engine.props import engine_props
from app.engine.slots import Slot, Slots


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
        self.settings = sized(settings)
        self.placement: dict[str, Any] | None = None  # where the engine process placed the pair, and why
        report = progress or (lambda stage: None)
        self.loaded = load_pair(Path(target), Path(draft) if draft else None, self.settings, report)
        loaded = self.loaded
        # what generations run with (a test may put a wrapped target or another policy in their place)
        self.target, self.chat, self.vision = loaded.target, loaded.chat, loaded.vision
        self.draft_model, self.vocab_verdict = loaded.draft_model, loaded.vocab_verdict
        self.drafter, self.policy = loaded.drafter, loaded.policy
        self.costs, self.choice = loaded.costs, loaded.choice
        self.prompts = Prompts(self.target, self.chat, self.settings.engine, loaded.draft_chat, self.vision)
        self.slots = Slots(self.target)
        self.scheduler = Scheduler(self.target, self.slots)
        self._shared_stream: Stream | None = None  # the open stream that drafts with the engine's drafter

    # --- prompts (see prompts.py) ----------------------------------------------------------------------
    def tokenize_text(self, text: str) -> list[int]:
        return self.prompts.tokenize_text(text)

    def render_text(self, text: str) -> Prompt:
        return self.prompts.render_text(text)

    def render_fim(self, prefix: str, suffix: str) -> Prompt:
        return self.prompts.render_fim(prefix, suffix)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        prefill: str = "",
    ) -> Prompt:
        return self.prompts.render_chat(messages, tools, prefill)

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
        opened = self._prelude(request, client, joining=False)
        assert opened is not None  # only a stream joining others waits for room
        req, slot, _ = opened
        try:
            yield from self.choice.tallied(generate(self.target, req, self.speculation, cancel, on_step))
        finally:
            self.slots.release(slot)

    def _prelude(
        self, request: GenerationRequest, client: str, joining: bool
    ) -> tuple[GenerationRequest, Slot, bool] | None:
        """What every generation does first: the request checked and given the chat's stop strings, its
        slot taken (emptied of the others for a reproducible request) and selected. Returns the request,
        the slot and whether it drafts with the engine's drafter; None: a stream `joining` the batch finds
        no slot or KV room for it yet. One that drafts with the engine's drafter counts toward a failed
        drafter model's retrial."""
        if request.stop and not all(isinstance(s, str) for s in request.stop):
            raise InvalidRequest("stop must be a list of strings")
        need = self.room_needed(request)
        if joining and (not self.slots.fits(need) or not self._may_join(request)):
            return None
        req = dataclasses.replace(request, stop=[*request.stop, *self.chat.stop])
        shared = not joining or not self.scheduler.entries
        if shared and request.speculative:
            self.choice.next_generation(self.policy)
        slot = self.slots.acquire(client, list(request.prompt), need)
        try:
            if reproducible(request):
                self.slots.empty_others(slot)
            self.slots.select(slot)
        except BaseException:
            self.slots.release(slot)
            raise
        return req, slot, shared

    # --- streams, batched (the server's worker) --------------------------------------------------------
    def open_stream(
        self, request: GenerationRequest, cancel: threading.Event | None, client: str, tag: Any
    ) -> Stream | None:
        """A generation that joins the batch at the next step (None: no slot or KV room for it yet, try
        again when a stream has ended). A stream that opens while others run drafts by its own n-gram
        lookup: the engine's drafter (a model, with one cache) and policy serve one stream at a time."""
        opened = self._prelude(request, client, joining=True)
        if opened is None:
            return None
        req, slot, shared = opened
        try:
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
        return Speculation(lookup(ds), DraftPolicy(self.costs, ds.max_draft, 0.0, ds.adaptive))

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
        return engine_props(self.loaded, self.scheduler, self.slots, self.placement)

    def close(self) -> None:
        self.loaded.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

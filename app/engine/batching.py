"""Continuous batching: the open streams' next tokens, their drafts and new prompts' chunks in one decode.

Each step, every running stream plans its pass (the pending token and its draft: n-gram drafts ride in
the batch and are verified there), prompts of streams still prefilling fill what n_batch has left in
chunks, one `decode_batch` runs it all, one vectorised argmax covers every row, and each stream accepts
from its own rows: sampling, stops, cancellation, KV rollback and stats stay per stream. A stream joins
between steps and leaves when it finishes.

With one stream open it runs alone, exactly as generate() does (the device's argmax, one prefill pass),
so a single client loses nothing to batching. An image prompt is prefilled alone too (libmtmd decodes
the image into its sequence), then decodes in the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from app.engine.backends.base import Backend, BatchingBackend
from app.engine.generation import Chunk, Stream
from app.engine.slots import Slot, Slots


@dataclass(eq=False)
class Entry:
    """An open stream in its slot; `tag` is the caller's (the worker's job)."""

    stream: Stream
    slot: Slot
    tag: Any
    fed: int = -1  # prompt tokens in the KV while a batched prefill runs (-1: not begun)


Outcome = tuple[Entry, Chunk | Exception]  # a chunk to send, or the error that ended the stream


@dataclass
class _Part:
    entry: Entry
    tokens: list[int]
    logits_from: int
    prompt_done: bool = False  # a prefill chunk that ends the prompt: its last row gives the first token

    @property
    def rows(self) -> int:
        return len(self.tokens) - self.logits_from


class Scheduler:
    """The streams that decode together in the target's context, one step at a time."""

    def __init__(self, target: Backend, slots: Slots, clock: Callable[[], float] = time.perf_counter) -> None:
        self.target = target
        self.slots = slots
        # several slots: the target holds a sequence for each and decodes rows of them in one pass
        self._batching = cast(BatchingBackend, target) if target.n_seq > 1 and len(slots.slots) > 1 else None
        self.batched = self._batching is not None
        self.entries: list[Entry] = []
        self.clock = clock
        self.batch_steps = 0  # steps that ran more than one stream in one pass

    def add(self, stream: Stream, slot: Slot, tag: Any) -> Entry:
        entry = Entry(stream, slot, tag)
        self.entries.append(entry)
        return entry

    def step(self) -> list[Outcome]:
        """One step of every open stream; finished and failed streams leave (their slots are released)."""
        if not self.entries:
            return []
        first = self.entries[0]
        if self._batching is None or (len(self.entries) == 1 and (first.stream.started or first.fed < 0)):
            outcome = self._alone(first)
            outcomes = [outcome] if outcome is not None else []
        else:
            outcomes = self._batch(self._batching)
        for entry, outcome in outcomes:
            if isinstance(outcome, Exception) or outcome.finish_reason is not None:
                self._leave(entry)
        return outcomes

    def abort(self) -> None:
        """Close every stream unfinished (a step failed outside any one stream)."""
        for entry in list(self.entries):
            self._leave(entry)

    def _leave(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self.slots.release(entry.slot)

    def _alone(self, entry: Entry) -> Outcome | None:
        """A step of one stream in a pass of its own (generate()'s own loop)."""
        stream = entry.stream
        self.slots.select(entry.slot)
        try:
            if stream.cancel is not None and stream.cancel.is_set() and not stream.started:
                return entry, stream.abandon()
            if stream.started:
                stream.plan()
                stream.step()
            else:
                stream.prefill()
            chunk = stream.advance()
            return (entry, chunk) if chunk is not None else None
        except Exception as exc:
            return entry, exc

    def _batch(self, target: BatchingBackend) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for entry in [e for e in self.entries if not e.stream.started and e.stream.request.media is not None]:
            outcome = self._alone(entry)  # an image is decoded into its sequence by libmtmd
            if outcome is not None:
                outcomes.append(outcome)
        parts = self._plan(outcomes)
        if not parts:
            return outcomes
        t0 = self.clock()
        try:
            logits = target.decode_batch([(p.entry.slot.seq, p.tokens, p.logits_from) for p in parts])
        except Exception as exc:
            return outcomes + [(p.entry, exc) for p in parts]
        verify_s = self.clock() - t0
        if len(parts) > 1:
            self.batch_steps += 1
            for part in parts:
                part.entry.stream.stats.shared_passes += 1
        # One argmax call for every row: the greedy streams' tokens (sampled streams read their rows).
        best = logits.argmax(axis=1).tolist() if len(logits) else []
        row = 0
        for part in parts:
            outcome = self._took(part, logits[row : row + part.rows], best[row : row + part.rows], verify_s)
            if outcome is not None:
                outcomes.append(outcome)
            row += part.rows
        return outcomes

    def _plan(self, outcomes: list[Outcome]) -> list[_Part]:
        """This step's parts: running streams first, then prompt chunks in what n_batch leaves."""
        budget = self.target.n_batch
        parts: list[_Part] = []
        done = {id(e) for e, _ in outcomes}
        for entry in self.entries:
            if id(entry) in done or not entry.stream.started:
                continue
            self.slots.select(entry.slot)
            try:
                tokens = entry.stream.plan()
            except Exception as exc:
                outcomes.append((entry, exc))
                continue
            parts.append(_Part(entry, tokens, 0))
            budget -= len(tokens)
        for entry in self.entries:
            if id(entry) in done or entry.stream.started or budget <= 0:
                continue
            stream = entry.stream
            if stream.cancel is not None and stream.cancel.is_set():
                outcomes.append((entry, stream.abandon()))
                continue
            self.slots.select(entry.slot)
            if entry.fed < 0:
                entry.fed = stream.reuse()
            chunk = stream.prompt[entry.fed : entry.fed + budget]
            last = entry.fed + len(chunk) == len(stream.prompt)
            parts.append(_Part(entry, chunk, len(chunk) - 1 if last else len(chunk), last))
            budget -= len(chunk)
        return parts

    def _took(self, part: _Part, rows: Any, best: list[int], verify_s: float) -> Outcome | None:
        """A part's rows back to its stream: the chunk it makes (None: a prompt chunk, nothing yet)."""
        entry, stream = part.entry, part.entry.stream
        self.slots.select(entry.slot)
        try:
            if stream.started:
                stream.take(rows, best, verify_s)
            elif part.prompt_done:
                stream.begin(stream.first(rows[0], best[0]))
            else:
                entry.fed += len(part.tokens)
                return None
            chunk = stream.advance()
            return (entry, chunk) if chunk is not None else None
        except Exception as exc:
            return entry, exc

"""The one thread that owns the Engine: loads it, runs queued jobs one at a time, swaps or drops it.

HTTP handlers never touch the Engine. They put a Job on a bounded queue; the engine thread sends back
values on the job's own results queue: Chunks, then END, or an exception object instead. Loading and
unloading travel the same queue as controls, with their own events queue: Stages, then END.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from app.engine.engine import Engine
from app.engine.errors import ContextLengthExceeded, EngineError
from app.engine.generation import Chunk, GenerationRequest
from app.engine.grammar import vocab_pointer
from app.engine.sampling import SamplingParams, TokenLogprob
from app.engine.stats import SpecStats

log = logging.getLogger("foresight.worker")


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()


@dataclass(frozen=True)
class Logprob:
    """An emitted token's log-probability, with the best alternatives: tokens as their bytes."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...]


@dataclass
class Piece(Chunk):
    """A Chunk as the routes get it, with what only the worker can tell them."""

    logprobs: list[Logprob] | None = None  # per token of this piece, when the request asked
    stop_sequence: str | None = None  # on the last piece: the request's stop string that ended it


@dataclass(frozen=True)
class Started:
    """The prompt is rendered and fits: generation begins (a stream can send its headers now)."""


@dataclass(frozen=True)
class PromptCount:
    """The answer to a count-only job: the rendered prompt's length in tokens."""

    tokens: int


Result = Piece | Started | PromptCount | _End | BaseException
Loader = Callable[[Callable[[str], None]], Engine]  # builds an Engine, reporting its stages by name


class NotReady(Exception):
    """No model is loaded: it is loading, unloading, unloaded, or failed to load."""


class QueueFull(Exception):
    """queue_size jobs are already waiting."""


class ShuttingDown(Exception):
    """The server stopped before this job ran."""


class Busy(Exception):
    """A model is already being loaded or unloaded."""


@dataclass(eq=False)  # identity: listeners keep their jobs in a WeakSet
class Job:
    """One generation: a chat (messages) or a raw text prompt, and where its results go."""

    params: SamplingParams
    max_tokens: int
    stop: list[str]
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prefill: str = ""  # assistant text the chat reply begins with (a forced tool call)
    text: str | None = None
    suffix: str | None = None  # with text: fill in the middle between text and suffix
    speculative: bool = True
    count_only: bool = False  # render the prompt and answer its length (PromptCount), generate nothing
    results: queue.Queue[Result] = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    prompt_tokens: int | None = None  # set by the engine thread before the first result


@dataclass(frozen=True)
class Stage:
    """A step of a load: unloading, loading target, loading drafter, calibrating, ready (or unloaded)."""

    name: str
    elapsed_s: float


@dataclass
class _Control:
    """Load an Engine (loader) or only drop the current one (loader None)."""

    loader: Loader | None
    events: queue.Queue[Stage | _End | BaseException] = field(default_factory=queue.Queue)


@dataclass
class Metrics:
    """Counters since start; written by the engine thread only, read by /metrics."""

    requests: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    tokens_generated: int = 0
    drafted: int = 0
    accepted: int = 0
    last_tokens_per_second: float = 0.0
    kv_tokens: int = 0  # tokens the target's KV cache keeps for prefix reuse
    kv_cells: int = 0  # positions llama.cpp's cache holds; differs from kv_tokens only if cells leaked

    def record(self, stats: SpecStats) -> None:
        self.prompt_tokens += stats.prompt_tokens
        self.tokens_generated += stats.emitted
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.last_tokens_per_second = stats.tokens_per_second

    def prometheus(self, queue_depth: int) -> str:
        rows = [
            ("requests_total", "counter", "generation requests run", self.requests),
            ("requests_failed_total", "counter", "generation requests that ended in an error", self.failed),
            ("prompt_tokens_total", "counter", "prompt tokens processed", self.prompt_tokens),
            ("tokens_generated_total", "counter", "tokens generated", self.tokens_generated),
            ("drafted_tokens_total", "counter", "draft tokens proposed for verification", self.drafted),
            ("accepted_tokens_total", "counter", "draft tokens the target accepted", self.accepted),
            (
                "last_tokens_per_second",
                "gauge",
                "decode speed of the last request",
                self.last_tokens_per_second,
            ),
            ("queue_depth", "gauge", "requests waiting for the engine", queue_depth),
            ("kv_tokens", "gauge", "tokens kept in the target's KV cache for prefix reuse", self.kv_tokens),
            ("kv_cells", "gauge", "positions held in llama.cpp's KV cache (= kv_tokens)", self.kv_cells),
        ]
        lines = []
        for name, kind, text, value in rows:
            lines += [f"# HELP foresight_{name} {text}", f"# TYPE foresight_{name} {kind}"]
            lines.append(f"foresight_{name} {value}")
        return "\n".join(lines) + "\n"


class Worker:
    """Owns the Engine in its own thread and serves jobs from a bounded queue, one at a time.

    States: loading -> ready | failed; ready -> loading (another pair) | unloading -> unloaded; stopped.
    Jobs are accepted only when ready. A load or unload cancels the running job (its stream ends with
    finish_reason "cancelled") and answers the waiting ones NotReady.
    """

    def __init__(self, load: Loader, queue_size: int) -> None:
        self._jobs: queue.Queue[Job | _Control | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._lock = threading.Lock()  # state changes and queue puts happen together
        self._state = "loading"
        self._engine: Engine | None = None  # the engine thread's own
        self._current: Job | None = None
        self._stopping = threading.Event()
        self.loaded = threading.Event()  # set when the first load ended, well or not
        self.load_error: BaseException | None = None
        self.props: dict[str, Any] | None = None  # Engine.props() after load and after every job
        self.metrics = Metrics()
        self._jobs.put_nowait(_Control(load))

    @property
    def state(self) -> str:
        return self._state

    @property
    def queue_depth(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._state != "ready" or self._stopping.is_set():
                raise NotReady(self._state)
            try:
                self._jobs.put_nowait(job)
            except queue.Full:
                raise QueueFull from None

    def load(self, loader: Loader) -> queue.Queue[Stage | _End | BaseException]:
        """Replace the loaded Engine (if any) by loader's; its Stages, then END (or an exception), follow."""
        return self._control(_Control(loader), "loading")

    def unload(self) -> queue.Queue[Stage | _End | BaseException]:
        """Close the Engine and free its memory; jobs get NotReady until the next load."""
        return self._control(_Control(None), "unloading")

    def _control(self, control: _Control, state: str) -> queue.Queue[Stage | _End | BaseException]:
        with self._lock:
            if self._stopping.is_set():
                raise ShuttingDown("the server is shutting down")
            if self._state in ("loading", "unloading"):
                raise Busy(f"a model is {self._state}; wait for it to finish")
            self._state = state
            self._cancel_all(NotReady(state))
            self._jobs.put_nowait(control)  # room: the queue was just emptied and submit() now refuses
        return control.events

    def _cancel_all(self, reason: BaseException) -> None:
        """Cancel the running job and answer every waiting one with `reason` (called with the lock held)."""
        current = self._current
        if current is not None:
            current.cancel.set()
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Job):
                item.results.put(reason)
            elif isinstance(item, _Control):
                item.events.put(reason)
                item.events.put(END)

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel the running job, fail the waiting ones, let the engine thread close the Engine.

        False if the thread is still busy after `timeout` (a model load cannot be interrupted midway).
        """
        with self._lock:
            self._stopping.set()
            self._cancel_all(ShuttingDown("the server is shutting down"))
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the engine thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                item = self._jobs.get()
                if item is None:
                    break
                if isinstance(item, _Control):
                    self._apply(item)
                elif self._engine is None:
                    item.results.put(NotReady(self._state))
                else:
                    self._current = item
                    try:
                        self._serve(self._engine, item)
                    finally:
                        self._current = None
        finally:
            self._close_engine()
            with self._lock:  # nothing queued may wait for a thread that is gone
                self._stopping.set()
                self._state = "stopped"
                self._cancel_all(ShuttingDown("the engine stopped"))
            self.loaded.set()

    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        self.props = None
        self.metrics.kv_tokens = self.metrics.kv_cells = 0
        if engine is not None:
            engine.close()

    def _apply(self, control: _Control) -> None:
        t0 = time.perf_counter()

        def stage(name: str) -> None:
            if self._stopping.is_set():  # abandon the load at the next stage (Engine closes what it has)
                raise ShuttingDown("the server is shutting down")
            log.info("model: %s", name)
            control.events.put(Stage(name, round(time.perf_counter() - t0, 3)))

        try:
            if self._engine is not None:
                stage("unloading")
                self._close_engine()
            if control.loader is None:
                with self._lock:
                    self._state = "unloaded"
                    self.load_error = None
                stage("unloaded")
                return
            engine = control.loader(stage)
            self.props = engine.props()
        except BaseException as exc:
            log.log(logging.INFO if isinstance(exc, ShuttingDown) else logging.ERROR, "load: %s", exc)
            with self._lock:
                self.load_error = exc
                self._state = "failed"
            control.events.put(exc)
        else:
            self._engine = engine
            with self._lock:
                self.load_error = None
                self._state = "ready"
            stage("ready")
        finally:
            self.loaded.set()
            control.events.put(END)

    def _serve(self, engine: Engine, job: Job) -> None:
        if job.cancel.is_set():  # the client left while the job waited
            job.results.put(END)
            return
        self.metrics.requests += 1
        prompt = None
        try:
            if job.messages is not None:
                prompt = engine.render_chat(job.messages, job.tools, job.prefill)
            elif job.suffix is not None:
                prompt = engine.render_fim(job.text or "", job.suffix)
            else:
                prompt = engine.render_text(job.text or "")
            job.prompt_tokens = len(prompt.tokens)
            log.info("request: %d prompt tokens, at most %d new", len(prompt.tokens), job.max_tokens)
            if job.count_only:
                job.results.put(PromptCount(len(prompt.tokens)))
                job.results.put(END)
                return
            params = job.params
            if params.grammar is not None:
                params = replace(params, grammar=params.grammar.bound(vocab_pointer(engine.target)))
            request = GenerationRequest(
                prompt=prompt.tokens,
                params=params,
                max_tokens=job.max_tokens,
                stop=job.stop,
                draft_prompt=prompt.draft_prompt,
                speculative=job.speculative,
                media=prompt.media,
            )
            if len(prompt.tokens) >= engine.target.n_ctx:  # as generate() says it, before its prefill
                raise ContextLengthExceeded(
                    f"the prompt has {len(prompt.tokens)} tokens but the context holds {engine.target.n_ctx} "
                    "(with room for one reply token)"
                )
            job.results.put(Started())  # a long prompt's prefill can take minutes on a CPU
            pieces = _Pieces(engine, job)
            for chunk in engine.generate(request, job.cancel):
                if chunk.stats is not None:
                    self.metrics.record(chunk.stats)
                    _log_done(chunk.finish_reason, chunk.stats)
                job.results.put(pieces.of(chunk))
        except Exception as exc:
            self.metrics.failed += 1
            if isinstance(exc, EngineError):
                log.info("request refused: %s", exc)
            else:
                log.exception("request failed")
            job.results.put(exc)
        else:
            job.results.put(END)
        finally:
            if prompt is not None:
                prompt.close()  # an image prompt's libmtmd chunks
        try:
            self.props = engine.props()
            self.metrics.kv_tokens = len(engine.target.kv_tokens)
            self.metrics.kv_cells = engine.target.kv_pos_max() + 1
        except Exception:  # bookkeeping must not end the engine thread
            log.exception("after a request: engine figures unavailable")


def _log_done(finish: str | None, stats: SpecStats) -> None:
    log.info(
        "request done: %s, %d tokens, %.1f tok/s; %d prompt tokens reused; drafted %d, accepted %d",
        finish,
        stats.emitted,
        stats.tokens_per_second,
        stats.reused_tokens,
        stats.drafted,
        stats.accepted,
    )


class _Pieces:
    """A generation's chunks as Pieces: each with its tokens' logprobs, the last with its stop string."""

    def __init__(self, engine: Engine, job: Job) -> None:
        self._engine = engine
        self._job = job
        self._trace = job.params.logprobs
        self._used = 0  # trace entries handed out (the sampler also records a final end-of-generation pick)
        self._tokens: list[int] = []
        self._text: list[str] = []

    def of(self, chunk: Chunk) -> Piece:
        logprobs = None
        if self._trace is not None:
            taken = self._trace.tokens[self._used : self._used + len(chunk.tokens)]
            self._used += len(chunk.tokens)
            logprobs = [self._resolved(t) for t in taken]
        self._tokens += chunk.tokens
        self._text.append(chunk.text)
        stop = self._stop_sequence() if chunk.finish_reason == "stop" and self._job.stop else None
        return Piece(
            chunk.text, chunk.tokens, chunk.from_draft, chunk.finish_reason, chunk.stats, logprobs, stop
        )

    def _resolved(self, taken: TokenLogprob) -> Logprob:
        piece = self._engine.target.token_bytes
        return Logprob(piece(taken.token), taken.logprob, tuple((piece(t), lp) for t, lp in taken.top))

    def _stop_sequence(self) -> str | None:
        """The request's stop string the text was cut before (None: the model ended, or a template stop)."""
        whole = b"".join(self._engine.target.token_bytes(t) for t in self._tokens)
        rest = whole.decode("utf-8", errors="replace")[len("".join(self._text)) :]
        return next((stop for stop in self._job.stop if stop and rest.startswith(stop)), None)

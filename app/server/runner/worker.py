"""The Runner that owns the Engine in a thread of this process: loads it, runs queued jobs side by side,
swaps or drops it. Loads and unloads travel the jobs' queue as controls."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Final

from app.engine.engine import Engine
from app.engine.errors import ContextLengthExceeded, EngineError
from app.engine.generation import GenerationRequest
from app.engine.grammar import vocab_pointer
from app.engine.prompts import Prompt
from app.engine.stats import SpecStats
from app.server.metrics import Metrics
from app.server.runner.base import (
    END,
    Busy,
    Events,
    Job,
    Loader,
    NotReady,
    PromptCount,
    QueueFull,
    ShuttingDown,
    Stage,
    Started,
)
from app.server.runner.pieces import Pieces

log = logging.getLogger("foresight.worker")


@dataclass
class _Control:
    """Load an Engine (loader) or only drop the current one (loader None)."""

    loader: Loader | None
    events: Events = field(default_factory=queue.Queue)


class Worker:
    """Owns the Engine in its own thread and serves jobs from a bounded queue, in FIFO order.

    Jobs run side by side in the Engine's batch (continuous batching): between two steps the thread takes
    the next queued job when a KV slot is idle, renders it and opens its stream; a job that finds no room
    in the KV waits, first in line, until a stream ends. A queued job whose client has gone is dropped
    before it is rendered. States: loading -> ready | failed; ready -> loading (another pair) | unloading
    -> unloaded; stopped. Jobs are accepted only when ready. A load or unload cancels the running jobs
    (their streams end with finish_reason "cancelled") and answers the waiting ones NotReady.
    """

    def __init__(self, load: Loader, queue_size: int) -> None:
        self._jobs: queue.Queue[Job | _Control | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._lock = threading.Lock()  # state changes and queue puts happen together
        self._state = "loading"
        self._engine: Engine | None = None  # the engine thread's own
        self._running: dict[Job, _Running] = {}  # the engine thread's; changed under the lock
        self._waiting: _Opening | None = None  # the next job, rendered, waiting for room in the KV
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
        """Jobs waiting for the engine: queued, or taken in and waiting for room in the KV."""
        return self._jobs.qsize() + (self._waiting is not None)

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

    def load(self, loader: Loader) -> Events:
        """Replace the loaded Engine (if any) by loader's; its Stages, then END (or an exception), follow."""
        return self._control(_Control(loader), "loading")

    def unload(self) -> Events:
        """Close the Engine and free its memory; jobs get NotReady until the next load."""
        return self._control(_Control(None), "unloading")

    def _control(self, control: _Control, state: str) -> Events:
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
        for job in self._running:
            job.cancel.set()
        if self._waiting is not None:
            self._waiting.job.results.put(reason)
            self._waiting = None
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
                item = self._next_item()
                if item is None:
                    break
                if isinstance(item, _Control):
                    self._drain()
                    self._apply(item)
                elif isinstance(item, Job):
                    self._admit(item)
                self._open_waiting()
                if self._running:
                    self._step()
        finally:
            self._drain()
            self._close_engine()
            with self._lock:  # nothing queued may wait for a thread that is gone
                self._stopping.set()
                self._state = "stopped"
                self._cancel_all(ShuttingDown("the engine stopped"))
            self.loaded.set()

    def _next_item(self) -> Job | _Control | _Idle | None:
        """The next queued item; blocks only while nothing runs. IDLE: none taken (nothing queued, no slot
        idle, or a job already waits for room)."""
        engine = self._engine
        if self._waiting is not None or (self._running and engine and not engine.slots.fits(1)):
            return IDLE  # no slot to open a job in: it stays queued (its client may still leave)
        try:
            return self._jobs.get(block=not self._running)
        except queue.Empty:
            return IDLE

    def _drain(self) -> None:
        """Run the open streams to their end (a load, an unload or a stop has cancelled them)."""
        while self._running:
            self._step()

    def _close_engine(self) -> None:
        engine, self._engine = self._engine, None
        self.props = None
        m = self.metrics
        m.kv_tokens = m.kv_cells = m.kv_slots_tokens = m.kv_slots_cells = 0
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

    def _admit(self, job: Job) -> None:
        """A job off the queue: dropped if its client left, else rendered and opened (or left waiting)."""
        engine = self._engine
        if job.cancel.is_set():  # the client left while the job waited: no rendering, no prefill
            self.metrics.dropped += 1
            job.results.put(END)
            return
        if engine is None:
            job.results.put(NotReady(self._state))
            return
        self.metrics.requests += 1
        prompt = None
        try:
            prompt = _render(engine, job)
            if job.count_only:
                job.results.put(PromptCount(len(prompt.tokens)))
                job.results.put(END)
                prompt.close()
                return
            opening = _Opening(job, prompt, _request(engine, job, prompt))
        except Exception as exc:
            if prompt is not None:
                prompt.close()
            self._failed(job, exc)
            return
        with self._lock:
            self._waiting = opening

    def _open_waiting(self) -> None:
        """Open the waiting job's stream where the KV has room for it now."""
        opening, engine = self._waiting, self._engine
        if opening is None or engine is None:
            return
        job = opening.job
        if job.cancel.is_set():  # its client left while it waited for room: it never prefilled
            self.metrics.dropped += 1
            self._waiting = None
            opening.prompt.close()
            job.results.put(END)
            return
        try:
            stream = engine.open_stream(opening.request, job.cancel, job.client, job)
        except Exception as exc:
            with self._lock:
                self._waiting = None
            opening.prompt.close()
            self._failed(job, exc)
            return
        if stream is None:
            return  # no room yet: it opens when a stream ends
        with self._lock:
            if self._waiting is not opening:  # a load or stop answered it meanwhile: it ends at once
                job.cancel.set()
            self._waiting = None
            self._running[job] = _Running(opening.prompt, Pieces(engine, job))
        job.results.put(Started())  # a long prompt's prefill can take minutes on a CPU

    def _step(self) -> None:
        """One batch step; each stream's chunk (or error) goes to its job."""
        engine = self._engine
        assert engine is not None
        try:
            outcomes = engine.step_streams()
        except Exception as exc:  # the step itself broke: every open stream ends with the error
            log.exception("batch step failed")
            outcomes = [(job, exc) for job in self._running]
            engine.scheduler.abort()
        for job, outcome in outcomes:
            if isinstance(outcome, Exception):
                self._close_job(engine, job)
                self._failed(job, outcome)
                continue
            if outcome.stats is not None:
                self.metrics.record(outcome.stats)
                _log_done(outcome.finish_reason, outcome.stats)
            job.results.put(self._running[job].pieces.of(outcome))
            if outcome.finish_reason is not None:
                self._close_job(engine, job)  # its figures are on /metrics before its client has the end
                job.results.put(END)

    def _failed(self, job: Job, exc: Exception) -> None:
        self.metrics.failed += 1
        if isinstance(exc, EngineError):
            log.info("request refused: %s", exc)
        else:
            log.error("request failed", exc_info=exc)
        job.results.put(exc)

    def _close_job(self, engine: Engine, job: Job) -> None:
        with self._lock:
            running = self._running.pop(job)
        running.prompt.close()  # an image prompt's libmtmd chunks
        try:
            self.props = engine.props()
            m = self.metrics
            m.kv_tokens, m.kv_cells = engine.slots.figures([engine.slots.last])
            m.kv_slots_tokens, m.kv_slots_cells = engine.slots.figures()
        except Exception:  # bookkeeping must not end the engine thread
            log.exception("after a request: engine figures unavailable")


class _Idle:
    def __repr__(self) -> str:
        return "IDLE"


IDLE: Final = _Idle()


@dataclass
class _Opening:
    """A rendered job whose stream is not open yet."""

    job: Job
    prompt: Prompt
    request: GenerationRequest


@dataclass
class _Running:
    prompt: Prompt
    pieces: Pieces


def _render(engine: Engine, job: Job) -> Prompt:
    if job.messages is not None:
        prompt = engine.render_chat(job.messages, job.tools, job.prefill)
    elif job.suffix is not None:
        prompt = engine.render_fim(job.text or "", job.suffix)
    else:
        prompt = engine.render_text(job.text or "")
    job.prompt_tokens = len(prompt.tokens)
    log.info("request: %d prompt tokens, at most %d new", len(prompt.tokens), job.max_tokens)
    return prompt


def _request(engine: Engine, job: Job, prompt: Prompt) -> GenerationRequest:
    """The job as the engine generates it; a prompt the context cannot hold is refused here, before any
    stream opens (as generate() says it)."""
    params = job.params
    if params.grammar is not None:
        params = replace(params, grammar=params.grammar.bound(vocab_pointer(engine.target)))
    if len(prompt.tokens) >= engine.target.n_ctx:
        raise ContextLengthExceeded(
            f"the prompt has {len(prompt.tokens)} tokens but the context holds {engine.target.n_ctx} "
            "(with room for one reply token)"
        )
    return GenerationRequest(
        prompt=prompt.tokens,
        params=params,
        max_tokens=job.max_tokens,
        stop=job.stop,
        draft_prompt=prompt.draft_prompt,
        speculative=job.speculative,
        media=prompt.media,
        reproducible=params.seed is not None,  # the API's promise: a seed gives one text
    )


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

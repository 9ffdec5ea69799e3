"""The one thread that owns the Engine: loads it, then runs queued jobs one at a time.

HTTP handlers never touch the Engine. They put a Job on a bounded queue; the engine thread sends back
values on the job's own results queue: Chunks, then END, or an exception object instead.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from app.engine.engine import Engine
from app.engine.errors import EngineError
from app.engine.generation import Chunk, GenerationRequest
from app.engine.sampling import SamplingParams
from app.engine.stats import SpecStats

log = logging.getLogger("foresight.worker")


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()
Result = Chunk | _End | BaseException


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class QueueFull(Exception):
    """queue_size jobs are already waiting."""


class ShuttingDown(Exception):
    """The server stopped before this job ran."""


@dataclass
class Job:
    """One generation: a chat (messages) or a raw text prompt, and where its results go."""

    params: SamplingParams
    max_tokens: int
    stop: list[str]
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    text: str | None = None
    speculative: bool = True
    results: queue.Queue[Result] = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)


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
        ]
        lines = []
        for name, kind, text, value in rows:
            lines += [f"# HELP foresight_{name} {text}", f"# TYPE foresight_{name} {kind}"]
            lines.append(f"foresight_{name} {value}")
        return "\n".join(lines) + "\n"


class Worker:
    """Loads the Engine in its own thread and serves jobs from a bounded queue, one at a time."""

    def __init__(self, load: Callable[[], Engine], queue_size: int) -> None:
        self._load = load
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._current: Job | None = None
        self._stopping = threading.Event()
        self.loaded = threading.Event()  # set when loading ended, well or not
        self.load_error: BaseException | None = None
        self.props: dict[str, Any] | None = None  # Engine.props() after load and after every job
        self.metrics = Metrics()

    @property
    def state(self) -> str:
        if not self.loaded.is_set():
            return "loading"
        return "failed" if self.load_error is not None else "ready"

    @property
    def queue_depth(self) -> int:
        return self._jobs.qsize()

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self.state != "ready" or self._stopping.is_set():
            raise NotReady(self.state)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running job, fail the waiting ones, and let the engine thread close the Engine."""
        self._stopping.set()
        current = self._current
        if current is not None:
            current.cancel.set()
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.results.put(ShuttingDown("the server is shutting down"))
        with contextlib.suppress(queue.Full):  # the engine thread also checks _stopping between jobs
            self._jobs.put(None, timeout=1.0)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the engine thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            engine = self._load()
            self.props = engine.props()
        except BaseException as exc:
            log.error("loading the model failed: %s", exc)
            self.load_error = exc
            self.loaded.set()
            return
        self.loaded.set()
        try:
            while not self._stopping.is_set():
                job = self._jobs.get()
                if job is None:
                    break
                self._current = job
                try:
                    self._serve(engine, job)
                finally:
                    self._current = None
        finally:
            engine.close()

    def _serve(self, engine: Engine, job: Job) -> None:
        if job.cancel.is_set():  # the client left while the job waited
            job.results.put(END)
            return
        self.metrics.requests += 1
        try:
            if job.messages is not None:
                prompt = engine.render_chat(job.messages, job.tools)
            else:
                prompt = engine.render_text(job.text or "")
            request = GenerationRequest(
                prompt.tokens, job.params, job.max_tokens, job.stop, prompt.draft_prompt, job.speculative
            )
            for chunk in engine.generate(request, job.cancel):
                if chunk.stats is not None:
                    self.metrics.record(chunk.stats)
                job.results.put(chunk)
        except Exception as exc:
            self.metrics.failed += 1
            if isinstance(exc, EngineError):
                log.info("request refused: %s", exc)
            else:
                log.exception("request failed")
            job.results.put(exc)
        else:
            job.results.put(END)
        self.props = engine.props()

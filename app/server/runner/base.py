"""What the routes and the model's owner exchange: jobs, their results, load stages, and the Runner face.

HTTP handlers never touch the Engine. They put a Job on a runner; the thread that owns the Engine sends back
values on the job's own results queue: Started, Pieces, then END, or an exception object instead. Loads and
unloads answer on their own events queue: Stages, then END. Two runners implement the face: the Worker (the
model in this process) and the ChildWorker (the model in a child process, where remote devices are used).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from app.engine.engine import Engine
from app.engine.generation import Chunk
from app.engine.sampling import SamplingParams
from app.server.metrics import Metrics
from app.server.runner.load import LoadRequest


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()


@dataclass(frozen=True)
class Started:
    """The prompt is rendered and fits: generation begins (a stream can send its headers now)."""


@dataclass(frozen=True)
class PromptCount:
    """The answer to a count-only job: the rendered prompt's length in tokens."""

    tokens: int


@dataclass(frozen=True)
class Logprob:
    """An emitted token's log-probability, with the best alternatives: tokens as their bytes."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...]


@dataclass
class Piece(Chunk):
    """A Chunk as the routes get it, with what only the runner can tell them."""

    logprobs: list[Logprob] | None = None  # per token of this piece, when the request asked
    stop_sequence: str | None = None  # on the last piece: the request's stop string that ended it


Result = Piece | Started | PromptCount | _End | BaseException


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
    client: str = ""  # who asked (the window, an API key's hash, a remote address): KV prefixes stay theirs
    results: queue.Queue[Result] = field(default_factory=queue.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    prompt_tokens: int | None = None  # set by the engine thread before the first result


@dataclass(frozen=True)
class Stage:
    """A step of a load: unloading, loading target, loading drafter, calibrating, ready (or unloaded)."""

    name: str
    elapsed_s: float


Events = queue.Queue[Stage | _End | BaseException]  # a load's or an unload's stages, then END
Progress = Callable[[str], None]  # hears each stage of a load by name; may raise to abandon it
Loader = Callable[[Progress], Engine]  # builds an Engine (a LoadRequest is one)


class Runner(Protocol):
    """What the routes, the admin routes and `serve` ask of the model's owner, in this process or a child."""

    load_error: BaseException | None
    loaded: threading.Event  # set when the first load ended, well or not
    metrics: Metrics

    @property
    def state(self) -> str:
        """loading, ready, failed, unloading, unloaded or stopped."""
        ...

    @property
    def queue_depth(self) -> int:
        """Jobs waiting for the engine."""
        ...

    @property
    def props(self) -> dict[str, Any] | None:
        """The loaded Engine's props (None: no model)."""
        ...

    def start(self) -> None: ...

    def submit(self, job: Job) -> None:
        """Queue a job; NotReady without a model, QueueFull over the bound."""
        ...

    def load(self, request: LoadRequest) -> Events:
        """Replace the loaded model by the request's; Busy while a load or unload runs."""
        ...

    def unload(self) -> Events:
        """Close the model and free its memory."""
        ...

    def stop(self, timeout: float = 10.0) -> bool:
        """Cancel the jobs and close the model; False if it is still busy after `timeout`."""
        ...

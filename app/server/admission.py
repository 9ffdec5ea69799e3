"""Fair admission to the one engine: a bounded FIFO wait, a cap per client, and Retry-After from the queue.

Every listener of the engine process admits through the same Admission (`for_worker`): the wait is the
worker's, whichever listener a request came in by. A request is admitted or refused before its job reaches
the worker:
- 503 `server_busy` when `queue_size` admitted jobs are already waiting to start;
- 429 `too_many_requests` when its client already has `per_client` jobs running or waiting.
Admitted jobs go to the worker's FIFO queue in admission order (admission and submission happen together in
the event loop), so they start in that order whoever sent them.

A job's results queue is its ticket's (`Results`): the engine thread's first put marks the job's start, its
END or error its finish. Jobs whose client left while they waited count for nobody. Retry-After comes from
the recent service times: the jobs ahead x the mean service time / the jobs running at once, at least 1 s.
"""

from __future__ import annotations

import itertools
import math
import queue
import statistics
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from app.server.errors import APIError
from app.server.runner.base import END

RECENT_JOBS = 32  # service times kept for Retry-After
UNMEASURED_SERVICE_S = 1.0  # the service time assumed before any job has finished


@dataclass(eq=False)
class Ticket:
    """One admitted job: its place in the admission order, its client, and when it started and finished."""

    number: int  # admission order, from 1
    client: str
    cancel: threading.Event  # set when the client left (or the job was cancelled)
    admitted_at: float = field(default_factory=time.monotonic)
    start_number: int | None = None  # the order in which admitted jobs left the wait, from 1
    started_at: float | None = None
    ran: bool = False  # its first result was not its last (it was not dropped or refused outright)

    @property
    def waiting(self) -> bool:
        """Admitted, not started, and its client is still there."""
        return self.started_at is None and not self.cancel.is_set()

    @property
    def waited_s(self) -> float | None:
        return None if self.started_at is None else self.started_at - self.admitted_at

    def headers(self) -> dict[str, str]:
        """Response headers that show the admission: the ticket, the start order and the wait in seconds."""
        out = {"X-Foresight-Ticket": str(self.number)}
        if self.start_number is not None:
            out["X-Foresight-Start"] = str(self.start_number)
        if self.waited_s is not None:
            out["X-Foresight-Waited"] = f"{self.waited_s:.3f}"
        return out


class Results(queue.Queue[Any]):
    """A job's results queue that tells the admission when the engine thread starts and ends the job."""

    def __init__(self, admission: Admission, ticket: Ticket) -> None:
        super().__init__()
        self.admission = admission
        self.ticket = ticket

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        self.admission.on_result(self.ticket, item)  # before the put: a reader sees the ticket stamped
        super().put(item, block, timeout)


@dataclass
class Counters:
    """Admission figures since start, for /metrics."""

    admitted: int = 0
    rejected_busy: int = 0  # 503 server_busy: the wait was full
    rejected_client: int = 0  # 429 too_many_requests: the client was at its cap
    longest_wait_s: float = 0.0


class Admission:
    """The wait in front of the worker: bounded, FIFO, with a cap per client (thread-safe)."""

    def __init__(self, queue_size: int, per_client: int) -> None:
        self.queue_size = queue_size
        self.per_client = per_client
        self.counters = Counters()
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._start_numbers = itertools.count(1)
        self._open: list[Ticket] = []  # admitted and not finished, in admission order
        self._service_s: deque[float] = deque(maxlen=RECENT_JOBS)

    def admit(self, client: str, cancel: threading.Event) -> Results:
        """A ticket for the client's job, as the results queue the job must use; else 503 or 429."""
        with self._lock:
            waiting = [t for t in self._open if t.waiting]
            if len(waiting) >= self.queue_size:
                self.counters.rejected_busy += 1
                retry = self._retry_after(len(waiting))
                raise APIError(
                    503,
                    f"the engine is busy: {len(waiting)} requests are waiting (the most this server queues); "
                    f"retry in {retry} s",
                    "server_busy",
                    headers={"Retry-After": str(retry)},
                )
            own = [t for t in self._open if t.client == client and not t.cancel.is_set()]
            if len(own) >= self.per_client:
                self.counters.rejected_client += 1
                retry = self._own_retry_after(own)
                raise APIError(
                    429,
                    f"too many requests at once: this client has {len(own)} running or waiting, the most "
                    f"this server takes from one client (server.per_client); retry in {retry} s",
                    "too_many_requests",
                    headers={"Retry-After": str(retry)},
                )
            ticket = Ticket(next(self._numbers), client, cancel)
            self._open.append(ticket)
            self.counters.admitted += 1
        return Results(self, ticket)

    def withdraw(self, ticket: Ticket) -> None:
        """The worker did not take the job (no model, its queue full): it holds no place."""
        with self._lock:
            if ticket in self._open:
                self._open.remove(ticket)

    def busy(self, ticket: Ticket) -> APIError:
        """503 server_busy for a job the worker's own queue had no room for (jobs of clients that left)."""
        self.withdraw(ticket)
        with self._lock:
            self.counters.rejected_busy += 1
            retry = self._retry_after(sum(t.waiting for t in self._open) or 1)
        return APIError(
            503, "the engine is busy; retry shortly", "server_busy", headers={"Retry-After": str(retry)}
        )

    def on_result(self, ticket: Ticket, item: Any) -> None:
        """The engine thread's every result: the first starts the ticket, END or an error ends it."""
        now = time.monotonic()
        last = item is END or isinstance(item, BaseException)
        with self._lock:
            if ticket.started_at is None:
                ticket.started_at, ticket.start_number, ticket.ran = now, next(self._start_numbers), not last
                if ticket.ran:
                    self.counters.longest_wait_s = max(self.counters.longest_wait_s, now - ticket.admitted_at)
            if not last or ticket not in self._open:
                return
            self._open.remove(ticket)
            if ticket.ran:
                self._service_s.append(now - ticket.started_at)

    def waiting(self) -> int:
        with self._lock:
            return sum(t.waiting for t in self._open)

    # --- Retry-After (called with the lock held) ---------------------------------------------------------
    def _service(self) -> float:
        return statistics.fmean(self._service_s) if self._service_s else UNMEASURED_SERVICE_S

    def _running(self) -> int:
        return max(1, sum(t.started_at is not None for t in self._open))

    def _retry_after(self, ahead: int) -> int:
        """Seconds until the jobs ahead have started, at the recent service rate; at least 1."""
        return max(1, math.ceil(ahead * self._service() / self._running()))

    def _own_retry_after(self, own: list[Ticket]) -> int:
        """Seconds until the client's first job is likely to end: a running one's remaining mean service
        time, or a waiting one's place in the wait plus its own service; at least 1."""
        service, running, now = self._service(), self._running(), time.monotonic()
        waiting = [t for t in self._open if t.waiting]
        estimates = []
        for ticket in own:
            if ticket.started_at is not None:
                estimates.append(service - (now - ticket.started_at))
            else:
                estimates.append((waiting.index(ticket) + 1) * service / running + service)
        return max(1, math.ceil(min(estimates)))

    def prometheus(self) -> str:
        """The admission's lines of /metrics."""
        with self._lock:
            waiting = sum(t.waiting for t in self._open)
            counters = Counters(**vars(self.counters))
        rows = [
            ("admitted_total", "counter", "requests admitted to the engine's wait", counters.admitted),
            (
                "rejected_busy_total",
                "counter",
                "requests refused with 503 server_busy (the wait was full)",
                counters.rejected_busy,
            ),
            (
                "rejected_client_cap_total",
                "counter",
                "requests refused with 429 too_many_requests (their client was at server.per_client)",
                counters.rejected_client,
            ),
            ("waiting", "gauge", "admitted requests waiting to start", waiting),
            (
                "wait_seconds_max",
                "gauge",
                "longest wait from admission to start since the engine started",
                round(counters.longest_wait_s, 3),
            ),
        ]
        lines = []
        for name, kind, text, value in rows:
            lines += [f"# HELP foresight_{name} {text}", f"# TYPE foresight_{name} {kind}"]
            lines.append(f"foresight_{name} {value}")
        return "\n".join(lines) + "\n"


_shared: weakref.WeakKeyDictionary[Any, Admission] = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()  # the public listener's app is made in a thread


def for_worker(worker: Any, queue_size: int, per_client: int) -> Admission:
    """The one Admission of a worker, shared by every listener over it (made by the first)."""
    with _shared_lock:
        admission = _shared.get(worker)
        if admission is None:
            admission = _shared[worker] = Admission(queue_size, per_client)
        return admission

"""The model in a child of the HTTP server, where remote devices are used: a worker lost mid-generation
ends only the child, the client gets an error event, and the engine comes back on this machine's devices.

ggml-rpc ends every failed send or receive in GGML_ABORT, and ggml_abort calls abort() even with an abort
callback set: the process that holds a model spread over RPC workers dies with a worker. `ChildWorker` is a
Runner (submit, load, unload, stop, state, props, metrics) whose real Worker and Engine run in
`python -m app serve --engine-child`, over an authenticated loopback connection (multiprocessing.connection);
loads cross it as LoadRequests (paths and settings). When the child dies unasked, the jobs in flight get
RemoteDeviceLost (their streams end with an error event), and a new child loads the last pair again with
the workers left out; /props says why (`rpc.reason`).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import pickle
import queue
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, fields
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from app.addresses import parse_endpoints
from app.devices import rpc
from app.engine.errors import EngineError
from app.server.metrics import Metrics
from app.server.runner.base import END, Busy, Events, Job, NotReady, QueueFull, ShuttingDown
from app.server.runner.load import LoadRequest
from app.server.runner.wire import from_wire, send, to_wire
from app.server.runner.worker import Worker

log = logging.getLogger("foresight.engine_child")

CHILD_FLAG = "--engine-child"
CONNECT_TIMEOUT_S = 120.0  # a cold start imports llama.cpp before it connects
CANCEL_POLL_S = 0.05
STATUS_POLL_S = 0.05
STDERR_LINES = 40
_JOB_FIELDS = [f.name for f in fields(Job) if f.name not in ("results", "cancel", "prompt_tokens")]


class RemoteDeviceLost(EngineError):
    """The engine process ended under a generation (ggml-rpc aborts it when a worker stops answering)."""

    code = "remote_device_lost"


# --- the parent: what the routes see -----------------------------------------------------------------
class ChildWorker:
    """Worker's face for the routes, with the Worker itself in a child process (see the module)."""

    def __init__(self, load: LoadRequest, queue_size: int, rpc_servers: str, log_level: str = "INFO") -> None:
        self._queue_size = queue_size
        self._rpc_servers = rpc_servers
        self._log_level = log_level
        self._request = load  # the last pair asked for: a new child loads it again
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._state = "loading"
        self._stopping = threading.Event()
        self._jobs: dict[int, Job] = {}
        self._cancelled: set[int] = set()
        self._controls: dict[int, queue.Queue[Any]] = {}
        self._controls_sent = 0
        self._ids = itertools.count(1)
        self._child_props: dict[str, Any] | None = None
        self._lost = ""  # why the workers were left out; "" while they serve
        self._restarts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._respawn = threading.Event()  # the child ended unasked: the supervising thread starts another
        self.loaded = threading.Event()
        self.load_error: BaseException | None = None
        self.metrics = Metrics()

    # what the routes read
    @property
    def state(self) -> str:
        return self._state

    @property
    def queue_depth(self) -> int:
        return max(0, len(self._jobs) - 1)

    @property
    def props(self) -> dict[str, Any] | None:
        if self._child_props is None:
            return None
        servers = [str(e) for e in parse_endpoints(self._rpc_servers)]
        state = {"servers": servers, "state": "lost" if self._lost else "joined", "reason": self._lost}
        return {**self._child_props, "rpc": {**state, "engine_restarts": self._restarts}}

    def start(self) -> None:
        # Every child starts from this one thread, alive as long as the server: PR_SET_PDEATHSIG (the
        # child's app.server.parent watch) fires when the *thread* that started the child ends.
        threading.Thread(target=self._supervise, name="engine-child", daemon=True).start()
        threading.Thread(target=self._forward_cancels, name="engine-child-cancels", daemon=True).start()

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            try:
                self._spawn()
            except EngineError as exc:
                with self._lock:
                    self.load_error, self._state = exc, "failed"
                self.loaded.set()
                return
            self._respawn.wait()
            self._respawn.clear()

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._state != "ready" or self._stopping.is_set() or self._conn is None:
                raise NotReady(self._state)
            if len(self._jobs) > self._queue_size:  # one running, queue_size waiting
                raise QueueFull
            job_id = next(self._ids)
            self._jobs[job_id] = job
            spec = {name: getattr(job, name) for name in _JOB_FIELDS}
            self._send("submit", job_id, spec)

    def load(self, request: LoadRequest) -> Events:
        return self._control("loading", request)

    def unload(self) -> Events:
        return self._control("unloading", None)

    def _control(self, state: str, request: LoadRequest | None) -> Events:
        with self._lock:
            if self._stopping.is_set():
                raise ShuttingDown("the server is shutting down")
            if self._state in ("loading", "unloading"):
                raise Busy(f"a model is {self._state}; wait for it to finish")
            events: Events = queue.Queue()
            control_id = next(self._ids)
            self._controls[control_id] = events
            self._controls_sent += 1
            self._state = state
            if request is not None:
                self._request = request
            self._send("load" if request is not None else "unload", control_id, request)
        return events

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the child: its Worker cancels the running job (which ends "cancelled") and fails the waiting
        ones, and closes the Engine; one still inside a model load after `timeout` is killed."""
        with self._lock:
            self._stopping.set()
            proc = self._proc
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    self._send("stop")
        ended = True
        if proc is not None:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:  # a model load cannot be interrupted: the OS frees it
                proc.kill()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    ended = False
        with self._lock:
            self._fail_pending(ShuttingDown("the server is shutting down"))
            self._state = "stopped"
        self.loaded.set()
        return ended

    # the child process
    def _send(self, *message: Any) -> None:
        assert self._conn is not None
        send(self._conn, self._send_lock, *message)

    def _spawn(self) -> None:
        authkey = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        command = [sys.executable] if getattr(sys, "frozen", False) else [sys.executable, "-m", "app"]
        command += ["--log-level", self._log_level, "serve", CHILD_FLAG]
        env = {k: v for k, v in os.environ.items() if k not in ("FORESIGHT_API_KEY", "FORESIGHT_ADMIN_TOKEN")}
        env["GGML_NO_BACKTRACE"] = "1"  # an abort would attach gdb for a backtrace: seconds, and a screenful
        proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
        )
        assert proc.stdin is not None
        # the key goes on stdin, never argv (other local users can read command lines)
        proc.stdin.write(
            (json.dumps({"port": listener.address[1], "authkey": authkey.hex()}) + "\n").encode()
        )
        proc.stdin.close()
        self._stderr.clear()
        threading.Thread(target=self._pump_output, args=(proc,), name="engine-child-log", daemon=True).start()
        accepted: list[Connection] = []
        accepting = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
        accepting.start()
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while not accepted and proc.poll() is None and time.monotonic() < deadline:
            accepting.join(0.2)
        listener.close()
        if not accepted:
            proc.kill()
            proc.wait(5)
            tail = "; ".join(list(self._stderr)[-3:])
            raise EngineError(
                f"the engine process did not start ({_exit_words(proc.returncode, [])}): {tail}"
            )
        conn = accepted[0]
        self._proc, self._conn = proc, conn
        remote_off = self._lost
        self._send("init", self._queue_size + 2, remote_off, self._request)
        threading.Thread(target=self._read, args=(proc, conn), name="engine-child-read", daemon=True).start()

    def _pump_output(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self._stderr.append(line)
            print(line, file=sys.stderr, flush=True)  # the engine's log, as one process would write it

    def _read(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        try:
            while True:
                message = pickle.loads(conn.recv_bytes())
                self._on_message(*message)
        except (EOFError, OSError):
            pass
        self._ended(proc)

    def _on_message(self, kind: str, *rest: Any) -> None:
        if kind == "result":
            job_id, item, prompt_tokens = rest
            with self._lock:
                job = self._jobs.get(job_id)
                item = from_wire(item)
                if job is not None and (item is END or isinstance(item, BaseException)):
                    del self._jobs[job_id]
                    self._cancelled.discard(job_id)
            if job is not None:
                if prompt_tokens is not None:
                    job.prompt_tokens = prompt_tokens
                job.results.put(item)
        elif kind == "stage":
            control_id, item = rest
            item = from_wire(item)
            events = self._controls.get(control_id)
            if events is not None:
                events.put(item)
                if item is END:
                    self._controls.pop(control_id, None)
        elif kind == "status":
            seen, state, props, load_error, metrics, loaded = rest
            with self._lock:
                if seen < self._controls_sent:  # from before a load or unload the child has not had yet
                    return
                self._state = state
                self._child_props = props
                self.load_error = load_error
                for name, value in metrics.items():
                    setattr(self.metrics, name, value)
            if loaded:
                self.loaded.set()

    def _ended(self, proc: subprocess.Popen[bytes]) -> None:
        """The child is gone: asked to (stop), or not (a worker was lost, or it crashed)."""
        try:
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(5)
        with self._lock:
            self._conn = None
            if self._stopping.is_set():
                self._fail_pending(ShuttingDown("the server is shutting down"))
                self._state = "stopped"
                return
        why = _exit_words(code, list(self._stderr))
        workers = parse_endpoints(self._rpc_servers)
        down = [
            a.endpoint for a in rpc.check_all(workers, timeout=2.0) if a.state in ("unreachable", "error")
        ]
        which = ", ".join(down or [str(e) for e in workers])
        with self._lock:
            if self._stopping.is_set():
                self._fail_pending(ShuttingDown("the server is shutting down"))
                return
            if self._lost:
                error = EngineError(f"the engine process ended ({why}) on this machine's devices alone")
                log.error("%s", error)
                self._fail_pending(error)
                self.load_error, self._state = error, "failed"
                self.loaded.set()
                return
            self._lost = f"the RPC worker {which} was lost: the engine process ended ({why})"
            self._restarts += 1
            log.error("%s; loading again on this machine's devices", self._lost)
            self._fail_pending(
                RemoteDeviceLost(
                    f"{self._lost}; the engine is loading again on this machine's devices: retry"
                )
            )
            self._state = "loading"
            self._controls_sent = 0
        self._respawn.set()

    def _fail_pending(self, error: BaseException) -> None:
        """Every job and load in flight ends with `error` (called with the lock held)."""
        for job in self._jobs.values():
            job.results.put(error)
        self._jobs.clear()
        self._cancelled.clear()
        for events in self._controls.values():
            events.put(error)
            events.put(END)
        self._controls.clear()

    def _forward_cancels(self) -> None:
        while not self._stopping.wait(CANCEL_POLL_S):
            with self._lock:
                wanted = [
                    i for i, job in self._jobs.items() if job.cancel.is_set() and i not in self._cancelled
                ]
                for job_id in wanted:
                    self._cancelled.add(job_id)
                    if self._conn is not None:
                        with contextlib.suppress(OSError):
                            self._send("cancel", job_id)


_NATIVE_ABORT = re.compile(r"\.(?:c|cpp|cu|m):\d+: (.+)$")  # ggml_abort's "file:line: message"


def _exit_words(code: int | None, lines: list[str]) -> str:
    if code is None:
        return "still running"
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    said = next((m.group(1) for line in reversed(lines) if (m := _NATIVE_ABORT.search(line.strip()))), "")
    return f"{how}, ggml: {said.strip()}" if said else how


# --- the child: the real Worker ------------------------------------------------------------------------
def child_main() -> int:
    """`serve --engine-child`: connect to the parent, run its loads and jobs on a Worker until told to
    stop or the parent goes."""
    from app.devices import placement
    from app.server import parent

    hello = json.loads(sys.stdin.readline())
    parent.watch(os.getppid())  # a SIGKILLed server takes its engine with it
    conn = Client(("127.0.0.1", hello["port"]), authkey=bytes.fromhex(hello["authkey"]))
    send_lock = threading.Lock()
    kind, queue_size, remote_off, request = pickle.loads(conn.recv_bytes())
    assert kind == "init"
    if remote_off:
        placement.leave_out_remote(remote_off)
    worker = Worker(request, queue_size)
    jobs: dict[int, Job] = {}
    controls = [0]  # loads and unloads received: the parent drops status sent before its latest one
    last: list[Any] = [None]

    def send_status(force: bool = False) -> None:
        """The Worker's state, props, load error and metrics, when any changed."""
        seen = (controls[0], worker.state, id(worker.props), id(worker.load_error), worker.loaded.is_set())
        if force or seen != last[0]:
            last[0] = seen
            send(conn, send_lock, "status", controls[0], worker.state, worker.props, worker.load_error,
                  asdict(worker.metrics), worker.loaded.is_set())  # fmt: skip

    def watch_status() -> None:
        while worker.state != "stopped":
            time.sleep(STATUS_POLL_S)
            send_status()

    def relay(job_id: int, job: Job) -> None:
        while True:
            item = job.results.get()
            if item is END or isinstance(item, BaseException):
                jobs.pop(job_id, None)
                send_status(force=True)  # the props and metrics after the job, before its end
            send(conn, send_lock, "result", job_id, to_wire(item), job.prompt_tokens)
            if item is END or isinstance(item, BaseException):
                return

    def relay_control(control_id: int, events: queue.Queue[Any]) -> None:
        while True:
            item = events.get()
            send_status()  # a "ready" stage finds the new props already there
            send(conn, send_lock, "stage", control_id, to_wire(item))
            if item is END:
                return

    worker.start()
    threading.Thread(target=watch_status, name="status", daemon=True).start()
    try:
        while True:
            kind, *rest = pickle.loads(conn.recv_bytes())
            if kind == "submit":
                job_id, spec = rest
                job = Job(**spec)
                jobs[job_id] = job
                try:
                    worker.submit(job)
                except (NotReady, QueueFull) as exc:
                    job.results.put(exc)
                threading.Thread(target=relay, args=(job_id, job), daemon=True).start()
            elif kind == "cancel":
                job = jobs.get(rest[0])
                if job is not None:
                    job.cancel.set()
            elif kind in ("load", "unload"):
                control_id, request = rest
                controls[0] += 1
                try:
                    events = worker.load(request) if kind == "load" else worker.unload()
                except (Busy, ShuttingDown) as exc:
                    events = queue.Queue()
                    events.put(exc)
                    events.put(END)
                threading.Thread(target=relay_control, args=(control_id, events), daemon=True).start()
            elif kind == "stop":
                break
    except (EOFError, OSError):
        pass  # the server went
    stopped = worker.stop(10.0)
    if not stopped:  # inside a model load, which cannot be interrupted: the OS frees it
        os._exit(0)
    return 0

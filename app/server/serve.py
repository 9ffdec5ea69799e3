"""`python -m app serve`: the private listener answers while the models load, READY, a clean SIGTERM, and
an end with the window that started it (app.server.parent; its lock file in app.lockfile)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable

from app import lockfile
from app.addresses import is_loopback
from app.config import ConfigError, Settings
from app.logs import install_excepthooks
from app.server import parent
from app.server.admin import Admin, mount
from app.server.app import create_app
from app.server.listeners import Listener, bind
from app.server.runner.base import Runner
from app.server.runner.load import LoadRequest
from app.server.runner.worker import Worker

log = logging.getLogger("foresight.serve")
# Secrets come from the environment or stdin, never from argv (other local users can read command lines).
API_KEY_ENV = "FORESIGHT_API_KEY"
ADMIN_TOKEN_ENV = "FORESIGHT_ADMIN_TOKEN"
STOP_TIMEOUT_S = 5.0  # the engine thread ends a cancelled generation within one step


def admin_token(from_stdin: bool) -> str | None:
    """The GUI's per-launch token: one line on stdin with --token-stdin, else FORESIGHT_ADMIN_TOKEN."""
    token = os.environ.pop(ADMIN_TOKEN_ENV, "")  # not inherited by any child process
    if from_stdin:
        token = sys.stdin.readline().strip()
        if not token:
            raise ConfigError("--token-stdin: the first line on stdin is empty")
    return token or None


def _on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except NotImplementedError:  # Windows: no loop signal handlers
            signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop))


async def _run(private: Listener, admin: Admin, worker: Runner) -> bool:
    """Serve until SIGTERM/SIGINT (or a failed first load); False if the first load failed."""
    stop = asyncio.Event()
    _on_signals(asyncio.get_running_loop(), stop.set)
    await private.start()
    assert private.task is not None
    private.task.add_done_callback(lambda _: stop.set())
    while not worker.loaded.is_set() and not stop.is_set():
        await asyncio.sleep(0.02)
    loaded_well = worker.load_error is None
    if not loaded_well:
        stop.set()
    elif not stop.is_set():
        log.info("ready on port %d", private.port)
        print(f"READY port={private.port}", flush=True)
    await stop.wait()
    log.info("stopping")
    listeners = [listener for listener in (admin.public, private) if listener is not None]
    for listener in listeners:  # all at once: no listener takes new work while another drains
        listener.refuse_new()
    await asyncio.gather(*(listener.close() for listener in listeners))
    return loaded_well


def serve(args: argparse.Namespace, settings: Settings) -> int:
    install_excepthooks()  # a thread's uncaught error reaches the log the window shows, with its traceback
    if getattr(args, "engine_child", False):  # the model's own process, under a server using RPC workers
        from app.server.runner.child import child_main

        return child_main()
    parent_pid = getattr(args, "parent_pid", None)
    if parent_pid:  # started by a window: end with it
        parent.watch(parent_pid)
    api_key = os.environ.pop(API_KEY_ENV, None) or None  # child processes need not see it
    token = admin_token(getattr(args, "token_stdin", False))
    host = settings.server.host
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"refusing to listen on {host} (not loopback) without an API key: set {API_KEY_ENV}"
        )
    if token and not is_loopback(host):
        raise ConfigError(f"the admin routes are served on loopback only, not on {host}")

    sock = bind(host, settings.server.port)
    # a window's engine says who it is, so that a later window can end it if it outlives this one
    port = sock.getsockname()[1]
    lock = lockfile.write(lockfile.EngineRecord.for_this_process(port, token, parent_pid)) if token else None
    draft = getattr(args, "draft", None)
    request = LoadRequest.of(settings, args.target, draft)
    worker: Runner
    if settings.engine.rpc:  # a lost RPC worker aborts the process that holds the model: that is a child
        from app.server.runner.child import ChildWorker

        level = getattr(args, "log_level", "INFO")
        worker = ChildWorker(request, settings.server.queue_size, settings.engine.rpc, level)
    else:
        worker = Worker(request, settings.server.queue_size)
    app = create_app(worker, settings, api_key, sock.getsockname()[1], admin_token=token)
    admin = Admin(worker, settings)
    mount(app, admin)
    private = Listener(app, sock, host)
    worker.start()
    try:
        with asyncio.Runner(loop_factory=private.server.config.get_loop_factory()) as runner:
            loaded_well = runner.run(_run(private, admin, worker))
    finally:
        stopped = worker.stop(STOP_TIMEOUT_S)
        sock.close()
        if lock is not None:
            lock.unlink(missing_ok=True)
    if not stopped:
        # The engine thread is inside a model load, which cannot be interrupted; letting the interpreter
        # shut down around it crashed (SIGSEGV). The OS frees the model's memory.
        log.warning("a model is still loading; exiting without waiting for it")
        logging.shutdown()
        sys.stdout.flush()
        os._exit(0)
    if not loaded_well and worker.load_error is not None:
        raise worker.load_error
    return 0

"""`python -m app serve`: bind, load the models while uvicorn answers, print `READY port=<n>` when up."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import threading
import time

import uvicorn

from app.config import ConfigError, Settings
from app.engine.engine import Engine
from app.engine.server import create_app
from app.engine.worker import Worker

log = logging.getLogger("foresight.serve")
API_KEY_ENV = "FORESIGHT_API_KEY"  # secrets come from the environment, never from argv


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    name = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")  # clients try IPv4 first
    family, kind, proto, _, address = socket.getaddrinfo(
        name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


def _announce(server: uvicorn.Server, worker: Worker, port: int) -> None:
    """Print READY once the model is loaded and uvicorn is accepting; stop the server if loading failed."""
    worker.loaded.wait()
    if worker.load_error is not None:
        server.should_exit = True
        return
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.01)
    log.info("ready on port %d", port)
    print(f"READY port={port}", flush=True)


def serve(args: argparse.Namespace, settings: Settings) -> int:
    api_key = os.environ.get(API_KEY_ENV) or None
    host = settings.server.host
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"refusing to listen on {host} (not loopback) without an API key: set {API_KEY_ENV}"
        )

    def load() -> Engine:
        from app.catalog.packaged import resolve_model

        draft = resolve_model(args.draft) if getattr(args, "draft", None) else None
        return Engine(resolve_model(args.target), draft, settings)

    sock = bind(host, settings.server.port)
    port = sock.getsockname()[1]
    worker = Worker(load, settings.server.queue_size)
    app = create_app(worker, settings, api_key, port)
    config = uvicorn.Config(
        app,
        log_config=None,  # our handlers (stderr + rotating file) from setup_logging
        access_log=False,
        timeout_graceful_shutdown=3,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    worker.start()
    threading.Thread(target=_announce, args=(server, worker, port), name="announce", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        sock.close()
    if worker.load_error is not None:
        raise worker.load_error
    return 0

"""Listeners: each is its own uvicorn server on its own socket, in the one event loop of the engine process.

All of them serve the one shared Worker. Closing one (the public listener, at run time) leaves the
others serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from app.config import ConfigError
from app.server.hosts import WILDCARD_BINDS, as_host
from app.server.state import AppState

GRACE_S = 3  # a closing listener's open requests get this long before uvicorn cancels them


def bind(host: str, port: int) -> socket.socket:
    name = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")  # clients try IPv4 first
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (OSError, UnicodeError) as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals to serve.py, which stops every listener together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Listener:
    """One FastAPI app served by its own uvicorn server on its own socket, as a task of the running loop."""

    def __init__(self, app: FastAPI, sock: socket.socket, host: str) -> None:
        self.app = app
        self.state: AppState = app.state.foresight
        self.sock = sock
        self.host = host
        self.port: int = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,  # our handlers (stderr + rotating file) from setup_logging
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACE_S,
        )
        self.server = _Server(config)
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name=f"listener:{self.port}")
        while not self.server.started:
            if self.task.done():
                self.task.result()  # raises what stopped it
                raise OSError(f"the listener on port {self.port} stopped while starting")
            await asyncio.sleep(0.01)

    def refuse_new(self) -> None:
        """New requests get 503; running generations are cancelled, so their streams end ('cancelled')."""
        self.state.closing = True
        for job in list(self.state.jobs):
            job.cancel.set()

    async def close(self) -> None:
        self.refuse_new()
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.sock.close()

    def info(self) -> dict[str, Any]:
        url_host = "127.0.0.1" if self.host.strip("[]") in WILDCARD_BINDS else as_host(self.host)
        return {
            "open": True,
            "host": self.host,
            "port": self.port,
            "auth": self.state.api_key is not None,
            "url": f"http://{url_host}:{self.port}/v1",
        }

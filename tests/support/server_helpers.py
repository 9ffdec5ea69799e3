"""A real engine server in a subprocess: `python -m app serve --port 0`, its READY line, and a sure stop."""

from __future__ import annotations

import collections
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("FORESIGHT_API_KEY", "FORESIGHT_ADMIN_TOKEN")  # a test passes its own, never the caller's


class EngineServer:
    """A started `serve` process; stderr is kept (bounded) for failure messages; `stdin` is written first."""

    def __init__(
        self, args: list[str], env: Mapping[str, str] | None = None, stdin: str | None = None
    ) -> None:
        full_env = {k: v for k, v in os.environ.items() if k not in SECRETS}
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", *args],
            cwd=ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if stdin is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(stdin)
            self.proc.stdin.close()
        self.port: int | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._stdout: queue.Queue[str | None] = queue.Queue()
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._stdout.put), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True),
        ]
        for pump in self._pumps:
            pump.start()

    @staticmethod
    def _pump(stream: object, sink: Callable[[str | None], None]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink(line.rstrip("\n"))
        sink(None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 180.0) -> int:
        """Block until the READY line; fail with the server's last log lines if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._stdout.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no READY line in {timeout:.0f} s:\n{self.log_tail()}") from None
            if line is None:
                self.proc.wait(5)
                raise AssertionError(
                    f"server exited ({self.proc.returncode}) before READY:\n{self.log_tail()}"
                )
            if line.startswith("READY port="):
                self.port = int(line.split("=", 1)[1])
                return self.port

    def wait_exit(self, timeout: float = 60.0) -> int:
        """The exit code, once the process ended and its output was read to the end."""
        code = self.proc.wait(timeout)
        for pump in self._pumps:
            pump.join(5)
        return code

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(line for line in list(self.stderr)[-n:] if line is not None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextmanager
def engine_server(
    args: list[str], env: Mapping[str, str] | None = None, wait: bool = True, stdin: str | None = None
) -> Iterator[EngineServer]:
    """A server on an OS-chosen port (unless args say otherwise), always stopped on exit."""
    if "--port" not in args:
        args = [*args, "--port", "0"]
    server = EngineServer(args, env, stdin)
    try:
        if wait:
            server.wait_ready()
        yield server
    finally:
        server.stop()


def free_port() -> int:
    """A port that was free a moment ago (for watching /health before READY tells the port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

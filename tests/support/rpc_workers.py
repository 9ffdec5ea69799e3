"""Real RPC workers for tests: `python -m app rpc-worker` on loopback (CPU, one thread each), their READY
line, and a sure stop."""

from __future__ import annotations

import collections
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 90.0


class RpcWorker:
    """One started rpc-worker; its output is kept (bounded) for failure messages."""

    def __init__(self, *args: str) -> None:
        command = [
            sys.executable,
            "-m",
            "app",
            "rpc-worker",
            "--port",
            "0",
            "--device",
            "cpu",
            "--threads",
            "1",
        ]
        self.proc = subprocess.Popen(
            [*command, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.address = ""
        self.output: collections.deque[str] = collections.deque(maxlen=100)
        self._lines: queue.Queue[str | None] = queue.Queue()
        for stream, sink in ((self.proc.stdout, self._lines.put), (self.proc.stderr, self._keep)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    def _keep(self, line: str | None) -> None:
        if line is not None:
            self.output.append(line)

    @staticmethod
    def _pump(stream: object, sink: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink(line.rstrip("\n"))  # type: ignore[operator]
        sink(None)  # type: ignore[operator]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no READY line in {timeout:.0f} s: {list(self.output)[-10:]}") from None
            if line is None:
                raise AssertionError(f"rpc-worker exited ({self.proc.wait(10)}): {list(self.output)[-10:]}")
            self.output.append(line)
            if line.startswith("READY rpc="):
                self.address = line.split("=", 1)[1]
                return self.address

    def kill(self) -> None:
        """SIGKILL: the worker has no chance to say goodbye (its rpc-server ends with it)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextmanager
def rpc_workers(n: int = 2) -> Iterator[list[RpcWorker]]:
    """`n` workers on loopback, ready; stopped on exit."""
    with ExitStack() as stack:
        workers = []
        for _ in range(n):
            worker = RpcWorker()
            stack.callback(worker.stop)
            workers.append(worker)
        for worker in workers:
            worker.wait_ready()
        yield workers

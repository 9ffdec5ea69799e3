"""The frozen bundle's worker: `Foresight rpc-worker` runs the bundled rpc-server (llama_cpp/lib, beside the
backends and the libggml it links), which answers the handshake, and a frozen engine serves through it.

These run when the bundle has been built (`make installer`); with FORESIGHT_INSTALLER_TEST=1 a missing
bundle fails instead of skipping.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.addresses import parse_endpoint
from app.devices import rpc

ROOT = Path(__file__).resolve().parent.parent
EXE = ROOT / "build" / "installer" / "dist" / "Foresight" / "Foresight"

pytestmark = pytest.mark.slow


def _ready_line(log: Path, proc: subprocess.Popen[bytes], prefix: str, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        found = [line for line in log.read_text().splitlines() if line.startswith(prefix)]
        if found:
            return found[0][len(prefix) :]
        time.sleep(0.05)
    raise AssertionError(f"no {prefix} line: {log.read_text()[-2000:]}")


def test_the_frozen_worker_serves_a_frozen_engine(gemma_path: Path, tmp_path: Path) -> None:
    if not EXE.exists():
        if os.environ.get("FORESIGHT_INSTALLER_TEST") == "1":
            pytest.fail(f"no frozen bundle at {EXE}: run `make installer` first")
        pytest.skip("no frozen bundle: `make installer` builds it")
    env = {**os.environ, "FORESIGHT_HOME": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    worker_log, engine_log = tmp_path / "worker.log", tmp_path / "engine.log"
    with worker_log.open("w") as out:
        command = [str(EXE), "rpc-worker", "--port", "0", "--device", "cpu", "--threads", "1"]
        worker = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    engine = None
    try:
        address = _ready_line(worker_log, worker, "READY rpc=")
        assert rpc.hello(parse_endpoint(address)).version == ".".join(map(str, rpc.RPC_PROTO))
        with engine_log.open("w") as out:
            engine = subprocess.Popen(
                [str(EXE), "--engine", "--target", str(gemma_path), "--no-draft", "--port", "0", "--n-ctx",
                 "1024", "--device", "gpu", "--gpu-layers", "8", "--rpc", address],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        port = int(_ready_line(engine_log, engine, "READY port="))
        body = {"prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        props = httpx.get(f"http://127.0.0.1:{port}/props", timeout=30).json()
        assert props["rpc"]["state"] == "joined"
        assert "RPC0" in props["target"]["device_reason"]
    finally:
        for proc in (engine, worker):
            if proc is not None:
                proc.terminate()
                proc.wait(30)

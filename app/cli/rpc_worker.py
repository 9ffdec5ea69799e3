"""`python -m app rpc-worker`: this machine's devices for another machine's engine, through llama.cpp's
rpc-server (ggml-rpc): loopback unless the user allows the network, the protocol version checked."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.addresses import RPC_PORT, Endpoint, is_loopback
from app.catalog.fit import GIB
from app.devices import rpc
from app.processes import port_holder

READY_TIMEOUT_S = 60.0  # rpc-server loads every ggml backend (a GPU driver) before it listens
POLL_S = 0.2
EXPOSURE = (
    "rpc-server has no authentication and sends tensors unencrypted: whoever reaches {where} can allocate "
    "this machine's device memory, run computations on it and read the model's weights and activations"
)


class WorkerError(Exception):
    """The worker cannot start: a refused address, no binary, no device, a taken port."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rpc-worker",
        help="serve this machine's devices to another machine's engine (llama.cpp rpc-server)",
        description="Serve this machine's devices to an engine elsewhere (`serve --rpc HOST:PORT`). "
        "Loopback by default: reach it through an SSH tunnel (docs/REMOTE.md).",
    )
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto", help="what to serve (auto: "
                   "the GPUs llama.cpp sees here, else the CPU)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (not loopback: --allow-network)")
    p.add_argument("--port", type=int, default=RPC_PORT, help="TCP port (0: a free one)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for a CPU device (0: all cores)")
    p.add_argument(
        "--allow-network",
        action="store_true",
        help="listen on a non-loopback address: anyone who reaches it uses this machine unchecked",
    )


def rpc_server_binary() -> Path:
    """llama.cpp's rpc-server beside this build's backends: <site-packages>/bin from scripts/llama_build.py,
    llama_cpp/lib in the bundle (where ggml_backend_load_all finds them: the executable's folder)."""
    name = "rpc-server.exe" if sys.platform == "win32" else "rpc-server"
    places: list[Path] = []
    if getattr(sys, "frozen", False):
        places.append(Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "llama_cpp" / "lib")
    spec = importlib.util.find_spec("llama_cpp")
    if spec is not None and spec.origin:
        package = Path(spec.origin).resolve().parent
        places += [package.parent / "bin", package / "lib"]
    for place in places:
        if (place / name).is_file():
            return place / name
    raise WorkerError(
        "no rpc-server binary next to llama.cpp: build it with `make llama` "
        "(python3 scripts/llama_build.py rpc-server --python .venv/bin/python)"
    )


def _refuse_network(host: str, allow: bool) -> str:
    """'' for loopback; the exposure warning for an allowed network address; WorkerError otherwise."""
    if is_loopback(host):
        return ""
    where = f"{host} (every address of this machine)" if host in ("0.0.0.0", "::") else host
    exposure = EXPOSURE.format(where=where)
    if not allow:
        raise WorkerError(
            f"refusing to listen on {host}: it is not loopback. {exposure}. Keep the default 127.0.0.1 and "
            "reach it through an SSH tunnel (docs/REMOTE.md), or pass --allow-network on a network you trust"
        )
    return f"warning: listening on {where} for the network. {exposure}."


def _devices(device: str) -> list[tuple[str, str]]:
    """(llama.cpp's name, description) of each device to serve (rpc-server -d takes the names), read by
    the llama.cpp probe in a child; a software GPU (Mesa's lavapipe) is not served as one."""
    if device == "cpu":
        return [("CPU", "this machine's processor")]
    from app.devices.child import run_probe_in_child

    found = run_probe_in_child("llama.cpp")
    gpus = [
        (b.split(":", 1)[1], d.name)
        for d in found.devices
        if d.is_gpu
        for b in d.backends
        if b.startswith("llama.cpp:")
    ]
    if gpus:
        return gpus
    if device == "gpu":
        raise WorkerError(f"no GPU that this llama.cpp build can use here ({found.error or 'none found'}): "
                          "use --device cpu")  # fmt: skip
    return [("CPU", "this machine's processor: no GPU that llama.cpp can use was found")]


def _free_port(host: str, port: int) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            holder = port_holder(port) if port else None
            who = f" by {holder.describe()}" if holder is not None else ""
            raise WorkerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{who}") from None
        return probe.getsockname()[1]


def _end_with_parent() -> None:
    """In the child, before exec: the kernel ends it when this worker dies (Linux), even by SIGKILL."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


def start(
    binary: Path, host: str, port: int, threads: int, devices: list[str]
) -> tuple[subprocess.Popen[bytes], rpc.RemoteServer]:
    """rpc-server started and answering the handshake with this Foresight's protocol version."""
    command = [str(binary), "-H", host, "-p", str(port), "-t", str(threads), "-d", ",".join(devices)]
    linux = sys.platform.startswith("linux")
    # SIGPIPE stays ignored, as Python keeps it: rpc-server writes to clients with plain send(), and one
    # that left (a probe that gave up on a busy worker) would otherwise kill it.
    proc = subprocess.Popen(
        command,
        stdout=sys.stderr,
        stderr=sys.stderr,
        preexec_fn=_end_with_parent if linux else None,
        restore_signals=False,
    )
    endpoint = Endpoint(host if host not in ("0.0.0.0", "::") else "127.0.0.1", port)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise WorkerError(f"rpc-server ended (exit code {proc.returncode}) before it served: see above")
        answer = rpc.hello(endpoint, timeout=5.0, rounds=1)
        if answer.state == "ready":
            return proc, answer
        if answer.state == "version mismatch" or time.monotonic() > deadline:
            proc.terminate()
            proc.wait(10)
            problem = (
                answer.error if answer.state == "version mismatch" else f"no answer in {READY_TIMEOUT_S:g} s"
            )
            raise WorkerError(f"{binary}: {problem}; rebuild it with `make llama`")
        time.sleep(POLL_S)


def _threads(given: int) -> int:
    if given > 0:
        return given
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def run(args: argparse.Namespace) -> int:
    try:
        warning = _refuse_network(args.host, args.allow_network)
        binary = rpc_server_binary()
        devices = _devices(args.device)
        port = _free_port(args.host, args.port)
        proc, answer = start(binary, args.host, port, _threads(args.threads), [name for name, _ in devices])
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if warning:
        print(warning, file=sys.stderr)
    address = str(Endpoint(args.host, port))
    for (name, description), memory in zip(devices, answer.devices, strict=False):
        free, total = memory["free_bytes"] / GIB, memory["total_bytes"] / GIB
        print(f"serving {name} ({description}): {free:.1f} of {total:.1f} GiB free")
    print(f"RPC protocol {answer.version}; engines connect with: python -m app serve --rpc {address}")
    if is_loopback(args.host):
        print(
            f"from another machine, through an SSH tunnel: ssh -N -L {port}:127.0.0.1:{port} USER@THIS-HOST"
        )
    print(f"READY rpc={address}", flush=True)

    def stop(*_: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = proc.wait()
    return 0 if code in (0, -signal.SIGTERM) else code

"""A window's engine ends with its window, and says who it is in a lock file while it runs (real serve
processes on gemma-3-270m; the window here is a plain parent process that the test kills)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from app import lockfile, processes
from tests.support.server_helpers import ROOT, engine_server

GEMMA_ARGS = ["--ngram", "--n-ctx", "1024", "--n-threads", "1"]
TOKEN = "parent-token-0123456789"
END_S = 10.0  # the engine must be gone this long after its window


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not processes.alive(pid):
            return True
        time.sleep(0.1)
    return not processes.alive(pid)


def _port_free(port: int) -> bool:
    return processes.port_holder(port) is None


def test_the_lock_file_names_the_engine_its_window_port_and_token_while_it_runs(gemma_path: Path) -> None:
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--token-stdin", "--parent-pid", str(os.getpid())]
    with engine_server(args, stdin=TOKEN + "\n") as server:
        file = lockfile.path_of(server.proc.pid)
        record = json.loads(file.read_text())
        assert record == {
            "pid": server.proc.pid,
            "started": processes.start_time(server.proc.pid),
            "port": server.port,
            "token": TOKEN,
            "parent_pid": os.getpid(),
            "parent_started": processes.start_time(os.getpid()),
        }
        assert stat.S_IMODE(file.stat().st_mode) == 0o600  # it holds the token
        found = dict(lockfile.records())[file]
        assert found.running
        assert not found.orphaned  # this process, its window, runs
        server.proc.terminate()
        assert server.wait_exit(60) == 0
    assert not file.exists()  # a clean end takes the file away


def test_an_engine_whose_window_is_killed_exits_and_frees_its_ports(gemma_path: Path, tmp_path: Path) -> None:
    # The "window": a process that starts the engine as the GUI does (its pid on the command line, the
    # token on stdin), opens its public listener, prints the pids and ports, then waits to be killed.
    window = textwrap.dedent(
        f"""
        import json, os, subprocess, sys, httpx
        engine = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--target", {str(gemma_path)!r}, *{GEMMA_ARGS!r},
             "--port", "0", "--token-stdin", "--parent-pid", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        engine.stdin.write({TOKEN!r} + "\\n"); engine.stdin.close()
        for line in engine.stdout:
            if line.startswith("READY port="):
                port = int(line.split("=")[1]); break
        auth = {{"Authorization": "Bearer {TOKEN}"}}
        public = httpx.post(f"http://127.0.0.1:{{port}}/admin/public", json={{"port": 0}}, headers=auth,
                            timeout=60).json()["port"]
        print(json.dumps({{"engine": engine.pid, "port": port, "public": public}}), flush=True)
        engine.wait()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", window], cwd=ROOT, stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        engine, ports = started["engine"], (started["port"], started["public"])
        assert processes.alive(engine)
        assert all(processes.port_holder(p) is not None for p in ports)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert _gone_within(engine, END_S), "the engine outlived its window"
        assert all(_port_free(p) for p in ports)
        assert not lockfile.path_of(engine).exists()  # it ended cleanly (SIGTERM), taking its file away
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_an_engine_started_for_a_window_that_is_already_gone_ends_at_once(gemma_path: Path) -> None:
    # the parent pid it is given is not its parent: the window died before the engine could watch it
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    args = ["--target", str(gemma_path), *GEMMA_ARGS, "--parent-pid", str(gone.pid)]
    with engine_server(args, wait=False) as server:
        code = server.wait_exit(60)
        assert code == -signal.SIGTERM, server.log_tail()
        assert server.port is None  # it never served


def test_a_process_start_time_and_a_port_holder_are_read_from_proc() -> None:
    import socket

    fields = Path(f"/proc/{os.getpid()}/stat").read_text().rpartition(")")[2].split()
    assert processes.start_time(os.getpid()) == fields[19]  # field 22 of the whole line
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert processes.alive(child.pid)
        assert processes.start_time(child.pid) != processes.start_time(os.getpid())
    finally:
        child.kill()
        child.wait(30)
    assert not processes.alive(child.pid)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        holder = processes.port_holder(port)
        assert holder is not None
        assert holder.pid == os.getpid()
        assert f"(pid {os.getpid()})" in holder.describe()
        assert "python" in holder.describe().lower() or "pytest" in holder.describe().lower()
    assert processes.port_holder(port) is None

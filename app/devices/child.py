"""Device probes in child processes: the parent's side (one probe with a timeout, all of them side by side)
and the child's entry, `python -m app.devices.child --probe PATH`."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from app.devices.found import REMOTE, Discovery, ProbeResult
from app.devices.probe import PROBES
from app.devices.remote import probe_remote
from app.devices.report import report

PROBE_TIMEOUT_S = 20.0
PROBE_FLAG = "--device-probe"  # how a frozen build runs one probe in a child: Foresight --device-probe nvml
PLACEMENT_PROBES = ("nvml", "amd-sysfs", "llama.cpp", "metal", "cpu")  # what placement reads


# ---- the parent's side ----


def run_probe_in_child(path: str, timeout: float = PROBE_TIMEOUT_S, target: str = "") -> ProbeResult:
    """Run one probe in a child Python process; a hang or crash becomes this path's error."""
    if getattr(sys, "frozen", False):  # the bundle dispatches this flag itself (installer/entry.py)
        command = [sys.executable, PROBE_FLAG, path]
    else:
        command = [sys.executable, "-m", "app.devices.child", "--probe", path]
    if target:
        command = [sys.executable, "-c", target]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return ProbeResult(path, error=f"timed out after {timeout:g} s (the driver hung)")
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        return ProbeResult(path, error=f"probe crashed (exit code {done.returncode}) {tail[0]}".strip())
    try:
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ProbeResult(path, error="probe printed no result")
    return Discovery.from_json({"probes": [data]}).probes[0]


def discover(
    timeout: float = PROBE_TIMEOUT_S, paths: tuple[str, ...] = tuple(PROBES), rpc_servers: str = ""
) -> Discovery:
    """Discovery paths, each in its own child process so that one broken driver costs only itself; the
    children run side by side, so the whole takes as long as the slowest. `rpc_servers` (host:port,...)
    adds the RPC workers' probe."""
    paths = (*paths, f"{REMOTE}={rpc_servers}") if rpc_servers else paths
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        return Discovery(list(pool.map(lambda path: run_probe_in_child(path, timeout), paths)))


# ---- the child's side ----


def probe_main(path: str) -> int:
    """Run one discovery path and print its result as one JSON line (the child's half of a probe)."""
    if path.startswith(f"{REMOTE}="):
        print(json.dumps(asdict(probe_remote(path.partition("=")[2]))))
        return 0
    if path not in PROBES:
        print(f"unknown probe {path!r}: one of {', '.join(PROBES)}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(PROBES[path]())))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--probe"] and len(sys.argv) == 3:
        sys.exit(probe_main(sys.argv[2]))
    print(report(discover()))

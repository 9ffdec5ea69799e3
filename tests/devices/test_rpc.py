"""Remote devices seen from here: worker addresses, the ggml-rpc handshake against real rpc-server workers
(ready, down, busy, not a worker), the protocol version of the installed build, the rpc-worker command's
refusal of a network address, `devices --rpc`, and placement over remote devices."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.addresses import Endpoint, parse_endpoint
from app.catalog.fit import GIB, ModelShape, PairNeed
from app.config import ConfigError, load_settings
from app.devices import placement, rpc
from app.devices.found import Device
from app.devices.placement import UserChoice, place
from tests.support.rpc_workers import RpcWorker, rpc_workers

ROOT = Path(__file__).resolve().parents[2]


def test_the_setting_is_checked_and_written_back_normalised(tmp_path: Path) -> None:
    settings = load_settings(tmp_path / "none.toml", {"engine": {"rpc": " 127.0.0.1:5 , [::1]:7"}}, {})
    assert settings.engine.rpc == "127.0.0.1:5,[::1]:7"
    with pytest.raises(ConfigError, match=r"engine\.rpc"):
        load_settings(tmp_path / "none.toml", {"engine": {"rpc": "127.0.0.1"}}, {})
    from_env = load_settings(tmp_path / "none.toml", environ={"FORESIGHT_ENGINE__RPC": "h1:1,h2:2"})
    assert from_env.engine.rpc == "h1:1,h2:2"


def test_versions_are_judged_as_ggml_rpc_judges_them() -> None:
    major, minor, patch = rpc.RPC_PROTO
    assert rpc.version_problem((major, minor, patch + 3)) == ""
    assert rpc.version_problem((major, max(0, minor - 1), 0)) == ""
    newer = rpc.version_problem((major, minor + 1, 0))
    assert f"{major}.{minor + 1}.0" in newer
    assert "same Foresight" in newer
    assert rpc.version_problem((major + 1, 0, 0))


def test_the_protocol_version_is_the_installed_builds() -> None:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None
    assert spec.origin
    header = Path(spec.origin).resolve().parents[1] / "include" / "ggml-rpc.h"
    if not header.is_file():
        pytest.skip(f"this llama.cpp install has no headers beside it ({header})")
    text = header.read_text()
    found = tuple(int(re.search(rf"RPC_PROTO_{part}_VERSION\s+(\d+)", text).group(1))  # type: ignore[union-attr]
                  for part in ("MAJOR", "MINOR", "PATCH"))  # fmt: skip
    assert found == rpc.RPC_PROTO


def test_a_worker_answers_its_version_devices_and_round_trip() -> None:
    with rpc_workers(1) as (worker,):
        answer = rpc.hello(parse_endpoint(worker.address))
    assert answer.state == "ready", answer.error
    assert answer.version == ".".join(map(str, rpc.RPC_PROTO))
    assert len(answer.devices) == 1  # --device cpu
    assert 0 < answer.devices[0]["free_bytes"] <= answer.devices[0]["total_bytes"]
    assert answer.latency_ms is not None
    assert answer.latency_ms > 0
    assert any("serving CPU" in line for line in worker.output)


def test_a_worker_serving_another_client_reads_as_busy_and_frees_when_it_leaves() -> None:
    with rpc_workers(1) as (worker,):
        endpoint = parse_endpoint(worker.address)
        with socket.create_connection((endpoint.host, endpoint.port), timeout=10) as holder:
            holder.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))  # HELLO: now it is ours
            assert len(holder.recv(64)) > 0
            busy = rpc.hello(endpoint, timeout=1.0)
        assert busy.state == "busy"
        assert "serves another client" in busy.error
        assert rpc.hello(endpoint, timeout=10.0).state == "ready"


def test_down_and_foreign_servers_are_named_before_llama_cpp_meets_them() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{closed.getsockname()[1]}"
    with socket.socket() as foreign:  # answers with garbage, as an HTTP server would
        foreign.bind(("127.0.0.1", 0))
        foreign.listen()
        port = foreign.getsockname()[1]

        def answer_wrongly() -> None:
            conn, _ = foreign.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_wrongly, daemon=True)
        thread.start()
        answers = rpc.check_all([parse_endpoint(down), parse_endpoint(f"127.0.0.1:{port}")], 5.0)
        thread.join(10)
    assert [a.state for a in answers] == ["unreachable", "error"]
    assert down in answers[0].error
    with pytest.raises(rpc.RemoteError, match="cannot connect"):
        rpc.require_ready([parse_endpoint(down)])


def test_a_worker_of_another_protocol_version_is_named_with_both_versions() -> None:
    # no rpc-server of another version is at hand: this one answers the handshake as a newer one would
    newer = (rpc.RPC_PROTO[0] + 1, 0, 0)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()

        def answer_as_newer() -> None:
            conn, _ = other.accept()
            with conn:
                conn.recv(1 + 8 + 24)  # HELLO: command, size, connection capabilities
                conn.sendall((28).to_bytes(8, "little") + bytes([*newer, 0]) + bytes(24))

        thread = threading.Thread(target=answer_as_newer, daemon=True)
        thread.start()
        answer = rpc.hello(Endpoint("127.0.0.1", other.getsockname()[1]), timeout=10)
        thread.join(10)
    assert answer.state == "version mismatch"
    assert answer.version == ".".join(map(str, newer))
    assert (
        f"speaks RPC protocol {answer.version}, this Foresight speaks {'.'.join(map(str, rpc.RPC_PROTO))}"
        in (answer.error)
    )


def _worker_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "rpc-worker", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20"])
def test_a_network_address_without_allow_network_is_refused_and_says_why(host: str) -> None:
    done = _worker_command("--host", host, "--port", "0")
    assert done.returncode == 2
    assert f"refusing to listen on {host}: it is not loopback" in done.stderr
    assert "no authentication" in done.stderr
    assert "unencrypted" in done.stderr
    assert "--allow-network" in done.stderr
    assert "SSH tunnel" in done.stderr
    assert "READY" not in done.stdout


def test_allow_network_serves_and_says_what_it_exposes() -> None:
    worker = RpcWorker("--host", "0.0.0.0", "--allow-network")
    try:
        address = worker.wait_ready()
        port = int(address.rpartition(":")[2])
        assert rpc.hello(Endpoint("127.0.0.1", port)).state == "ready"
    finally:
        worker.stop()
    said = "\n".join(worker.output)
    assert "warning: listening on 0.0.0.0 (every address of this machine)" in said
    assert "read the model's weights" in said


def test_devices_lists_the_remote_devices_and_a_worker_that_is_down(gemma_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{closed.getsockname()[1]}"
    with rpc_workers(2) as workers:
        servers = ",".join([*(w.address for w in workers), down])
        done = subprocess.run(
            [sys.executable, "-m", "app", "devices", "--json", "--rpc", servers, "--target", str(gemma_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=180, check=True,
        )  # fmt: skip
    out = json.loads(done.stdout)
    remote = next(p for p in out["probes"] if p["path"] == "remote")
    assert [d["name"] for d in remote["devices"]] == [
        f"RPC0 ({workers[0].address})",
        f"RPC1 ({workers[1].address})",
    ]
    assert all(
        d["kind"] == "remote" and d["latency_ms"] > 0 and d["free_bytes"] > 0 for d in remote["devices"]
    )
    assert [s["state"] for s in remote["info"]["servers"]] == ["ready", "ready", "unreachable"]
    assert down in remote["error"]
    assert out["placement"]["remote"] == [d["name"] for d in remote["devices"]]


# --- placement over remote devices (devices as the probes report them) ------------------------------
def _shape(gib: float, n_layer: int = 40) -> ModelShape:
    return ModelShape(int(gib * GIB), n_layer, 8, 128, 128, 32768)


def _remote(index: int, free_gib: float) -> Device:
    free = int(free_gib * GIB)
    return Device(f"RPC{index} (10.0.0.{index + 2}:50052)", "rpc", "remote", free, free, index=index,
                  endpoint=f"10.0.0.{index + 2}:50052", latency_ms=0.4)  # fmt: skip


CPU_16 = Device("laptop CPU", "cpu", "cpu", 16 * GIB, 12 * GIB, cores=8)
GPU_8 = Device("RTX 4060", "nvidia", "discrete", 8 * GIB, 7 * GIB, index=0)


def test_a_model_this_machine_holds_stays_here() -> None:
    placed = place([GPU_8, _remote(0, 24), CPU_16], PairNeed(_shape(4)))
    assert placed.device == "gpu:0"
    assert placed.remote == []


def test_a_model_too_big_for_here_spreads_over_the_workers_first_then_this_gpu() -> None:
    placed = place([GPU_8, _remote(0, 24), CPU_16], PairNeed(_shape(18), _shape(0.5, 24)))
    assert (placed.device, placed.draft_device, placed.gpu_layers) == ("gpu", "cpu", -1)
    assert placed.tensor_split == [round(24 / 31, 3), round(7 / 31, 3)]  # llama.cpp's order: RPC0, then GPU 0
    assert placed.remote == ["RPC0 (10.0.0.2:50052)"]
    assert "RPC0 (10.0.0.2:50052) + RTX 4060" in placed.reason
    assert "crosses the network" in placed.reason


def test_what_the_workers_cannot_hold_stays_on_this_cpu() -> None:
    placed = place([_remote(0, 10), _remote(1, 10), CPU_16], PairNeed(_shape(26, 40)))
    assert placed.device == "gpu"
    assert placed.tensor_split == [0.5, 0.5]
    assert 0 < placed.gpu_layers < 41
    assert f"takes {placed.gpu_layers} of 41 layers" in placed.reason


def test_an_explicit_split_goes_over_the_workers_and_the_drafter_stays_here() -> None:
    choice = UserChoice(tensor_split=(1.0, 1.0))
    need = PairNeed(_shape(1), _shape(0.5, 24))
    placed = place([_remote(0, 10), _remote(1, 10), CPU_16], need, choice)
    assert (placed.device, placed.draft_device, placed.tensor_split) == ("gpu", "cpu", [1.0, 1.0])
    with_gpu = place([GPU_8, _remote(0, 10), CPU_16], need, UserChoice(device="gpu"))
    assert (with_gpu.device, with_gpu.draft_device) == ("gpu", "gpu:0")


def test_workers_left_out_drop_the_split_meant_for_them_and_say_why(tmp_path: Path) -> None:
    split = {"rpc": "127.0.0.1:1,127.0.0.1:2", "device": "gpu", "gpu_layers": 12, "tensor_split": [1, 1]}
    settings = load_settings(tmp_path / "none.toml", {"engine": split}, {})
    placement.leave_out_remote("the RPC worker 127.0.0.1:2 was lost")
    try:
        local, joined = placement.join_remote(settings)
        described = placement.describe(None)
    finally:
        placement.leave_out_remote("")
        placement._remote = None
    assert joined == []
    assert (local.engine.device, local.engine.tensor_split, local.engine.gpu_layers) == ("auto", None, -1)
    assert described["rpc"]["state"] == "off"
    assert described["rpc"]["reason"] == "the RPC worker 127.0.0.1:2 was lost"

"""Remote devices end to end, on loopback: two real rpc-worker processes (CPU, one thread each) and an engine
that places gemma-3-270m's layers on this CPU and both workers. Its greedy answer is the all-local one
up to a near-tie; a worker killed mid-stream ends the stream with an error event, and the next request is
served on this machine alone with the reason in /props; `bench --no-draft` puts both side by side."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.bench import NEAR_TIE
from tests.support.rpc_workers import rpc_workers
from tests.support.server_helpers import EngineServer, engine_server

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ["--no-draft", "--n-ctx", "1024", "--n-threads", "1"]
# gemma-3-270m has 18 layers: 12 off the CPU (the output layer and 11 blocks) split over the two workers
SPLIT = ["--device", "gpu", "--gpu-layers", "12", "--tensor-split", "1,1"]
QUESTION = [{"role": "user", "content": "Name three rivers of Europe and say one thing about each."}]
RECOVERY_TIMEOUT_S = 180.0


def _greedy(server: EngineServer, max_tokens: int = 24) -> list[dict[str, Any]]:
    body = {
        "messages": QUESTION,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["logprobs"]["content"]


def _props(server: EngineServer) -> dict[str, Any]:
    return httpx.get(f"{server.url}/props", timeout=30).json()


def test_layers_over_this_cpu_and_two_workers_answer_as_this_machine_alone(gemma_path: Path) -> None:
    with engine_server(["--target", str(gemma_path), *ENGINE]) as local:
        here = _greedy(local)
    with (
        rpc_workers(2) as workers,
        engine_server(
            ["--target", str(gemma_path), *ENGINE, *SPLIT, "--rpc", ",".join(w.address for w in workers)]
        ) as split,
    ):
        there = _greedy(split)
        props = _props(split)
    assert props["rpc"]["state"] == "joined"
    assert props["rpc"]["servers"] == [w.address for w in workers]
    assert "layers over RPC0, RPC1" in props["target"]["device_reason"]
    assert props["target"]["gpu_layers"] == 12
    joined = props["placement"]["rpc"]["devices"]
    assert [d["endpoint"] for d in joined] == [w.address for w in workers]
    assert all(d["latency_ms"] > 0 for d in joined)
    tokens_here, tokens_there = [t["token"] for t in here], [t["token"] for t in there]
    diff = next((i for i, (a, b) in enumerate(zip(tokens_here, tokens_there, strict=True)) if a != b), None)
    if diff is not None:  # batched and split kernels round differently: a parting only at a near-tie
        top = here[diff]["top_logprobs"]
        margin = top[0]["logprob"] - top[1]["logprob"]
        assert margin < NEAR_TIE, f"split parts from local at token {diff} with a margin of {margin:.3f}"


def _stream_until_killed(server: EngineServer, kill: Any) -> list[Any]:
    """A long greedy stream; `kill` runs once three pieces came; every event after it, read to the end."""
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 2000, "temperature": 0, "stream": True}
    events: list[Any] = []
    pieces = 0
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
            pieces += "choices" in events[-1] if isinstance(events[-1], dict) else 0
            if pieces == 3:
                kill()
    return events


def test_a_worker_killed_mid_stream_ends_it_with_an_error_and_this_machine_serves_next(
    gemma_path: Path,
) -> None:
    with (
        rpc_workers(2) as workers,
        engine_server(
            ["--target", str(gemma_path), *ENGINE, *SPLIT, "--rpc", ",".join(w.address for w in workers)]
        ) as server,
    ):
        events = _stream_until_killed(server, workers[1].kill)
        assert events[-1] == "[DONE]"
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1, events[-5:]
        assert errors[0]["error"]["code"] == "remote_device_lost"
        assert workers[1].address in errors[0]["error"]["message"]
        assert "this machine's devices" in errors[0]["error"]["message"]

        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while httpx.get(f"{server.url}/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, (
                f"no recovery in {RECOVERY_TIMEOUT_S:.0f} s:\n{server.log_tail()}"
            )
            time.sleep(0.5)
        props = _props(server)
        assert props["rpc"]["state"] == "lost"
        assert workers[1].address in props["rpc"]["reason"]
        assert "SIGABRT" in props["rpc"]["reason"]
        assert props["rpc"]["engine_restarts"] == 1
        assert props["placement"]["rpc"]["state"] == "off"
        assert "RPC" not in props["target"]["device_reason"]

        body = {"prompt": "1, 2, 3,", "max_tokens": 8, "temperature": 0}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"].strip()


def test_a_worker_down_at_start_is_named_and_nothing_aborts(gemma_path: Path) -> None:
    with rpc_workers(1) as (worker,):
        address = worker.address
    server = EngineServer(["--target", str(gemma_path), *ENGINE, "--rpc", address, "--port", "0"])
    try:
        code = server.wait_exit(120)
    finally:
        server.stop()
    assert code == 2
    assert f"cannot connect to {address}" in server.log_tail()


def test_bench_no_draft_puts_local_and_split_tok_s_side_by_side(gemma_path: Path) -> None:
    with rpc_workers(2) as workers:
        servers = ",".join(w.address for w in workers)
        command = [sys.executable, "-m", "app", "bench", "--target", str(gemma_path), *ENGINE, *SPLIT,
                   "--rpc", servers, "--only", "chat-hashmap", "--tokens", "16", "--repeat", "1",
                   "--json"]  # fmt: skip
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    row, summary = lines[0], lines[-1]
    assert row["name"] == "chat-hashmap"
    assert row["local_tok_s"] > 0
    assert row["split_tok_s"] > 0
    assert row["ratio"] == pytest.approx(row["split_tok_s"] / row["local_tok_s"], rel=0.01)
    assert row["match"] or row["near_tie"]
    assert "RPC0, RPC1" in summary["split"]
    assert "RPC" not in summary["local"]
    assert [d["endpoint"] for d in summary["rpc"]["devices"]] == [w.address for w in workers]


def test_speculation_over_the_workers_keeps_the_drafter_here_and_measures_costs_with_the_network(
    gemma_path: Path,
) -> None:
    from app import paths

    with rpc_workers(2) as workers:
        servers = ",".join(w.address for w in workers)
        args = [
            "--target",
            str(gemma_path),
            "--draft",
            str(gemma_path),
            *ENGINE[1:],
            *SPLIT,
            "--rpc",
            servers,
        ]
        with engine_server(args) as server:
            props = _props(server)
            body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,",
                    "max_tokens": 24, "temperature": 0}  # fmt: skip
            reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    spec = reply.json()["usage"]["speculative"]
    assert spec["emitted"] == 24
    # the policy decides from the costs measured over the workers: drafts, or says why not
    assert spec["drafted"] > 0 or spec["fallback_reason"]
    assert "layers over RPC0, RPC1" in props["target"]["device_reason"]
    assert props["draft"]["device"] == "cpu"  # next to the user: only the target crosses the network
    assert len(props["draft"]["policy"]["verify_cost_ms"]) > 1
    keys = json.loads((paths.cache_dir() / "verify-costs.json").read_text())
    assert any(f"RPC0@{workers[0].address},RPC1@{workers[1].address}" in key for key in keys)


def test_a_pair_loaded_through_the_admin_route_runs_in_the_child_over_the_workers(gemma_path: Path) -> None:
    token = "admin-token-for-rpc-tests"
    with rpc_workers(2) as workers:
        servers = ",".join(w.address for w in workers)
        args = ["--target", str(gemma_path), *ENGINE, *SPLIT, "--rpc", servers]
        with engine_server(args, env={"FORESIGHT_ADMIN_TOKEN": token}) as server:
            auth = {"Authorization": f"Bearer {token}"}
            stages = []
            body = {"target": str(gemma_path), "ngram": True}
            with httpx.stream(
                "POST", f"{server.url}/admin/load", json=body, headers=auth, timeout=300
            ) as reply:
                assert reply.status_code == 200
                for line in reply.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        stages.append(json.loads(line[len("data: ") :]))
            props = httpx.get(f"{server.url}/props", headers=auth, timeout=30).json()
            done = httpx.post(f"{server.url}/v1/completions", headers=auth, timeout=120,
                              json={"prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0})  # fmt: skip
    names = [s.get("stage") for s in stages]
    assert names[0] == "unloading"
    assert names[-1] == "ready", stages
    assert stages[-1]["draft"] == "ngram"
    assert props["draft"]["source"] == "ngram"
    assert props["rpc"]["state"] == "joined"
    assert "layers over RPC0, RPC1" in props["target"]["device_reason"]
    assert done.status_code == 200, done.text


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the 4th field (after the name), the parent's pid
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_the_engine_child_and_the_rpc_server_end_with_their_parents_killed(gemma_path: Path) -> None:
    from app.processes import alive

    with rpc_workers(1) as (worker,):
        rpc_server = _children(worker.proc.pid)
        server = EngineServer(["--target", str(gemma_path), *ENGINE, *SPLIT[:2], "--rpc", worker.address,
                               "--port", "0"])  # fmt: skip
        try:
            server.wait_ready()
            child = _children(server.proc.pid)
            assert len(child) == 1, child
            server.proc.kill()
            server.wait_exit(30)
            worker.kill()
        finally:
            server.stop()
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in [*child, *rpc_server]) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert len(rpc_server) == 1
    assert not alive(child[0]), "the engine child outlived its server"
    assert not alive(rpc_server[0]), "rpc-server outlived its rpc-worker"

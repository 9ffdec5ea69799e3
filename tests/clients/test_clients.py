"""The coding clients people point at `serve`, pinned and run for real against the default model.

Each test checks what the client made of the answers (the file it wrote, the object it parsed, the
answer it printed) and what the server's log says it parsed out of the model's replies.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.clients.conftest import ServerLog, client, needs, run_client
from tests.support.server_helpers import EngineServer

pytestmark = [pytest.mark.clients, pytest.mark.slow, pytest.mark.timeout(3600)]
PROBES = Path(__file__).parent / "probes"


def _ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def _git_repo(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    for args in (
        ["init", "-q"],
        ["add", "."],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True)
    return path


@needs("openai")
def test_openai_package(served: EngineServer, server_log: ServerLog, tmp_path: Path) -> None:
    python = client("openai")
    run = run_client(
        [str(python), str(PROBES / "openai_probe.py"), f"{served.url}/v1"], tmp_path / "home", tmp_path
    )
    out = json.loads(_ok(run).splitlines()[-1])
    assert out["chat"].strip() == "4"
    assert out["stream"] == out["chat"]
    assert out["tool_call"]["name"] == "get_weather"
    assert out["tool_call"]["arguments"] == {"city": "Paris"}
    assert out["finish_reason"] == "tool_calls"
    assert out["parsed"] == {"name": "Ann Lee", "age": 31}
    assert out["logprobs"]
    assert "".join(t["token"] for t in out["logprobs"]) == out["logprob_text"]
    assert all(t["logprob"] <= 0 and t["top"] == 2 for t in out["logprobs"])
    assert 'get_weather {"city": "Paris"}' in server_log.tool_calls()


@needs("anthropic")
def test_anthropic_package(served: EngineServer, server_log: ServerLog, tmp_path: Path) -> None:
    python = client("anthropic")
    run = run_client(
        [str(python), str(PROBES / "anthropic_probe.py"), served.url], tmp_path / "home", tmp_path
    )
    out = json.loads(_ok(run).splitlines()[-1])
    assert out["text"].strip() == "4"
    assert out["stop_reason"] == "end_turn"
    assert out["stream"] == out["text"]
    assert out["stream_stop_reason"] == "end_turn"
    assert out["count_tokens"] == out["input_tokens"] > 10
    assert out["tool_use"]["name"] == "get_weather"
    assert out["tool_use"]["input"] == {"city": "Paris"}
    assert out["tool_use"]["id"].startswith("toolu_")
    assert out["tool_stop_reason"] == "tool_use"
    assert out["streamed_tool_use"] == [{"name": "get_weather", "input": {"city": "Paris"}}]
    assert server_log.tool_calls().count('get_weather {"city": "Paris"}') == 2


@needs("llm")
def test_llm_chat_completion_and_schema(served: EngineServer, server_log: ServerLog, tmp_path: Path) -> None:
    llm = client("llm")
    config = tmp_path / "llm"
    config.mkdir()
    base = f"{served.url}/v1"
    (config / "extra-openai-models.yaml").write_text(
        f"- model_id: foresight\n  model_name: qwen\n  api_base: {base}\n  supports_schema: true\n"
        f"- model_id: foresight-completion\n  model_name: qwen\n  api_base: {base}\n  completion: true\n"
    )
    env = {"LLM_USER_PATH": str(config), "OPENAI_API_KEY": "local"}

    def llm_run(*args: str, stdin: str | None = None) -> str:
        return _ok(run_client([str(llm), *args], tmp_path / "home", tmp_path, env, stdin)).strip()

    answer = llm_run(
        "-m", "foresight", "-s", "Reply with just the number.", "-o", "temperature", "0", "What is 2+2?"
    )
    assert answer == "4"
    chatted = llm_run(
        "chat", "-m", "foresight", "-s", "Reply with just the number.", stdin="What is 3+3?\nquit\n"
    )
    assert "6" in chatted
    completed = llm_run("-m", "foresight-completion", "-o", "max_tokens", "12", "def add(a, b):\n    return")
    assert completed.startswith("a + b"), completed
    record = llm_run("-m", "foresight", "--schema", "name, age int", "Ann Lee is 31 years old.")
    assert json.loads(record) == {"name": "Ann Lee", "age": 31}
    assert server_log.requests() >= 4
    assert server_log.tool_calls() == []  # no tools were offered, none came back


@needs("aider")
def test_aider_edits_a_whole_file(served: EngineServer, server_log: ServerLog, tmp_path: Path) -> None:
    aider = client("aider")
    repo = _git_repo(tmp_path / "repo", {"greet.py": 'def greet():\n    return "hi"\n'})
    args = [
        str(aider),
        "--model",
        "openai/qwen",
        "--openai-api-base",
        f"{served.url}/v1",
        "--openai-api-key",
        "local",
        "--edit-format",
        "whole",
        "--map-tokens",
        "0",
        "--yes-always",
        "--no-auto-commits",
        "--no-check-update",
        "--no-analytics",
        "--no-show-model-warnings",
        "--no-show-release-notes",
        "--no-pretty",
        "--no-fancy-input",
        "--no-gitignore",
        "--message",
        'In greet.py, make greet() return "hello" instead of "hi". Change nothing else.',
        "greet.py",
    ]
    _ok(run_client(args, tmp_path / "home", repo))
    edited = (repo / "greet.py").read_text()
    assert '"hello"' in edited, edited
    assert '"hi"' not in edited
    assert "def greet():" in edited
    assert server_log.requests() >= 1
    assert any("request done: stop" in line for line in server_log.lines())


@needs("opencode")
def test_opencode_writes_a_file_through_its_write_tool(
    served: EngineServer, server_log: ServerLog, tmp_path: Path
) -> None:
    opencode = client("opencode")
    project = _git_repo(tmp_path / "project", {"README.md": "A test project.\n"})
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "foresight": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Foresight",
                "options": {"baseURL": f"{served.url}/v1", "apiKey": "local"},
                "models": {
                    "qwen": {"name": "Qwen2.5-Coder-1.5B", "limit": {"context": 16384, "output": 1024}}
                },
            }
        },
        "model": "foresight/qwen",
        "autoupdate": False,
        "share": "disabled",
    }
    (project / "opencode.json").write_text(json.dumps(config))
    prompt = "Create the file notes.txt containing exactly the word banana. Use the write tool."
    env = {"OPENCODE_CONFIG": str(project / "opencode.json")}
    _ok(
        run_client(
            [str(opencode), "run", "--auto", "-m", "foresight/qwen", prompt], tmp_path / "home", project, env
        )
    )
    assert (project / "notes.txt").read_text().strip() == "banana"
    writes = [c for c in server_log.tool_calls() if c.startswith("write ")]
    assert writes, server_log.tool_calls()
    assert "notes.txt" in json.loads(writes[0].split(" ", 1)[1])["filePath"]


@needs("codex")
def test_codex_answers_through_responses(served: EngineServer, server_log: ServerLog, tmp_path: Path) -> None:
    codex = client("codex")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "qwen2.5-coder"\nmodel_provider = "foresight"\ncheck_for_update_on_startup = false\n\n'
        "[analytics]\nenabled = false\n\n"
        '[model_providers.foresight]\nname = "Foresight"\nwire_api = "responses"\n'
        f'base_url = "{served.url}/v1"\n'
    )
    work = _git_repo(tmp_path / "work", {"README.md": "A test project.\n"})
    last = tmp_path / "last-message.txt"
    args = [
        str(codex),
        "exec",
        "--ephemeral",
        "--skip-git-repo-check",
        "-o",
        str(last),
        "What is 2+2? Answer with just the number.",
    ]
    _ok(run_client(args, tmp_path / "home", work, {"CODEX_HOME": str(home)}))
    assert last.read_text().strip() == "4"
    responses = [line for line in server_log.lines() if "foresight.worker: request: " in line]
    assert responses, "Codex never reached the engine"
    assert any("tools offered: " in line for line in server_log.lines())  # Codex's function tools were read

"""The conformance suite's server and clients: one `serve` of the default model, the pinned installs."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from app import paths
from tests.clients.install import PINS, installed
from tests.support.server_helpers import EngineServer, engine_server

# Greedy and seeded: the 1.5B model is a weak coding model, its answers are checked as written.
SERVE_ARGS = ["--ngram", "--n-ctx", "16384", "--temperature", "0", "--seed", "7", "--n-threads", "2"]
CLIENT_TIMEOUT_S = 1800  # a coding client's first prompt is 7-8k tokens: minutes of prefill on 2 cores
# Nothing phones home: no telemetry, update checks, model lists or plugins from the network.
QUIET = {
    "DO_NOT_TRACK": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_PURE": "1",
    "AIDER_ANALYTICS": "false",
    "AIDER_CHECK_UPDATE": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "HF_HUB_OFFLINE": "1",
}


@pytest.fixture(scope="session")
def served(qwen_path: Path) -> Iterator[EngineServer]:
    with engine_server(["--target", str(qwen_path), *SERVE_ARGS]) as server:
        yield server


def needs(name: str) -> pytest.MarkDecorator:
    """Skip a test whose client is not installed (before its server starts), unless the run requires the
    clients (FORESIGHT_CLIENTS_REQUIRED=1, as CI sets after scripts/install-clients.sh): then it fails."""
    missing = installed(name) is None and os.environ.get("FORESIGHT_CLIENTS_REQUIRED") != "1"
    return pytest.mark.skipif(
        missing, reason=f"{PINS[name].spec} is not installed: run scripts/install-clients.sh"
    )


def client(name: str) -> Path:
    """The pinned client's executable."""
    exe = installed(name)
    if exe is None:
        pytest.fail(f"{PINS[name].spec} is not installed: run scripts/install-clients.sh")
    return exe


def run_client(
    args: list[str], home: Path, cwd: Path, env: Mapping[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """A client run in its own home (its config and state never touch the user's), stdin closed."""
    full = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "FORESIGHT_API"))
    }
    for sub in (".cache", ".config", ".local/share", ".local/state"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    full.update(
        HOME=str(home),
        PWD=str(
            cwd
        ),  # some clients (opencode) take their project from PWD, which the parent would leave stale
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_DATA_HOME=str(home / ".local/share"),
        XDG_STATE_HOME=str(home / ".local/state"),
        **QUIET,
        **(env or {}),
    )
    return subprocess.run(
        args,
        cwd=cwd,
        env=full,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
    )


class ServerLog:
    """The engine's log file (the serve process logs there at INFO), read from a mark on."""

    def __init__(self) -> None:
        self.path = paths.log_dir() / "foresight.log"
        self.start = self.path.stat().st_size if self.path.exists() else 0

    def lines(self) -> list[str]:
        with self.path.open(encoding="utf-8", errors="replace") as f:
            f.seek(self.start)
            return f.read().splitlines()

    def tool_calls(self) -> list[str]:
        """'name arguments' of each tool call the server parsed out of a reply since the mark."""
        marker = "foresight.server: tool call "
        return [line.split(marker, 1)[1].split(": ", 1)[1] for line in self.lines() if marker in line]

    def requests(self) -> int:
        return sum("foresight.worker: request: " in line for line in self.lines())


@pytest.fixture
def server_log() -> ServerLog:
    return ServerLog()

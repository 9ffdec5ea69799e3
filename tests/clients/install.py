"""The pinned coding clients of the conformance suite, each in its own venv or npm prefix, cached by version.

`python -m tests.clients.install` (or scripts/install-clients.sh) installs what is missing; the suite
finds them with `client_dir`. Nothing goes into the project's own .venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs


@dataclass(frozen=True)
class Client:
    name: str
    kind: str  # "pip": a venv; "npm": an npm prefix
    spec: str  # what the installer asks for, with the exact version
    command: str  # the executable, relative to the install dir

    @property
    def key(self) -> str:
        return f"{self.name}-{self.spec.rpartition('@' if self.kind == 'npm' else '=')[2]}"


PINS = {
    c.name: c
    for c in (
        Client("openai", "pip", "openai==3.57.0", "bin/python"),
        Client("anthropic", "pip", "anthropic==2.15.0", "bin/python"),
        Client("llm", "pip", "llm==0.36", "bin/llm"),
        Client("aider", "pip", "aider-chat==0.86.2", "bin/aider"),
        Client("opencode", "npm", "opencode-ai@1.18.33", "node_modules/.bin/opencode"),
        Client("codex", "npm", "@openai/codex@0.171.0", "node_modules/.bin/codex"),
    )
}


def clients_root() -> Path:
    """Where the installs live: FORESIGHT_CLIENTS_DIR, else the user cache dir (kept between runs)."""
    override = os.environ.get("FORESIGHT_CLIENTS_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir("foresight")) / "clients"


def client_dir(name: str) -> Path:
    return clients_root() / PINS[name].key


def installed(name: str) -> Path | None:
    """The client's executable when its pinned version is installed, else None."""
    folder = client_dir(name)
    exe = folder / PINS[name].command
    return exe if (folder / ".complete").exists() and exe.exists() else None


def install(name: str) -> Path:
    """Install one client into its folder; `.complete` is written last, so a broken install is redone.

    The install happens in place: a venv's scripts name their interpreter by absolute path, so a venv
    cannot be moved into place once built.
    """
    client = PINS[name]
    done = installed(name)
    if done is not None:
        return done
    folder = client_dir(name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    quiet_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "npm_config_update_notifier": "false"}
    if client.kind == "pip":
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off", "-q"]
        subprocess.run([*pip, client.spec], check=True, env=quiet_env)
    else:
        folder.mkdir()
        npm = ["npm", "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel", "error"]
        subprocess.run([*npm, client.spec], check=True, env=quiet_env)
    if not (folder / client.command).exists():
        raise RuntimeError(f"{client.spec} installed no {client.command}")
    (folder / ".complete").write_text(client.spec + "\n")
    return folder / client.command


def main(argv: list[str]) -> int:
    names = argv or list(PINS)
    unknown = [n for n in names if n not in PINS]
    if unknown:
        print(f"unknown clients: {', '.join(unknown)} (known: {', '.join(PINS)})", file=sys.stderr)
        return 2
    for name in names:
        exe = install(name)
        print(f"{PINS[name].spec}: {exe}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The local API server switch: the engine's public listener (through its admin routes) and its API key.

A listener reachable from the network needs an API key. The key is generated once and kept in the
system keyring; where no safe keyring exists, a key is made for this run only and the window says so.
Ready-to-paste settings for editors and tools are built from the listener's address, model and key.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from dataclasses import dataclass

import keyring.backend
import keyring.errors

from app.keystore import KEYRING_SERVICE, TokenStore

API_KEY_USER = "api-key"
LAN_HOST = "0.0.0.0"
LOOPBACK = "127.0.0.1"
MASK = "•" * 12  # a key as the panel shows it unless asked


class ApiKeys:
    """The API key of the local server: in the keyring, or for this run only."""

    def __init__(self, backend: keyring.backend.KeyringBackend | None = None) -> None:
        self._keyring = TokenStore(backend)
        self._this_run: str | None = None
        self.why_not = ""  # the keyring's own words when it could not keep the key (for a tool tip)

    def key(self) -> tuple[str, str]:
        """(the key, a sentence saying where it is kept) — created on first use."""
        why_not = self._keyring.available()
        if not why_not:
            try:
                backend = self._keyring.backend()
                stored = backend.get_password(KEYRING_SERVICE, API_KEY_USER)
                if not stored:
                    stored = secrets.token_urlsafe(32)
                    backend.set_password(KEYRING_SERVICE, API_KEY_USER, stored)
                self.why_not = ""
                return stored, "The key is kept in your system keyring: it stays the same next time."
            except keyring.errors.KeyringError as exc:
                why_not = str(exc) or type(exc).__name__
        self.why_not = why_not
        if self._this_run is None:
            self._this_run = secrets.token_urlsafe(32)
        return self._this_run, (
            "No safe keyring was found on this computer, so this key lasts until Foresight quits. To keep "
            "one, install and unlock a keyring (GNOME Keyring, KWallet, macOS Keychain or Windows "
            "Credential Manager)."
        )


@dataclass(frozen=True)
class Endpoint:
    """Where clients reach the API: base URL (…/v1), the model id, its context and the key (if any)."""

    base_url: str
    model: str
    context: int
    api_key: str | None

    def masked(self) -> Endpoint:
        """The same endpoint with its key hidden (for showing the settings; copying takes the real one)."""
        return dataclasses.replace(self, api_key=MASK) if self.api_key else self

    def clients(self) -> dict[str, str]:
        """Settings per client, in the form each one reads."""
        key = self.api_key or "not-needed"
        continue_yaml = (
            "# ~/.continue/config.yaml\n"
            "models:\n"
            "  - name: Foresight\n"
            "    provider: openai\n"
            f"    model: {self.model}\n"
            f"    apiBase: {self.base_url}\n"
            f"    apiKey: {key}\n"
            "    roles: [chat, edit, apply]\n"
        )
        zed = {
            "language_models": {
                "openai_compatible": {
                    "Foresight": {
                        "api_url": self.base_url,
                        "available_models": [
                            {"name": self.model, "display_name": "Foresight", "max_tokens": self.context}
                        ],
                    }
                }
            }
        }
        zed_text = "// Zed settings.json (Zed reads the key from FORESIGHT_API_KEY)\n"
        zed_text += json.dumps(zed, indent=2)
        if self.api_key:
            zed_text += f"\n// export FORESIGHT_API_KEY={shlex.quote(self.api_key)}"
        cline = (
            "Cline settings → API Provider: OpenAI Compatible\n"
            f"Base URL: {self.base_url}\n"
            f"API Key: {key}\n"
            f"Model ID: {self.model}\n"
            f"Context window: {self.context}\n"
        )
        aider = (
            f"aider --openai-api-base {shlex.quote(self.base_url)} --openai-api-key {shlex.quote(key)} "
            f"--model {shlex.quote('openai/' + self.model)}\n"
        )
        root = self.base_url.removesuffix("/v1")  # Anthropic's clients add /v1/messages themselves
        claude_code = (
            f"ANTHROPIC_BASE_URL={shlex.quote(root)} ANTHROPIC_AUTH_TOKEN={shlex.quote(key)} "
            f"ANTHROPIC_MODEL={shlex.quote(self.model)} ANTHROPIC_SMALL_FAST_MODEL={shlex.quote(self.model)} "
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 claude\n"
        )
        codex = (
            "# ~/.codex/config.toml (Codex speaks the Responses API)\n"
            f'model = "{self.model}"\n'
            'model_provider = "foresight"\n\n'
            "[model_providers.foresight]\n"
            'name = "Foresight"\n'
            f'base_url = "{self.base_url}"\n'
            'wire_api = "responses"\n'
        )
        if self.api_key:
            codex += 'env_key = "FORESIGHT_API_KEY"\n'
            codex += f"# export FORESIGHT_API_KEY={shlex.quote(self.api_key)}\n"
        opencode = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "foresight": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Foresight",
                    "options": {"baseURL": self.base_url, "apiKey": key},
                    "models": {self.model: {"name": self.model, "limit": {"context": self.context}}},
                }
            },
            "model": f"foresight/{self.model}",
        }
        opencode_text = "// opencode.json in the project\n" + json.dumps(opencode, indent=2)
        generic = (
            f"OPENAI_BASE_URL={shlex.quote(self.base_url)}\n"
            f"OPENAI_API_KEY={shlex.quote(key)}\n"
            f"model: {self.model}\n"
        )
        return {
            "Continue": continue_yaml,
            "Zed": zed_text,
            "Cline": cline,
            "aider": aider,
            "Claude Code": claude_code,
            "Codex": codex,
            "opencode": opencode_text,
            "Any OpenAI client": generic,
            "curl": self.curl(),
        }

    def curl(self) -> str:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Say hello."}]})
        auth = f" -H {shlex.quote('Authorization: Bearer ' + self.api_key)}" if self.api_key else ""
        return (
            f"curl -s {shlex.quote(self.base_url + '/chat/completions')}{auth} "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}\n"
        )


def lan_addresses() -> list[str]:
    """This machine's addresses other devices may reach (best effort; loopback left out)."""
    import socket

    found: list[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            found.append(s.getsockname()[0])
    except OSError:
        pass
    return [a for a in found if not a.startswith("127.")]

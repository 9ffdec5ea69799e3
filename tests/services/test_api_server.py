"""The API key store and the client settings of the local API server switch."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

import yaml

from app.services.api_server import ApiKeys, Endpoint


def _file_keyring(tmp_path: Path):  # type: ignore[no-untyped-def]
    from keyrings.alt.file import PlaintextKeyring

    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")  # a file keyring stands in where no OS keyring runs
    return backend


def test_the_key_is_made_once_and_kept_in_the_keyring(tmp_path: Path) -> None:
    backend = _file_keyring(tmp_path)
    key, where = ApiKeys(backend).key()
    assert len(key) >= 40
    assert "keyring" in where
    assert ApiKeys(backend).key()[0] == key  # a later run finds the same key


def test_without_a_safe_keyring_the_key_lasts_for_this_run_and_says_so() -> None:
    from keyring.backends import fail

    keys = ApiKeys(fail.Keyring())
    key, where = keys.key()
    assert "until Foresight quits" in where
    assert keys.key()[0] == key  # the same key all run long...
    assert ApiKeys(fail.Keyring()).key()[0] != key  # ...and a new one the next


def test_client_settings_carry_the_address_model_and_key() -> None:
    e = Endpoint("http://127.0.0.1:8080/v1", "qwen2.5-coder-1.5b-instruct-q4_k_m", 4096, "s3cret-key")
    configs = e.clients()
    names = ("Claude Code", "Codex", "opencode", "Continue", "Zed", "Cline", "aider", "Any OpenAI client")
    assert set(configs) == {*names, "curl"}
    cont = yaml.safe_load(configs["Continue"])["models"][0]
    assert cont == {
        "name": "Foresight",
        "provider": "openai",
        "model": e.model,
        "apiBase": e.base_url,
        "apiKey": "s3cret-key",
        "roles": ["chat", "edit", "apply"],
    }
    zed_json = "\n".join(line for line in configs["Zed"].splitlines() if not line.startswith("//"))
    zed = json.loads(zed_json)["language_models"]["openai_compatible"]["Foresight"]
    assert zed["api_url"] == e.base_url
    assert zed["available_models"][0] == {"name": e.model, "display_name": "Foresight", "max_tokens": 4096}
    assert "FORESIGHT_API_KEY=s3cret-key" in configs["Zed"]
    assert "--openai-api-base http://127.0.0.1:8080/v1" in configs["aider"]
    assert f"--model openai/{e.model}" in configs["aider"]
    assert "Authorization: Bearer s3cret-key" in configs["curl"]
    claude = shlex.split(configs["Claude Code"])
    assert claude[:2] == ["ANTHROPIC_BASE_URL=http://127.0.0.1:8080", "ANTHROPIC_AUTH_TOKEN=s3cret-key"]
    assert claude[-1] == "claude"
    codex = tomllib.loads(configs["Codex"])
    assert codex["model"] == e.model
    assert codex["model_provider"] == "foresight"
    provider = codex["model_providers"]["foresight"]
    assert provider["base_url"] == e.base_url
    assert provider["wire_api"] == "responses"
    assert provider["env_key"] == "FORESIGHT_API_KEY"
    assert "FORESIGHT_API_KEY=s3cret-key" in configs["Codex"]
    opencode_json = "\n".join(line for line in configs["opencode"].splitlines() if not line.startswith("//"))
    opencode = json.loads(opencode_json)
    assert opencode["provider"]["foresight"]["options"] == {"baseURL": e.base_url, "apiKey": "s3cret-key"}
    assert opencode["model"] == f"foresight/{e.model}"
    loopback = Endpoint("http://127.0.0.1:8080/v1", "m", 2048, None)
    assert "env_key" not in tomllib.loads(loopback.clients()["Codex"])["model_providers"]["foresight"]
    assert "Authorization" not in loopback.curl()
    assert "apiKey: not-needed" in loopback.clients()["Continue"]

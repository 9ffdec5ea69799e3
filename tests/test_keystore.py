"""The OS keyring store: a round trip through a file keyring, and a clear error where none is safe."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import keystore

TOKEN = "hf_testTOKEN0123456789abcdef"


def test_keyring_round_trip(tmp_path: Path) -> None:
    from keyrings.alt.file import PlaintextKeyring

    backend = PlaintextKeyring()
    backend.file_path = str(tmp_path / "keyring.cfg")  # a file keyring stands in where no OS keyring runs
    store = keystore.TokenStore(backend)
    assert store.get() is None
    store.set(f"  {TOKEN}\n")
    assert store.get() == TOKEN
    assert keystore.TokenStore(backend).resolve() == TOKEN
    assert store.delete()
    assert store.get() is None
    assert not store.delete()


def test_no_secure_keyring_gives_a_clear_error() -> None:
    from keyring.backends import fail

    store = keystore.TokenStore(fail.Keyring())
    assert store.get() is None
    with pytest.raises(keystore.KeystoreError, match="cannot be stored safely"):
        store.set(TOKEN)

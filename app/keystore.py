"""Secrets in the OS keyring (Secret Service, Keychain, Credential Manager): the HF token, the API key.

Only a keyring that keeps secrets safe counts; plain-file and null backends are treated as none.
"""

from __future__ import annotations

import logging
import os

import keyring
import keyring.backend
import keyring.errors

log = logging.getLogger(__name__)

KEYRING_SERVICE = "Foresight"
KEYRING_USER = "huggingface-token"


class KeystoreError(RuntimeError):
    """A secret could not be stored or removed; the message says what to install."""


def _backend_name(backend: object) -> str:
    return f"{type(backend).__module__}.{type(backend).__name__}"


def _insecure(backend: object) -> bool:
    """Plain-file (keyrings.alt), fail and null backends do not keep a secret safe."""
    return _backend_name(backend).startswith(
        ("keyrings.alt.", "keyring.backends.fail.", "keyring.backends.null.")
    )


class TokenStore:
    """The Hugging Face token in the OS keyring.

    Only a keyring that keeps secrets safe is used: a plain-file backend (keyrings.alt) or the
    fail/null backends count as none, and storing then fails with a message saying what to install.
    Tests pass their own backend explicitly.
    """

    def __init__(self, backend: keyring.backend.KeyringBackend | None = None) -> None:
        self._backend = backend

    def backend(self) -> keyring.backend.KeyringBackend:
        if self._backend is not None:
            return self._backend
        chosen = keyring.get_keyring()
        # a chainer tries its backends in turn: only the secure ones among them count
        candidates = (
            getattr(chosen, "backends", None) if type(chosen).__name__ == "ChainerBackend" else [chosen]
        )
        secure = [b for b in candidates or [] if not _insecure(b)]
        if not secure:
            found = ", ".join(_backend_name(b) for b in candidates or [chosen])
            raise keyring.errors.NoKeyringError(f"no secure keyring backend (found {found})")
        return secure[0]

    def available(self) -> str:
        """'' when a secure keyring can be used, else why not."""
        try:
            self.backend()
        except keyring.errors.KeyringError as exc:
            return str(exc) or type(exc).__name__
        return ""

    def get(self) -> str | None:
        try:
            return self.backend().get_password(KEYRING_SERVICE, KEYRING_USER)
        except keyring.errors.KeyringError as exc:
            log.debug("keyring unavailable: %s", type(exc).__name__)
            return None

    def set(self, token: str) -> None:
        token = token.strip()
        if not token:
            raise KeystoreError("the token is empty")
        try:
            self.backend().set_password(KEYRING_SERVICE, KEYRING_USER, token)
        except keyring.errors.KeyringError as exc:
            raise KeystoreError(
                f"no usable keyring on this machine ({exc or type(exc).__name__}): the token cannot be "
                "stored safely. Install and unlock a keyring (GNOME Keyring, KWallet, macOS Keychain, "
                "Windows Credential Manager), or set HF_TOKEN for this session."
            ) from exc

    def delete(self) -> bool:
        try:
            self.backend().delete_password(KEYRING_SERVICE, KEYRING_USER)
            return True
        except keyring.errors.PasswordDeleteError:
            return False
        except keyring.errors.KeyringError as exc:
            raise KeystoreError(f"no usable keyring on this machine ({exc or type(exc).__name__})") from exc

    def resolve(self) -> str | None:
        """The token for hub requests: the keyring's, else HF_TOKEN from the environment, else none."""
        return self.get() or os.environ.get("HF_TOKEN") or None

"""The pairing verdict of two local GGUF files, read from their headers."""

from __future__ import annotations

from pathlib import Path

from app.catalog import gguf, pairing


def read_verdict(target: Path, drafter: Path) -> pairing.Verdict:
    """The pairing verdict of two local GGUF files (their headers only)."""
    return pairing.check_pair(gguf.read_file(target), gguf.read_file(drafter), target.name, drafter.name)

"""Files shipped beside the code (the bench prompts): installed or in the checkout."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# What the wheel maps into the package (pyproject.toml [tool.setuptools.package-dir]): installed,
# `bench/prompts.json` becomes app/bench/prompts.json; a checkout keeps it at its top.
CHECKOUT = Path(__file__).resolve().parent.parent


def shipped(name: str) -> Path:
    """The folder or file `name` ("bench/prompts.json") where this copy of the app has it: inside
    the installed (or frozen) package, else at the top of the source checkout that is running."""
    installed = Path(str(files("app"))) / name
    return installed if installed.exists() else CHECKOUT / name

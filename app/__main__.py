"""`python -m app`: argv to app.cli.commands; no llama_cpp import (the GUI process never loads a model)."""

from __future__ import annotations

import sys

from app.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())

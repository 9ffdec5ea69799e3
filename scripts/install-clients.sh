#!/usr/bin/env bash
# Installs the pinned coding clients of the conformance suite (tests/clients, `pytest -m clients`), each
# in its own venv or npm prefix under the user cache dir (FORESIGHT_CLIENTS_DIR moves it); kept between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m tests.clients.install "$@"

#!/usr/bin/env bash
# The test command: set up .venv, build the variant for the local torch, stage it
# into .hub-cache/ (a local Hub cache), then run pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec bash tools/prepare.sh -m pytest -q tests "$@"

#!/usr/bin/env bash
# The test command: set up .venv, build the variant for the local torch, stage it
# into .hub-cache/ (a local Hub cache), then run pytest. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup.sh
PY="${FUSED_MLP_VENV:-$ROOT/.venv}/bin/python"
"$PY" tools/build_variant.py
"$PY" tools/stage_cache.py --cache "$ROOT/.hub-cache"
exec "$PY" -m pytest -q tests "$@"

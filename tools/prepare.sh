#!/usr/bin/env bash
# Shared first half of tools/test.sh and tools/demo.sh: set up .venv, build the variant
# for the local torch, stage it into .hub-cache/ (a local Hub cache), then run
# `python ARGS...` with that cache (offline), so the run loads exactly this build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup.sh
PY="${FUSED_MLP_VENV:-$ROOT/.venv}/bin/python"
"$PY" tools/build_variant.py
"$PY" tools/stage_cache.py --cache "$ROOT/.hub-cache"
KERNELS_CACHE="$ROOT/.hub-cache" HF_HUB_OFFLINE=1 exec "$PY" "$@"

#!/usr/bin/env bash
# The main job: set up .venv, build the fused-mlp variant for the local torch, stage it
# into a local Hub cache (.hub-cache/), load it with kernels.get_kernel, check the
# kernels against the reference, kernelize a tiny model and print a report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup.sh
PY="${FUSED_MLP_VENV:-$ROOT/.venv}/bin/python"
"$PY" tools/build_variant.py
"$PY" tools/stage_cache.py --cache "$ROOT/.hub-cache"
KERNELS_CACHE="$ROOT/.hub-cache" HF_HUB_OFFLINE=1 exec "$PY" tools/demo.py "$@"

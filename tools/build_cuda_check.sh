#!/usr/bin/env bash
# Compile-only check of the CUDA sources on a machine without a GPU: a venv with the
# CUDA 13.0 build of torch 2.14.1 and the machine's nvcc 13.0 build the
# torch214-cxx11-cu130 variant for every architecture build.toml lists.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venvs/torch214-cu130"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch, kernels, kernel_abi_check" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q "torch==2.14.1" "kernels==0.17.2" kernel-abi-check
fi
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" "$VENV/bin/python" "$ROOT/tools/build_variant.py" --backend cuda "$@"

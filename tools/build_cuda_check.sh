#!/usr/bin/env bash
# Check of the CUDA sources on a machine without a GPU: a venv with the CUDA 13.0 build of
# torch 2.14.1 and the machine's nvcc 13.0 build the torch214-cxx11-cu130 variant for every
# architecture build.toml lists, and the test suite runs under that build (see the end).
# FUSED_MLP_CUDA_CHECK_TORCH=2.11.0 builds for that torch instead (the GPU machine's
# 2.11.0+cu130: the variant it makes there in ~190 s of device time can be made here and
# carried; gpu_session.sh's "stage" checks it against the sources). Arguments go to
# build_variant.py.
#
# That venv takes 5.5 GiB (3.2 GiB of it NVIDIA's libraries, which `import torch` needs).
# Where the disk has less room than the install needs, the check says so and is skipped
# (exit 0): a full disk is the machine's limit, not a fault of the sources. Set
# FUSED_MLP_REQUIRE_CUDA_CHECK=1 to make that case fail instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_PIN="${FUSED_MLP_CUDA_CHECK_TORCH:-2.14.1}"
VENV="$ROOT/.venvs/torch$(echo "$TORCH_PIN" | cut -d. -f1-2 | tr -d .)-cu130"
# 5.5 GiB measured for the venv (2026-12-03), plus the build and a margin; the variable is for
# tests/test_build_cuda_check.py, which takes the skip path with it.
NEED_MIB=${FUSED_MLP_CUDA_CHECK_NEED_MIB:-$(( 7 * 1024 ))}

if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import torch, kernels, kernel_abi_check" >/dev/null 2>&1; }; then
  mkdir -p "$ROOT/.venvs"
  free_mib=$(df -Pm "$ROOT/.venvs" | awk 'NR==2 {print $4}')
  if [ "$free_mib" -lt "$NEED_MIB" ]; then
    echo "[cuda-check] SKIPPED: installing torch ${TORCH_PIN}+cu130 needs about ${NEED_MIB} MiB free," \
         "$ROOT/.venvs has ${free_mib} MiB; the CUDA sources were not compiled"
    if [ "${FUSED_MLP_REQUIRE_CUDA_CHECK:-0}" = "1" ]; then exit 1; fi
    exit 0
  fi
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-cache-dir "torch==$TORCH_PIN" "$(grep -E '^kernels[=<>~! ]' "$ROOT/requirements.txt" | sed 's/[[:space:]]*#.*//')" kernel-abi-check
fi
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" "$VENV/bin/python" "$ROOT/tools/build_variant.py" --backend cuda "$@"

# Then, where no GPU is found, the suite under that build: a CUDA torch on a machine without a
# GPU loads the CUDA variant, whose CPU tensors take the Python fallbacks and whose GPU tests
# skip (session 63 found four tests there that assumed the CPU build). The venv gets the rest
# of requirements.txt from tools/setup.sh, as .venv does (its torch stays).
# FUSED_MLP_CUDA_CHECK_TESTS=0 leaves the suite out.
if [ "${FUSED_MLP_CUDA_CHECK_TESTS:-1}" != "0" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  FUSED_MLP_VENV="$VENV" bash "$ROOT/tools/setup.sh"
  variant="$(cd "$ROOT/tools" && "$VENV/bin/python" -c 'import build_variant; print(build_variant.variant_name("cuda"))')"
  cache="$(mktemp -d)"
  trap 'rm -rf "$cache"' EXIT
  "$VENV/bin/python" "$ROOT/tools/stage_cache.py" --cache "$cache" --variant "$variant"
  echo "[cuda-check] pytest tests under $variant, no GPU"
  (cd "$ROOT" && KERNELS_CACHE="$cache" HF_HUB_OFFLINE=1 "$VENV/bin/python" -m pytest tests -q -p no:cacheprovider)
fi

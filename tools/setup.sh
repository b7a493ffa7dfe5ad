#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment .venv and install what the
# build, the tests and the demo need. Idempotent: a second run installs nothing new.
#
# torch: an already importable torch is kept (the venv sees the system's packages,
# so a machine with its own CUDA torch keeps it); otherwise torch 2.13.0 is installed (its
# CPU build where no NVIDIA GPU is found).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FUSED_MLP_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
# pip's own "No space left on device" names no place or size; say both before giving up.
pip_install() {
  if ! "$VPY" -m pip install -q --no-cache-dir "$@"; then
    echo "[setup] ERROR: pip install $* failed; $(df -Pm "$VENV" | awk 'NR==2 {print $4}') MiB" \
         "are free on the disk of $VENV (a new .venv takes about 2 GiB)" >&2
    exit 1
  fi
}
if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  if nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] installing torch==2.13.0"
    pip_install "torch==2.13.0"
  else
    # No NVIDIA GPU: the CPU build. PyPI's Linux x86_64 torch is a CUDA build, whose variant
    # needs nvcc to compile and has no CPU kernels. Wheels on this machine's own indexes first,
    # then PyTorch's CPU index; where neither has a +cpu build (macOS, say), PyPI's torch.
    # pip's words go to a log: where both tries fail, its last error line is shown, so a network
    # failure does not read as a missing wheel.
    echo "[setup] installing torch==2.13.0+cpu (no NVIDIA GPU found)"
    cpu_log="$(mktemp)"
    cpu_ok=1
    "$VPY" -m pip install -q --no-cache-dir "torch==2.13.0+cpu" >"$cpu_log" 2>&1 \
      || "$VPY" -m pip install -q --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
           "torch==2.13.0+cpu" >>"$cpu_log" 2>&1 \
      || cpu_ok=0
    pip_err="$(grep -E '^ERROR' "$cpu_log" | tail -n 1 || true)"
    rm -f "$cpu_log"
    if [ "$cpu_ok" = 0 ]; then
      echo "[setup] no CPU build of torch 2.13.0 installed (pip: ${pip_err:-no ERROR line});" \
           "installing torch==2.13.0"
      pip_install "torch==2.13.0"
    fi
  fi
fi
# Wheels carried next to the checkout (the GPU machine has no network) are used first.
FIND_LINKS=()
[ -d "$ROOT/.wheels" ] && FIND_LINKS=(--find-links "$ROOT/.wheels")
# Install only where some line of requirements.txt is missing or out of its range.
if ! "$VPY" "$ROOT/tools/requirements_check.py" -r "$ROOT/requirements.txt" >/dev/null 2>&1; then
  echo "[setup] installing requirements.txt"
  pip_install "${FIND_LINKS[@]}" -r "$ROOT/requirements.txt"
fi
"$VPY" -c "import torch, kernels; print(f'[setup] torch {torch.__version__}, kernels {kernels.__version__}, python', __import__('sys').version.split()[0])"

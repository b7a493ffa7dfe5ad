#!/usr/bin/env bash
# One GPU session on the device machine (an H200 with torch preinstalled, no network):
# install the carried wheels, build the variant for the machine's torch, stage it,
# run the GPU tests and the benchmarks. The log goes to $OUT/session.log, results to $OUT/*.json.
#
#   bash tools/gpu_session.sh [steps...]
#   steps: build test test-gpu bench-act host-overhead bench-mlp bench-decode bench-train profile matrix demo
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
LOG="$OUT/session.log"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(build test bench-act bench-mlp bench-decode)
PY=python3
export KERNELS_CACHE="$ROOT/.hub-cache" HF_HUB_OFFLINE=1 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export TRITON_CACHE_DIR="$ROOT/.triton-cache" TORCHINDUCTOR_CACHE_DIR="$ROOT/.inductor-cache"

step() { echo "=== $1 ($(date +%T))" | tee -a "$LOG"; }
has() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

step "setup: ${STEPS[*]}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv 2>&1 | tee -a "$LOG"
if ! $PY -c "import kernels, liger_kernel" 2>/dev/null; then
  # kernels and liger-kernel are not in the image; their dependencies are.
  $PY -m pip install -q --no-deps --no-index .wheels/kernels-*.whl .wheels/liger_kernel-*.whl .wheels/tomlkit-*.whl 2>&1 | tail -2 | tee -a "$LOG"
fi
$PY -c "import torch, triton, kernels, transformers, huggingface_hub as h; print('torch', torch.__version__, 'triton', triton.__version__, 'kernels', kernels.__version__, 'transformers', transformers.__version__, 'hf_hub', h.__version__)" 2>&1 | tee -a "$LOG"

if has build; then
  step build
  $PY tools/build_variant.py --jobs 16 ${BUILD_ARGS:-} > "$OUT/build_full.txt" 2>&1
  grep "^\[build\]\|error" "$OUT/build_full.txt" | tail -20 | tee -a "$LOG"
  rm -f "$OUT/build_full.txt"
  $PY tools/stage_cache.py --cache "$KERNELS_CACHE" 2>&1 | tee -a "$LOG"
fi
if has test; then
  step "test ${PYTEST_ARGS:-}"
  timeout "${PYTEST_TIMEOUT:-480}" $PY -m pytest -q -p no:cacheprovider tests -rfs ${PYTEST_ARGS:-} > "$OUT/pytest.txt" 2>&1
  tail -60 "$OUT/pytest.txt" | tee -a "$LOG"
fi
if has test-gpu; then
  # One pytest process per file, so that a crash in one file does not hide the others.
  for f in ${TEST_FILES:-tests/test_*.py}; do
    step "test-gpu $f"
    timeout "${PYTEST_TIMEOUT:-300}" $PY -m pytest -v -p no:cacheprovider "$f" -m gpu -rf > "$OUT/pytest_$(basename "$f" .py).txt" 2>&1
    echo "exit $?" >> "$OUT/pytest_$(basename "$f" .py).txt"
    grep -E "^(FAILED|ERROR)|passed|failed|error|exit [0-9]" "$OUT/pytest_$(basename "$f" .py).txt" | tail -25 | tee -a "$LOG"
  done
fi
if has bench-act; then
  step bench-act
  $PY benchmarks/bench_act_and_mul.py --out "$OUT/act_and_mul_h200.json" 2>&1 | tail -25 | tee -a "$LOG"
fi
if has host-overhead; then
  step host-overhead
  $PY benchmarks/host_overhead.py --out "$OUT/host_overhead_h200.txt" 2>&1 | head -150 | tee -a "$LOG"
fi
if has bench-decode; then
  step bench-decode
  $PY benchmarks/bench_decode.py --out "$OUT/decode_h200.json" 2>&1 | tail -45 | tee -a "$LOG"
fi
if has bench-mlp; then
  step "bench-mlp ${BENCH_MLP_ARGS:-}"
  $PY benchmarks/bench_mlp.py --out "$OUT/mlp_forward_h200.json" ${BENCH_MLP_ARGS:-} 2>&1 | tail -45 | tee -a "$LOG"
fi
if has bench-train; then
  step bench-train
  $PY benchmarks/bench_train.py --out "$OUT/mlp_train_h200.json" ${BENCH_TRAIN_ARGS:-} 2>&1 | tail -30 | tee -a "$LOG"
fi
if has profile; then
  step profile
  $PY benchmarks/profile_post.py --out-dir "$OUT/traces" 2>&1 | tail -40 | tee -a "$LOG"
fi
if has matrix; then
  step matrix
  $PY tools/build_matrix.py --system ${MATRIX_ARGS:-} > "$OUT/matrix.txt" 2>&1
  echo "exit $?" >> "$OUT/matrix.txt"
  tail -30 "$OUT/matrix.txt" | tee -a "$LOG"
fi
if has demo; then
  step demo
  $PY tools/demo.py 2>&1 | tail -60 | tee -a "$LOG"
fi
step done

#!/usr/bin/env bash
# One GPU session on the device machine (an H200 or H100 with torch preinstalled, no network):
# install the carried wheels, build the variant for the machine's torch, stage it,
# run the GPU tests and the benchmarks. The log goes to $OUT/session.log, results to $OUT/*.json.
#
#   bash tools/gpu_session.sh [steps...]
#   steps: build stage test test-gpu bench-act micro-act micro-gemm micro-lt micro-sm90 micro-down micro-down-diag micro-small-m host-overhead bench-mlp bench-decode bench-train
#          mem-trace kernel-config profile matrix kernels-bench demo alloc-regime
#   environment: BUILD_ARGS (build_variant.py), TEST_FILES / PYTEST_K / PYTEST_TIMEOUT (test-gpu),
#   PYTEST_ARGS (test), MICRO_GEMM_ARGS, MICRO_SM90_ARGS, BENCH_MLP_ARGS, BENCH_TRAIN_ARGS, MEM_TRACE_ARGS, HOST_OVERHEAD_ARGS,
#   MATRIX_ARGS / MATRIX_TESTS, ALLOC_REGIME_LAYOUTS / ALLOC_REGIME_RUNS / ALLOC_REGIME_ARGS,
#   DOWN_CHECK_TIMEOUT (micro-down: seconds per form's check, default 90),
#   GPU_TAG (the result files' card name; default from nvidia-smi: h200, h100, ...),
#   REQUIRE_CARD (run nothing unless nvidia-smi's card name contains it, e.g. H200: the device
#   tool may lend another card than the one asked for, and a probe meant for one card then costs
#   only the machine's start), SMALL_M_GENERAL_MS / SMALL_M_DECODE_MS (micro-small-m's M lists)
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
# A card's name as the result files carry it (benchmarks/_common.gpu_tag, the scripts' own rule):
# "NVIDIA H100 80GB HBM3" -> h100, "NVIDIA H200" -> h200; "gpu" where no model number shows.
gpu_tag() { $PY -c 'import sys; sys.path.insert(0, "benchmarks"); from _common import gpu_tag; print(gpu_tag(sys.argv[1]))' "$1" 2>/dev/null || echo gpu; }
has() { local s; for s in "${STEPS[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

step "setup: ${STEPS[*]}"
card="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
if [ -n "${REQUIRE_CARD:-}" ] && [[ "$card" != *"$REQUIRE_CARD"* ]]; then
  echo "card: ${card:-none}; not an ${REQUIRE_CARD}: nothing run" | tee -a "$LOG"
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv 2>&1 | tee -a "$LOG"
# Result files are named after the card they were measured on (h200, h100, ...): the device
# tool may lend an H100 where an H200 was asked for, and a file must not say otherwise.
GPU_TAG="${GPU_TAG:-$(gpu_tag "$card")}"
echo "result files: *_${GPU_TAG}.*" | tee -a "$LOG"
# kernels and liger-kernel are not in the image (their dependencies are): each from .wheels/
# where it is not importable already (a caller may put other releases first on PYTHONPATH).
wheels=()
$PY -c "import kernels" 2>/dev/null || wheels+=(.wheels/kernels-*.whl .wheels/tomlkit-*.whl)
$PY -c "import liger_kernel" 2>/dev/null || { ls .wheels/liger_kernel-*.whl >/dev/null 2>&1 && wheels+=(.wheels/liger_kernel-*.whl); }
if [ ${#wheels[@]} -gt 0 ]; then
  $PY -m pip install -q --no-deps --no-index "${wheels[@]}" 2>&1 | tail -2 | tee -a "$LOG"
  if ! $PY -c "import kernels" 2>/dev/null; then
    # Without kernels the build stops at its metadata check and no test can load the package.
    echo "kernels is not importable: copy ../shared/wheels/*.whl and tomlkit's wheel into .wheels/ and carry .wheels" | tee -a "$LOG"
    exit 1
  fi
fi
$PY -c "import torch, triton, kernels, transformers, huggingface_hub as h; print('torch', torch.__version__, 'triton', triton.__version__, 'kernels', kernels.__version__, 'transformers', transformers.__version__, 'hf_hub', h.__version__)" 2>&1 | tee -a "$LOG"

if has matrix; then
  # The build matrix's entry for this interpreter (issue 7): every capability build.toml
  # lists, metadata, kernel-abi-check, get_kernel import, an op on the GPU. A later
  # "build" step then only stages this build (the tests run on it).
  step "matrix ${MATRIX_ARGS:-}"
  # --tests never by default: the whole suite does not fit one device call (test-gpu runs it per file).
  $PY tools/build_matrix.py --system --jobs 16 --tests "${MATRIX_TESTS:-never}" ${MATRIX_ARGS:-} > "$OUT/matrix.txt" 2>&1
  echo "exit $?" >> "$OUT/matrix.txt"
  tail -30 "$OUT/matrix.txt" | tee -a "$LOG"
  cp build/matrix-report.json "$OUT/matrix-report.json" 2>/dev/null
fi
if has build || has stage; then
  # "stage" alone stages a build/ carried from an earlier call or made elsewhere for this
  # torch (no compile), once build_variant.py --python-only has checked it against the sources.
  step "$(has build && echo build || echo stage)"
  if has build && ! has matrix; then
    if ! $PY tools/build_variant.py --jobs 16 ${BUILD_ARGS:-} > "$OUT/build_full.txt" 2>&1; then
      # A failed build must not go on to stage (and test) whatever build/ held before.
      echo "build failed:" | tee -a "$LOG"
      tail -30 "$OUT/build_full.txt" | tee -a "$LOG"
      exit 1
    fi
    grep "^\[build\]\|error" "$OUT/build_full.txt" | tail -20 | tee -a "$LOG"
    rm -f "$OUT/build_full.txt"
  elif ! has build && ! has matrix; then
    # A carried build/: refuse it where these sources, this torch and BUILD_ARGS' capabilities
    # would compile another extension, else bring its Python files up to this tree's.
    $PY tools/build_variant.py --python-only ${BUILD_ARGS:-} 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
  fi
  # Nothing staged (no build/, e.g. a "stage" call that did not carry one): no test can load the package.
  $PY tools/stage_cache.py --cache "$KERNELS_CACHE" 2>&1 | tee -a "$LOG" || exit 1
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
    timeout "${PYTEST_TIMEOUT:-300}" $PY -m pytest -v -p no:cacheprovider "$f" -m gpu -rfs --durations=15 ${PYTEST_K:+-k "$PYTEST_K"} > "$OUT/pytest_$(basename "$f" .py).txt" 2>&1
    echo "exit $?" >> "$OUT/pytest_$(basename "$f" .py).txt"
    grep -E "^(FAILED|ERROR)|passed|failed|error|exit [0-9]" "$OUT/pytest_$(basename "$f" .py).txt" | tail -25 | tee -a "$LOG"
  done
fi
if has bench-act; then
  step bench-act
  $PY benchmarks/bench_act_and_mul.py --out "$OUT/act_and_mul_${GPU_TAG}.json" 2>&1 | tail -25 | tee -a "$LOG"
fi
if has micro-act; then
  # Layout variants of silu_and_mul as a standalone CUDA program (benchmarks/micro/).
  step micro-act
  nvcc -O3 -std=c++17 -arch=sm_90 -o "$ROOT/.amv" benchmarks/micro/act_and_mul_variants.cu 2>&1 | tail -5 | tee -a "$LOG"
  "$ROOT/.amv" > "$OUT/act_and_mul_variants_${GPU_TAG}.txt" 2>&1
  cat "$OUT/act_and_mul_variants_${GPU_TAG}.txt" | tee -a "$LOG"
fi
if has micro-gemm; then
  # Our Triton GEMM kernels in every config and epilogue variant against cuBLAS.
  step "micro-gemm ${MICRO_GEMM_ARGS:-}"
  $PY benchmarks/micro/gemm_variants.py --out "$OUT/gemm_variants_${GPU_TAG}.json" ${MICRO_GEMM_ARGS:-} > "$OUT/gemm_variants_${GPU_TAG}.txt" 2>&1
  grep -E "best|Traceback|Error" "$OUT/gemm_variants_${GPU_TAG}.txt" | tail -20 | tee -a "$LOG"
fi
if has micro-lt; then
  # The plain MLP's first GEMM with cuBLASLt's bias + activation epilogue against ours.
  step micro-lt
  $PY benchmarks/micro/lt_epilogue.py --out "$OUT/lt_epilogue_${GPU_TAG}.json" 2>&1 | tail -30 | tee -a "$LOG"
fi
if has micro-sm90; then
  # The sm_90a kernels against Triton and cuBLAS: checks against float64, then timings.
  step "micro-sm90 ${MICRO_SM90_ARGS:-}"
  $PY benchmarks/micro/sm90_gate_up.py --out "$OUT/sm90_gate_up_${GPU_TAG}.json" ${MICRO_SM90_ARGS:-} > "$OUT/sm90_gate_up_${GPU_TAG}.txt" 2>&1
  grep -E "^\[sm90\] (checks|[a-z_0-9]+: )|FAIL|Traceback|Error" "$OUT/sm90_gate_up_${GPU_TAG}.txt" | tail -20 | tee -a "$LOG"
fi
build_down_probe() {  # once a call, for micro-down-diag and micro-down alike
  [ -n "${DOWN_PROBE_BUILT:-}" ] && return 0
  DOWN_PROBE_BUILT=1
  mkdir -p "$ROOT/.probe"
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFUSED_MLP_NO_TORCH \
    -Ikernel_src/common -Ikernel_src/cuda -Ibenchmarks/micro -Xcompiler -fPIC -shared \
    -o "$ROOT/.probe/libdown_stream.so" benchmarks/micro/down_stream.cu 2>&1 | grep -E "error" | tee -a "$LOG"
}
if has micro-down-diag; then
  # Session 51: the pair form's diagnostic variants (down_stream.py --diag), alone; needs a staged build.
  step micro-down-diag
  build_down_probe
  timeout 240 $PY benchmarks/micro/down_stream.py --diag --out "$OUT/down_diag_${GPU_TAG}.json" > "$OUT/down_diag_${GPU_TAG}.txt" 2>&1
  echo "down_stream.py --diag exit $?" | tee -a "$LOG"
  grep -E "^\[(gemm check|check|stream)\]|Traceback|Error" "$OUT/down_diag_${GPU_TAG}.txt" | tail -40 | tee -a "$LOG"
fi
if has micro-down; then
  # Session 48's probe: a one-kernel down GEMM's memory side and the GEMM itself at M 128
  # (benchmarks/micro/down_stream.cu) beside cuBLAS; needs a staged build (stage or build).
  step micro-down
  build_down_probe
  # Each GEMM form is checked first in a process of its own with a short timeout (none has run
  # on a GPU before session 49's call: a cluster kernel that deadlocks must not cost the others'
  # timings); the timed run takes the forms that passed, and is bounded too.
  # (one file for all the checks: the device tool brings back at most 8 files a call)
  modes=""
  : > "$OUT/down_stream_checks.txt"
  for md in $($PY benchmarks/micro/down_stream.py --list-modes); do
    timeout ${DOWN_CHECK_TIMEOUT:-90} $PY benchmarks/micro/down_stream.py --check-only --modes "$md" > "$ROOT/.probe/check.txt" 2>&1
    rc=$?
    { cat "$ROOT/.probe/check.txt"; echo "down_stream.py --check-only --modes $md: exit $rc"; } >> "$OUT/down_stream_checks.txt"
    echo "down_stream.py --check-only --modes $md: exit $rc" | tee -a "$LOG"
    grep -E "^\[gemm check\]|Error|WRONG" "$ROOT/.probe/check.txt" | tail -8 | tee -a "$LOG"
    [ $rc -eq 0 ] && modes="$modes${modes:+,}$md"
  done
  timeout 300 $PY benchmarks/micro/down_stream.py --modes "$modes" --out "$OUT/down_stream_${GPU_TAG}.json" > "$OUT/down_stream_${GPU_TAG}.txt" 2>&1
  echo "down_stream.py exit $?" | tee -a "$LOG"
  grep -E "^\[(check|gemm check|occupancy|stream|verdict|choice)\]|Traceback|Error" "$OUT/down_stream_${GPU_TAG}.txt" | tail -70 | tee -a "$LOG"
fi
if has micro-small-m; then
  # Sessions 77-80: the general path at few tokens stage by stage (general_small_m.py) and the
  # decode kernels against it in a graphed loop of layers (decode_loop_ab.py), where
  # dispatch.DECODE_MAX_M_BY_CARD's entry for this card comes from; needs a staged build.
  step micro-small-m
  : > "$OUT/small_m_${GPU_TAG}.txt"
  timeout 150 $PY benchmarks/micro/general_small_m.py --ms "${SMALL_M_GENERAL_MS:-1,8,16,24,32,48,64,128}" \
    --out "$OUT/general_small_m_${GPU_TAG}.json" >> "$OUT/small_m_${GPU_TAG}.txt" 2>&1
  echo "general_small_m.py exit $?" | tee -a "$OUT/small_m_${GPU_TAG}.txt" "$LOG"
  timeout 120 $PY benchmarks/micro/decode_loop_ab.py --ms "${SMALL_M_DECODE_MS:-8,9,10,12,14,16,20,24}" \
    --out "$OUT/decode_loop_ab_${GPU_TAG}.json" >> "$OUT/small_m_${GPU_TAG}.txt" 2>&1
  echo "decode_loop_ab.py exit $?" | tee -a "$OUT/small_m_${GPU_TAG}.txt" "$LOG"
  grep -vE "^(Skipping|Kernel 'fused-mlp')" "$OUT/small_m_${GPU_TAG}.txt" | tail -40 | tee -a "$LOG"
fi
if has host-overhead; then
  step host-overhead
  $PY benchmarks/host_overhead.py --out "$OUT/host_overhead_${GPU_TAG}.txt" ${HOST_OVERHEAD_ARGS:-} 2>&1 | head -150 | tee -a "$LOG"
fi
if has bench-decode; then
  step bench-decode
  $PY benchmarks/bench_decode.py --out "$OUT/decode_${GPU_TAG}.json" 2>&1 | tail -45 | tee -a "$LOG"
fi
if has bench-mlp; then
  # the record's form (README): 4 placements of each case's inputs, 3 interleaved rounds each
  BENCH_MLP_ARGS="${BENCH_MLP_ARGS:---placements 4 --repeats 3 --alternate-ms 1000}"
  step "bench-mlp $BENCH_MLP_ARGS"
  $PY benchmarks/bench_mlp.py --out "$OUT/mlp_forward_${GPU_TAG}.json" $BENCH_MLP_ARGS 2>&1 | tail -45 | tee -a "$LOG"
fi
if has bench-train; then
  step bench-train
  $PY benchmarks/bench_train.py --out "$OUT/mlp_train_${GPU_TAG}.json" ${BENCH_TRAIN_ARGS:-} > "$OUT/bench_train.txt" 2>&1
  grep -v "^\[profile\]" "$OUT/bench_train.txt" | tail -30 | tee -a "$LOG"
fi
if has mem-trace; then
  step "mem-trace ${MEM_TRACE_ARGS:-}"
  $PY benchmarks/memory_trace.py --out "$OUT/memory_trace_${GPU_TAG}.txt" ${MEM_TRACE_ARGS:-} 2>&1 | tail -60 | tee -a "$LOG"
fi
if has kernel-config; then
  # transformers' KernelConfig route needs a transformers that accepts the installed kernels
  # (5.20-5.22 take kernels 0.17.2): a carried wheel, installed into its own directory.
  step kernel-config
  TF_DIR="$ROOT/.tf-route"
  $PY -m pip install -q --no-deps --no-index --target "$TF_DIR" .wheels/transformers-5.22*.whl .wheels/tokenizers-*.whl 2>&1 | tail -2 | tee -a "$LOG"
  if ! PYTHONPATH="$TF_DIR" $PY -c "import transformers" 2>/dev/null; then
    $PY -m pip install -q --no-deps --no-index --target "$TF_DIR" .wheels/huggingface_hub-*.whl 2>&1 | tail -2 | tee -a "$LOG"
  fi
  PYTHONPATH="$TF_DIR" $PY -c "import transformers, tokenizers, huggingface_hub as h; print('route with transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'hf_hub', h.__version__)" 2>&1 | tail -3 | tee -a "$LOG"
  PYTHONPATH="$TF_DIR" timeout 300 $PY -m pytest -v -p no:cacheprovider tests/test_mapping.py -m gpu -rs > "$OUT/pytest_kernel_config.txt" 2>&1
  echo "exit $?" >> "$OUT/pytest_kernel_config.txt"
  grep -E "PASS|FAIL|SKIP|ERROR|passed|failed|exit [0-9]" "$OUT/pytest_kernel_config.txt" | tail -15 | tee -a "$LOG"
fi
if has profile; then
  step profile
  $PY benchmarks/profile_post.py --out-dir "$OUT/traces" > "$OUT/profile_post_${GPU_TAG}.txt" 2>&1
  tail -40 "$OUT/profile_post_${GPU_TAG}.txt" | tee -a "$LOG"
  # one archive: the device tool brings back only a few files per call
  tar czf "$OUT/profile_post_traces.tar.gz" -C "$OUT" traces && rm -rf "$OUT/traces"
fi
if has alloc-regime; then
  # NOTES, plan written at the end of session 38, item 1: one process per layout and run (the
  # effect is about a process's allocation history); the JSON files go back as one archive.
  step "alloc-regime ${ALLOC_REGIME_LAYOUTS:-first after:2 reserve:12 model} x ${ALLOC_REGIME_RUNS:-3}"
  mkdir -p "$OUT/alloc_regime"
  for run in $(seq 1 "${ALLOC_REGIME_RUNS:-3}"); do
    for layout in ${ALLOC_REGIME_LAYOUTS:-first after:2 reserve:12 model}; do
      extra=""; [ "$layout" = model ] && extra="--layers 8 --time-layers 0,7"
      timeout 240 $PY benchmarks/micro/alloc_regime.py --layout "$layout" $extra ${ALLOC_REGIME_ARGS:-} \
        --out "$OUT/alloc_regime/${layout/:/_}_run${run}.json" 2>&1 | grep -E "alloc-regime|Error|Traceback" | tee -a "$LOG"
    done
  done
  tar czf "$OUT/alloc_regime.tar.gz" -C "$OUT" alloc_regime && rm -rf "$OUT/alloc_regime"
fi
if has kernels-bench; then
  # The Hub's runner over benchmarks/benchmark*.py, on this checkout as a local kernel repository
  # (build/<variant> for this torch), as `kernels benchmark <path>` runs it; through
  # tools/kernels_benchmark.py, because the `kernels` command needs sigstore, which the image
  # lacks. The runner's table needs tabulate (kernels' "benchmark" extra): carry its wheel.
  step kernels-bench
  $PY -c "import tabulate" 2>/dev/null || $PY -m pip install -q --no-deps --no-index .wheels/tabulate-*.whl 2>&1 | tail -2 | tee -a "$LOG"
  $PY tools/kernels_benchmark.py "$ROOT" --output "$OUT/kernels_benchmark_${GPU_TAG}.json" > "$OUT/kernels_benchmark_${GPU_TAG}.txt" 2>&1
  echo "exit $?" >> "$OUT/kernels_benchmark_${GPU_TAG}.txt"
  tail -40 "$OUT/kernels_benchmark_${GPU_TAG}.txt" | tee -a "$LOG"
fi
if has demo; then
  step demo
  $PY tools/demo.py 2>&1 | tail -60 | tee -a "$LOG"
fi
step done

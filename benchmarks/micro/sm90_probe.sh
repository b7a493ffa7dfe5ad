#!/bin/bash
# Builds and runs the dh epilogue variants of benchmarks/micro/sm90_probe.cu (and
# benchmarks/micro/stream_pattern.cu, the same bytes streamed without a GEMM).
#   bash benchmarks/micro/sm90_probe.sh build   # needs only nvcc (no GPU): binaries in .probe/
#   bash benchmarks/micro/sm90_probe.sh run     # on the H200: one line per variant and shape
# Each variant is the set of FUSED_MLP_SM90_* switches after its name (see the kernel header).
# PROBE_VARIANTS="name -Dflag ...;name2 ..." replaces the list below (same value for build and run).
# Variants whose name starts with "fwd" time the gated forward kind (sm90_probe.cu's "fwd" mode),
# "tall" the 192-row experiment against it (gated_fwd_tall_kernel.cuh; "tall" mode), "coop" the
# 256-row cooperative form (gated_fwd_coop_kernel.cuh; "coop" mode; PROBE_COOP_BN=64 / 80 / 96 at run time).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
VARIANTS=(
  "shipped"   # the wide dh kind (128 x 256 tiles): what the op runs for K > 768
  "narrow   -DPROBE_DH_BN=64"   # the narrow one (128 x 128, g | u by TMA): K <= 768
  "nohelp   -DFUSED_MLP_SM90_DH_HELPERS=0"
  "depth3   -DFUSED_MLP_SM90_DH_DEPTH=3"
  "epionly  -DFUSED_MLP_SM90_PROBE_NOMAIN=1"
  "epionly_noalu -DFUSED_MLP_SM90_PROBE_NOMAIN=1 -DFUSED_MLP_SM90_PROBE=5"
  "empty    -DFUSED_MLP_SM90_PROBE=3"
  "empty_2stages -DFUSED_MLP_SM90_PROBE=3 -DFUSED_MLP_SM90_STAGES=2"
  "shipped_2stages -DFUSED_MLP_SM90_STAGES=2"
  "fwd_shipped"
  "fwd_empty -DFUSED_MLP_SM90_PROBE=3"
  "fwd_helpers -DFUSED_MLP_SM90_FWD_HELPERS=1"
)
# PROBE_HINTS (environment, at run time) sets the kernels' cache-hint flags (sm90_probe.cu).
[ -n "${PROBE_VARIANTS:-}" ] && mapfile -t VARIANTS < <(printf '%s\n' "${PROBE_VARIANTS}" | tr ';' '\n')
NVCC="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
case "${1:-}" in
  build)
    mkdir -p .probe
    for v in "${VARIANTS[@]}"; do
      read -r name flags <<<"$v"
      # shellcheck disable=SC2086
      "$NVCC" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DFUSED_MLP_NO_TORCH -Ikernel_src/common \
        -Ikernel_src/cuda -Xptxas -v $flags -o ".probe/$name" benchmarks/micro/sm90_probe.cu 2>&1 |
        grep -E "error|spill stores|C75[0-9][0-9]" | sort -u | sed "s/^/[$name] /"
    done
    "$NVCC" -std=c++17 -O3 -arch=sm_90 -o .probe/stream_pattern benchmarks/micro/stream_pattern.cu
    ;;
  run)
    nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
    for v in "${VARIANTS[@]}"; do
      read -r name flags <<<"$v"
      echo "[variant] $name: ${flags:-defaults}"
      mode=""
      [[ "$name" == fwd* ]] && mode=fwd
      [[ "$name" == tall* ]] && mode=tall
      [[ "$name" == coop* ]] && mode=coop
      timeout 60 ".probe/$name" "$name" $mode || echo "[probe] $name: exit $? (60 s limit: a hang?)"
    done
    [ -x .probe/stream_pattern ] && timeout 60 .probe/stream_pattern
    # cuBLAS on the same products (the GEMM alone, no epilogue), timed the same way: the dh
    # kind's dy W (W [K, N]) and the gated forward's x [Wg; Wu]^T (the weights [2 N, K] as
    # nn.Linear holds them). PROBE_SUSTAIN_MS=n: as the probe binaries, first n ms of launches
    # back to back, the second half of them timed (time per launch; NOTES, session 29).
    python3 - <<'PY' || true
import os
import torch
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
sustain_ms = float(os.environ.get("PROBE_SUSTAIN_MS", "0"))
try:  # energy and SM clock as the probe binaries report them (NVML; nvidia-ml-py)
    import pynvml
    pynvml.nvmlInit()
    nvml = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
except Exception:  # noqa: BLE001  (no NVML: times only)
    nvml = None
for shape, (m, k, n) in {"geglu_d768": (8192, 768, 3072), "swiglu_m4096": (4096, 4096, 14336),
                         "swiglu_m512": (512, 4096, 14336), "fwd_swiglu_m4096": (4096, 4096, 2 * 14336),
                         "fwd_swiglu_m16384": (16384, 4096, 2 * 14336)}.items():
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    if shape.startswith("fwd"):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k ** -0.5
        gemm = lambda: torch.mm(a, w.t(), out=out)  # noqa: E731
    else:
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        gemm = lambda: torch.mm(a, w, out=out)  # noqa: E731
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    sustained = ""
    if sustain_ms > 0:
        gemm()  # cuBLAS's start-up, outside the launch that sizes the loop
        ev[0].record(); gemm(); ev[1].record(); ev[1].synchronize()
        n_iter = max(2, int(sustain_ms / ev[0].elapsed_time(ev[1])))
        for _ in range(n_iter // 2):
            gemm()
        torch.cuda.synchronize()
        mj0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml) if nvml else None
        ev[0].record()
        for _ in range(n_iter - n_iter // 2):
            gemm()
        ev[1].record(); ev[1].synchronize()
        ms_total, timed = ev[0].elapsed_time(ev[1]), n_iter - n_iter // 2
        sustained = f" | sustained {timed}: {ms_total * 1e3 / timed:.1f} us"
        if nvml:
            mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(nvml) - mj0
            mhz = pynvml.nvmlDeviceGetClockInfo(nvml, pynvml.NVML_CLOCK_SM)
            sustained += f", {mj / timed:.2f} mJ, {mj / ms_total:.0f} W, SM {mhz} MHz"
    times = []
    for r in range(43):
        flush.fill_(r)
        ev[0].record(); gemm(); ev[1].record(); ev[1].synchronize()
        if r >= 3: times.append(ev[0].elapsed_time(ev[1]) * 1e3)
    times.sort()
    print(f"[probe] {'cublas_gemm':<22} {shape:<17} median {times[len(times)//2]:7.1f} us  min {times[0]:7.1f}"
          f"{sustained}  (torch {torch.__version__})")
PY
    ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac

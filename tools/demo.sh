#!/usr/bin/env bash
# The main job: set up .venv, build the fused-mlp variant for the local torch, stage it
# into a local Hub cache (.hub-cache/), load it with kernels.get_kernel, check the
# kernels against the reference, kernelize a tiny model and print a report.
# (FUSED_MLP_DEMO_NO_TIMING=1 skips the GPU timings.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec bash tools/prepare.sh tools/demo.py

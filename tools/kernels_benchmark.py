#!/usr/bin/env python3
"""Run the Hub's benchmark runner (`kernels benchmark`) where the `kernels` command cannot start.

`kernels benchmark REPO` runs a kernel repository's benchmarks/benchmark*.py (the
kernels.benchmark.Benchmark classes) and prints a table; `--output` writes the JSON that
tools/publish.py turns into the kernel card's table. The `kernels` command imports its
signature checks first (sigstore, cryptography), which an install with `--no-deps` lacks (the
GPU machine's: those packages are not in its image), although the runner needs neither. This
loads the runner's module (kernels/cli/benchmark.py; kernels/_internals/cli/benchmark.py
from kernels 0.19) on its own and calls it with the same
arguments. Where the `kernels` command works, it and this do the same thing.

    python tools/kernels_benchmark.py PATH_OR_REPO [--version N | --branch B] [--output F] [...]

A path (this checkout, say) runs its benchmarks against its build/<variant> for this torch
(kernels.get_local_kernel), as `kernels benchmark ./` does. The runner's table needs tabulate
(kernels' "benchmark" extra).

Two corrections to the runner of kernels 0.17.2 (the first is fixed in 0.19, the second is not):
- its `collect_machine_info` compares `_backend()` (a Backend object) with backend names, so on a
  CUDA machine it records gpu "N/A" and backend "CPU" in the results file (and tools/publish.py's
  card would show that). Where it does, the GPU's name and the CUDA version are filled in from
  torch, as that function means to.
- it downloads a Hub repository with `snapshot_download(repo_id=..., revision=...)`, which looks
  for a model repository of that name, while every other part of kernels (get_kernel, install,
  locks) reads the Hub's kernel repositories (`repo_type="kernel"`), where tools/publish.py puts
  this package. Here the runner's download asks for the kernel repository unless told otherwise.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path


def runner_module():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import kernels_compat

    path = kernels_compat.benchmark_runner_path()
    spec = importlib.util.spec_from_file_location("kernels_benchmark_runner", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.collect_machine_info = _corrected(mod.collect_machine_info, mod)
    if hasattr(mod, "_get_hf_api"):  # kernels 0.17.2's runner downloads through it
        mod._get_hf_api = _kernel_repo_api(mod._get_hf_api)
    return mod


def _kernel_repo_api(get_api):
    """The runner's HfApi factory, its snapshot_download defaulting to repo_type="kernel"."""

    def api(*args, **kwargs):
        hf_api = get_api(*args, **kwargs)
        # a repo_type the caller passes still wins over the partial's
        hf_api.snapshot_download = functools.partial(hf_api.snapshot_download, repo_type="kernel")
        return hf_api

    return api


def _corrected(collect, mod):
    """collect_machine_info with the GPU's name and backend where the runner missed them."""
    import dataclasses

    import torch

    def machine_info():
        info = collect()
        name = getattr(mod._backend(), "name", None)
        if info.gpu == "N/A" and name in ("cuda", "rocm") and torch.cuda.is_available():
            hip = getattr(torch.version, "hip", None)
            backend = f"ROCm {hip}" if hip else f"CUDA {torch.version.cuda}"
            info = dataclasses.replace(info, gpu=torch.cuda.get_device_name(0), backend=backend)
        return info

    return machine_info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("repo_id", help="a kernel repository on the Hub, or a local path")
    p.add_argument("--branch")
    p.add_argument("--version", type=int)
    p.add_argument("--output")
    p.add_argument("--json", action="store_true")
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args()
    runner_module().run_benchmark(repo_id=a.repo_id, branch=a.branch, version=a.version, iterations=a.iterations,
                                  warmup=a.warmup, output=a.output, print_json=a.json)


if __name__ == "__main__":
    main()
